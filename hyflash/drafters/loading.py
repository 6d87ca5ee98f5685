"""Drafter checkpoints on disk: a folder with config.json and model.safetensors (weights only, never pickle).

Every failure a user can meet is a one-line HyflashError naming the problem and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from hyflash.drafters.config import DrafterConfig
from hyflash.errors import HyflashError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "hyflash-drafter"  # marks config.json as ours
NEW_HINT = "create one with `hyflash drafter new --kind hyflash --out DIR` (or train one)"


def write_checkpoint(path, config: DrafterConfig, tensors: dict[str, torch.Tensor]) -> Path:
    """Write atomically: into a temporary sibling folder, then rename over `path`."""
    from safetensors.torch import save_file

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    old = None
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, **config.to_dict()}, indent=2) + "\n")
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-old-"))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def read_config(path) -> DrafterConfig:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise HyflashError(f"no drafter folder at {path}: check the path, or {NEW_HINT}")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise HyflashError(f"{path} has no {CONFIG_FILE}, so it is not a drafter folder: {NEW_HINT}")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HyflashError(f"{file} is unreadable or corrupt ({exc}): re-save or recreate the drafter") from exc
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        raise HyflashError(f"{file} is not a hyflash drafter config: point --drafter at a drafter folder")
    try:
        return DrafterConfig.from_dict(data).resolved()
    except HyflashError as exc:
        raise HyflashError(f"{file}: {exc}; re-save or recreate the drafter") from exc


def read_weights(path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = Path(path).expanduser() / WEIGHTS_FILE
    if not file.is_file():
        raise HyflashError(f"{Path(path)} has no {WEIGHTS_FILE}: the save was incomplete; re-save or recreate it")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise HyflashError(f"{file} is corrupt or unreadable ({exc}): re-save or recreate the drafter") from exc


def check_target(config: DrafterConfig, target, where="the drafter") -> None:
    """Raise if the drafter was built for another target: hidden size, vocabulary, depth, feature layers."""
    have, want = target.signature(), config.signature()
    have["feature_layers"] = list(have["feature_layers"])
    name = getattr(target, "name", "") or "the target"
    labels = {"hidden_size": "hidden size", "vocab_size": "vocabulary size", "num_layers": "layer count",
              "feature_layers": "feature layers"}
    for key, label in labels.items():
        if have[key] != want[key]:
            raise target_mismatch(config, label, want[key], have[key], name, where)


def target_mismatch(config: DrafterConfig, label: str, want, have, name: str, where="the drafter") -> HyflashError:
    """The one-line error for a drafter built for a target that differs in `label`."""
    return HyflashError(
        f"{where} was built for {config.target_name or 'another target'} with {label} {want}, "
        f"but {name} has {have}: use it with the target it was built for, or create one for "
        f"this target with `hyflash drafter new --model MODEL --out DIR` (or train one)"
    )


def inference_dtype(target) -> torch.dtype:
    """The drafter runs in float32 on CPUs: it is small, and bf16 matmuls of several rows are 3-5x slower
    than fp32 on CPUs without native bf16 (AVX2). On accelerators it follows the target."""
    return torch.float32 if target.device.type == "cpu" else target.dtype


def load_drafter_for_target(path, target, int8: bool | None = None):
    """The inference-time drafter stored at `path`, checked against `target` (used by `generate --drafter`).

    int8 (default: on CPUs) quantises the drafter's weights, never the target's: drafts get cheaper, the
    output stays exactly the target's."""
    from hyflash.drafters.model import DrafterModel
    from hyflash.drafters.state import DrafterState

    state = DrafterState(DrafterModel.from_pretrained(path, target, dtype=inference_dtype(target)))
    if int8 if int8 is not None else target.device.type == "cpu":
        state.quantize_int8()
    return state
