"""What `generate`, `demo` and `bench` share: choose the dtype, load target and drafter, build the policy.

`--dtype auto` (the default) reads this machine's calibration (measured once, then cached; see
calibration.py) and picks the dtype with the best expected throughput for what will run: plain decoding, or
speculative decoding with a drafter. An explicit dtype always wins. The target is never quantised behind the
user's back: dtypes only, the same weights.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from hyflash.calibration import CostCurve, calibrate
from hyflash.policy import PolicyConfig, SpeculationPolicy, choose_dtype

AUTO_CANDIDATES = ("float32", "bfloat16")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class DtypeChoice:
    dtype: str
    reason: str
    curve: CostCurve | None  # the chosen dtype's cost curve (None when not calibrated)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "dtype_reason": self.reason}


def cost_curves(model: str, dtypes, log: Callable[[str], None] = _stderr) -> dict[str, CostCurve]:
    """Cached curves, measuring (and saying so) the ones this machine has not measured yet."""
    curves = {}
    for dtype in dtypes:
        curve, measured = calibrate(model, dtype, use_cache=True, announce=log)
        curves[dtype] = curve
        if measured:
            log(f"hyflash: calibrated {model} in {dtype} on this machine (once; cached, see `hyflash calibrate`)")
    return curves


def choose(model: str, dtype: str, with_drafter: bool, block: int = 8, calibrated: bool = True,
           log: Callable[[str], None] = _stderr) -> DtypeChoice:
    """Resolve --dtype: 'auto' from the calibration, else as given (with its curve, for adaptive drafting)."""
    from hyflash.targets import resolve_model_path

    resolve_model_path(model)  # a bad model name fails here, before anything is measured
    if dtype != "auto":
        curve = cost_curves(model, [dtype], log)[dtype] if calibrated and with_drafter else None
        return DtypeChoice(dtype, "chosen explicitly", curve)
    curves = cost_curves(model, AUTO_CANDIDATES, log)
    best, why = choose_dtype(curves, with_drafter, block)
    return DtypeChoice(best, why, curves[best])


def load(model: str, dtype: str = "auto", drafter: str = "default", adaptive: bool = True, tree: int = 0,
         log: Callable[[str], None] = _stderr):
    """(target, drafter or None, policy, DtypeChoice) ready for `decoding.generate`."""
    from hyflash.cli import build_drafter
    from hyflash.targets import Target

    choice = choose(model, dtype, with_drafter=drafter != "none", calibrated=adaptive, log=log)
    target = Target.load(model, dtype=choice.dtype)
    built = build_drafter(drafter, target)
    policy = SpeculationPolicy(choice.curve if adaptive else None, PolicyConfig(adaptive=adaptive, tree=tree))
    return target, built, policy, choice
