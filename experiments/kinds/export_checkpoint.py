"""Export the drafter of a `hyflash train` run from one of its checkpoints (a run stopped before its last step).

usage: python experiments/kinds/export_checkpoint.py RUN_DIR [RUN_DIR ...] [--step S]

Each RUN_DIR is a `hyflash train --out` folder; its drafter/ is written from checkpoints/step-S (default: the
newest step that every RUN_DIR has a checkpoint of, so runs stopped together by a deadline keep equal budgets),
in the run's --save-dtype, as training's own export writes it (config.json + model.safetensors), and
RUN_DIR/exported_step.json says which step it is. No model is loaded: the checkpoint holds the drafter's whole
state_dict and train_config.json its configuration. Prints the step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from hyflash.drafters.config import DrafterConfig  # noqa: E402
from hyflash.drafters.loading import write_checkpoint  # noqa: E402
from hyflash.errors import HyflashError  # noqa: E402
from hyflash.files import atomic_write_json  # noqa: E402
from hyflash.training.checkpoint import list_checkpoints  # noqa: E402


def checkpoint_steps(run: Path) -> dict[int, Path]:
    return {int(p.name.split("-")[1]): p for p in list_checkpoints(run / "checkpoints")}


def common_step(runs: list[Path]) -> int:
    """The newest step that every run has a finished checkpoint of."""
    shared = set.intersection(*(set(checkpoint_steps(r)) for r in runs))
    if not shared:
        raise HyflashError(f"no checkpoint step is shared by all of {', '.join(str(r) for r in runs)}: "
                           "train longer or keep more checkpoints (--keep-checkpoints)")
    return max(shared)


def export(run: Path, step: int) -> Path:
    try:
        config = json.loads((run / "train_config.json").read_text())
        drafter = DrafterConfig.from_dict(config["drafter"])
    except (OSError, ValueError, KeyError) as exc:
        raise HyflashError(f"{run} has no readable train_config.json ({exc}): is it a `hyflash train` folder?") from exc
    found = checkpoint_steps(run)
    if step not in found:
        raise HyflashError(f"{run} has no checkpoint of step {step} (it has {sorted(found)})")
    dtype = getattr(torch, config.get("save_dtype", "bfloat16"))
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(str(found[step] / "model.safetensors")).items()}
    write_checkpoint(run / "drafter", drafter, tensors)
    atomic_write_json(run / "exported_step.json", {"step": step, "steps_planned": config.get("steps")})
    return run / "drafter"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="`hyflash train --out` folders")
    p.add_argument("--step", type=int, help="the checkpoint step (default: the newest that every run has)")
    args = p.parse_args(argv)
    try:
        step = args.step if args.step is not None else common_step(args.runs)
        for run in args.runs:
            export(run, step)
    except HyflashError as exc:
        print(f"export_checkpoint: error: {exc}", file=sys.stderr)
        return 2
    print(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
