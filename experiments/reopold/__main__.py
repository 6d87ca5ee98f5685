"""The decisive REOPOLD vs OPD sample-efficiency experiment (docs/reopold.md), resumable.

    python -m experiments.reopold --out runs/reopold --scale cpu      # from the repository root

Until issue 38 this was `hyflash reopold-experiment`; the library no longer carries experiments, so that
command now only says where the experiment went.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from experiments.reopold.protocol import Experiment
from experiments.reopold.report import write_report
from experiments.reopold.scales import SCALES, get_scale
from hyflash.errors import HyflashError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.reopold",
        description="Runs every stage of the protocol in docs/reopold.md (fine-tuned teacher, probed student, "
        "LR grid, 3 seeds per method, bootstrap CIs) into --out, skipping finished stages and resuming "
        "unfinished runs, then writes summary.json, results.md and accuracy_entropy.png.",
    )
    p.add_argument("--out", required=True, help="experiment folder (run the same command again to resume)")
    p.add_argument("--scale", default="cpu", choices=list(SCALES),
                   help="tiny: seconds, for tests; cpu: a few hours on 2 cores; gpu: one H200, under 9 minutes")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None,
                   help="override the scale's device (e.g. --scale tiny --device cuda: a CUDA smoke test)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the summary, table and plot")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the weights of finished runs (by default only their logs and state are kept)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def run(args: argparse.Namespace) -> dict:
    scale = get_scale(args.scale)
    if args.device:
        scale = dataclasses.replace(scale, device=args.device)
    if scale.threads:
        torch.set_num_threads(scale.threads)
    if scale.device != "cpu":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: the fp32 training passes run ~2-4x faster
    out = Path(args.out)
    if not args.report_only:
        return Experiment(out, scale, progress=not args.no_progress, keep_checkpoints=args.keep_checkpoints).run()
    if not (out / "scale.json").exists():
        raise HyflashError(f"{out} holds no experiment to report on: run without --report-only first")
    return write_report(out, scale)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except HyflashError as exc:
        print(f"reopold: error: {exc}", file=sys.stderr)
        return 2
    print(f"teacher {summary['teacher_accuracy']}, start {summary['start_accuracy']}, seeds "
          f"{summary['seeds_per_method']}; samples-to-reach ratio {summary['samples_to_reach_ratio']} "
          f"CI {summary['samples_to_reach_ratio_ci']}, within_one_third {summary['within_one_third']}, "
          f"direction {summary['direction']}; bar met: {summary['bar']['met']}. Written to {args.out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
