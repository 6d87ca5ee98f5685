"""What `generate`, `demo` and `bench` share: choose the dtype, load target and drafter, build the policy.

`--dtype auto` (the default) reads this machine's calibration (measured once, then cached; see
calibration.py) and picks the dtype with the best expected throughput for what will run: plain decoding, or
speculative decoding with a drafter. An explicit dtype always wins. The target is never quantised behind the
user's back: dtypes only, the same weights.

`--backend llama.cpp` runs the GGUF file itself in its own quantisation, so there is no dtype to choose:
only its cost curve is read (for the adaptive draft length), and the target records features only when the
drafter reads them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from transformers import AutoConfig

from hyflash.calibration import calibrate, describe
from hyflash.costs import CostCurve
from hyflash.drafters import registry
from hyflash.drafters.loading import read_config, target_mismatch
from hyflash.policy import PolicyConfig, SpeculationPolicy, choose_dtype
from hyflash.targets import check_options, check_tree, load_target, resolve_model_path

AUTO_CANDIDATES = ("float32", "bfloat16")
GGUF_DTYPE = "auto"  # the only --dtype of the llama.cpp backend: the file's own quantisation


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class DtypeChoice:
    dtype: str
    reason: str
    curve: CostCurve | None  # the chosen dtype's cost curve (None when not calibrated)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "dtype_reason": self.reason}


def cost_curves(model: str, dtypes, log: Callable[[str], None] = _stderr, backend: str = "transformers",
                target=None, drafter: str = "default") -> dict[str, CostCurve]:
    """Cached curves, measuring (and saying so) the ones this machine has not measured yet."""
    curves = {}
    for dtype in dtypes:
        curve, measured = calibrate(model, dtype, drafter, use_cache=True, announce=log, backend=backend,
                                    target=target)
        curves[dtype] = curve
        if measured:
            log(f"hyflash: calibrated {model} {describe(dtype, backend)} on this machine "
                "(once; cached, see `hyflash calibrate`)")
    return curves


def choose(model: str, dtype: str, with_drafter: bool, block: int = 8, calibrated: bool = True,
           log: Callable[[str], None] = _stderr, drafter: str = "default") -> DtypeChoice:
    """Resolve --dtype: 'auto' from the calibration, else as given (with its curve, for adaptive drafting), each
    curve measured with `drafter` (the one that will run)."""
    resolve_model_path(model)  # a bad model name fails here, before anything is measured
    if dtype != "auto":
        curve = cost_curves(model, [dtype], log, drafter=drafter)[dtype] if calibrated and with_drafter else None
        return DtypeChoice(dtype, "chosen explicitly", curve)
    curves = cost_curves(model, AUTO_CANDIDATES, log, drafter=drafter)
    best, why = choose_dtype(curves, with_drafter, block)
    return DtypeChoice(best, why, curves[best])


def prepare(model: str, dtype: str = "auto", backend: str = "transformers", drafter: str = "default",
            calibrated: bool = True, log: Callable[[str], None] = _stderr, target_options: dict | None = None):
    """(target, DtypeChoice): the target on `backend`, in the dtype chosen for running `drafter` ('none' =
    plain decoding), with the cost curve the adaptive policy reads (calibrated=False: none). target_options:
    the llama.cpp target's settings (`load_target`'s options)."""
    with_drafter, options = drafter != "none", target_options or {}
    check_options(backend, options)  # before a transformers calibration, not after
    if backend == "transformers":
        _refuse_bad_drafter_folder(drafter, model)
        choice = choose(model, dtype, with_drafter, calibrated=calibrated, log=log, drafter=drafter)
        return load_target(model, choice.dtype, backend), choice
    # Loaded first: it checks --dtype and the file, and calibration keys on the file and the target's settings.
    target = load_target(model, dtype, backend, record_features=registry.needs_features(drafter, model), **options)
    curve = None
    if calibrated and with_drafter:
        curve = cost_curves(model, [GGUF_DTYPE], log, backend, target, drafter)[GGUF_DTYPE]
    return target, DtypeChoice(target.precision, f"{backend} runs the GGUF's own quantisation", curve)


def _refuse_bad_drafter_folder(spec: str, model: str) -> None:
    """A missing or corrupt drafter folder, or one made for a model of another hidden size, fails before
    anything is calibrated (a first calibration measures for ~20 s per dtype). The full check follows at load."""
    if not registry.is_folder(spec):
        return
    config = read_config(spec)
    hidden = int(AutoConfig.from_pretrained(resolve_model_path(model)).get_text_config().hidden_size)
    if config.target_hidden_size != hidden:
        raise target_mismatch(config, "hidden size", config.target_hidden_size, hidden, model,
                              where=f"the drafter in {spec}")


def load(model: str, dtype: str = "auto", drafter: str = "default", adaptive: bool = True, tree: int = 0,
         log: Callable[[str], None] = _stderr, backend: str = "transformers",
         keep_drafter: bool = False, target_options: dict | None = None):
    """(target, drafter or None, policy, DtypeChoice) ready for `decoding.generate`."""
    check_tree(backend, [tree])
    target, choice = prepare(model, dtype, backend, drafter, calibrated=adaptive, log=log,
                             target_options=target_options)
    built = registry.build_drafter(drafter, target)
    policy = SpeculationPolicy(choice.curve if adaptive else None, PolicyConfig.for_run(adaptive, tree, keep_drafter))
    return target, built, policy, choice
