"""An optimizer's state without pickle: its tensors for a safetensors file, the rest as JSON-able data.

Drafter training checkpoints (training/checkpoint.py) and distillation checkpoints (distill/trainer.py) both
store optimizer state this way.
"""

from __future__ import annotations

import torch


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split the optimiser state into tensors (safetensors) and JSON-able scalars."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], info: dict) -> None:
    """Put back into `optimizer` what optimizer_tensors split out."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for key, value in info["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": info["param_groups"]})
