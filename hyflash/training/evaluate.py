"""Measuring a drafter by real speculative decoding during training: held-out tau at each evaluation step.

(The HumanEval benchmark of a finished drafter, `hyflash train-eval`, is bench/humaneval.py.)
"""

from __future__ import annotations

from hyflash.decoding import generate, summarize
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState


def inference_drafter(model, target):
    """A decoding-time drafter from a training model: a copy in the target's dtype (training keeps fp32)."""
    copy = DrafterModel(model.config, target)
    copy.load_state_dict(model.state_dict())
    return DrafterState(copy.to(device=target.device, dtype=target.dtype).eval())


def heldout_tau(model, target, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Greedy speculative decoding of held-out prompts with the current weights."""
    drafter = inference_drafter(model, target)
    results = [generate(target, ids, drafter, max_new_tokens=max_new_tokens) for ids in prompts]
    out = summarize(results)
    return {k: out[k] for k in ("tau", "acceptance_by_position", "tokens_per_second")}
