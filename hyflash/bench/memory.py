"""Draft-side memory against context length, measured by running each drafter's inference state.

A drafter ingests verified tokens and target features exactly as in decoding (chunk by chunk, as the loop
feeds it) and we read `memory_bytes()` at each context length. Bytes held do not depend on the values, so
random tokens and zero features of the right shape stand in for a real prefill: an 8k-token sweep costs
the drafter's own ingest, not an 8k-token target pass. Nothing here is a formula.
"""

from __future__ import annotations

import torch

from hyflash.drafters.config import DrafterConfig
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState


def draft_memory_sweep(
    drafters: dict[str, object], target, contexts: list[int], chunk: int = 256, seed: int = 0
) -> dict[str, dict[int, int]]:
    """{drafter name: {context length: bytes held after ingesting that many tokens}}.

    chunk: tokens per ingest call. The loop hands over 1..block_size tokens at a time, but the bytes held
    afterwards do not depend on how the context arrived (window buffers are allocated up front, whole
    eviction chunks fold into fixed-size states), while a `full` cache grown 16 tokens at a time costs
    quadratic copying: an 8k sweep would take minutes on a busy CPU for the same numbers.
    """
    contexts = sorted(set(int(c) for c in contexts if c > 0))
    generator = torch.Generator().manual_seed(seed)
    n_features = len(target.feature_layers)
    out: dict[str, dict[int, int]] = {}
    for name, drafter in drafters.items():
        if drafter is None:
            continue
        drafter.reset()
        done, measured = 0, {}
        with torch.inference_mode():
            for length in contexts:
                while done < length:
                    step = min(chunk, length - done)
                    tokens = torch.randint(0, target.vocab_size, (step,), generator=generator)
                    features = None
                    if getattr(drafter, "needs_features", True):
                        features = torch.zeros(step, n_features, target.hidden_size, dtype=target.dtype)
                    drafter.ingest(tokens, features)
                    done += step
                measured[length] = int(drafter.memory_bytes())
        out[name] = measured
        drafter.reset()  # give the memory back before the next drafter
    return out



def untrained_kinds(target, kinds, depths, dtype: torch.dtype | None = None) -> dict[str, object]:
    """Untrained drafters of every kind and depth (default config otherwise), named KIND-dDEPTH.

    Bytes held depend on the configuration, not on the weights, so the memory claim (bounded, >= 10x less
    than `full` at 8k) can be measured for every kind before any of them is trained.
    """
    out = {}
    for depth in depths:
        for kind in kinds:
            model = DrafterModel(DrafterConfig.for_target(target, kind=kind, num_layers=depth), target)
            out[f"{kind}-d{depth}"] = DrafterState(model.to(dtype or target.dtype))
    return out


def param_count(drafter) -> int | None:
    """Trainable parameters of a HyFlash-family drafter (None for drafters without a model, e.g. n-gram)."""
    model = getattr(drafter, "model", None)
    return int(model.param_count()) if model is not None and hasattr(model, "param_count") else None
