"""GRPO past the comparison's budget (issue 42), to measure what the budget only bounds.

Within the comparison's 2,048 samples GRPO never reaches the level (nine tenths of OPD's gain), so REOPOLD vs GRPO
is unbounded and its censored figure a lower bound the budget sets. This runs GRPO for BUDGET times as many
samples, from the same warm start, at the same tuned rate and seeds, and reads where it reaches that level:

    python -m experiments.reopold.grpo_long --out experiments/reopold/grpo-cpu-long --scale cpu-long --budget 5
    python -m experiments.reopold.grpo_long --out ... --scale cpu-long --report-only

Runs go into OUT/grpo-long/grpo-seedN (resumable: finished runs are skipped, unfinished ones resumed; evaluated on
the test split every `--eval-every` steps), after the comparison's runs of REOPOLD and OPD have finished (its
`summary.json` gives the level). Writes OUT/grpo-long/summary.json and results.md: GRPO's samples to reach the
level per seed and for its smoothed seed mean, and samples_GRPO / samples_method for REOPOLD and OPD, each with a
95% interval from resampling seeds within each method (the level held at the comparison's own, not resampled).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from experiments.reopold.protocol import Experiment
from experiments.reopold.reach import (
    ReachConfig,
    _json,
    _ratio,
    _resampled_means,
    mean_smoothed,
    percentile_interval,
    samples_to_reach,
)
from experiments.reopold.report import collect_runs
from experiments.reopold.scales import SCALES, Scale, get_scale
from hyflash.distill.plots import plot_runs, read_jsonl, smooth
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, atomic_write_text

COMPARED = ("reopold", "opd")


def run_long(x: Experiment, seeds: list[int], budget: int, eval_every: int) -> None:
    """GRPO at the comparison's rate for `budget` times its steps, one run per seed."""
    s = x.scale
    lr = json.loads((x.out / "grid.json").read_text())["methods"]["grpo"]["chosen_lr"]
    for seed in seeds:
        config = x._run_config("grpo", lr, seed, x.out / "grpo-long" / f"grpo-seed{seed}", budget * s.steps, "test",
                               s.eval_size)
        config.eval_every = eval_every
        x._train(config)


def _curves(folders: list[Path]) -> tuple[list[float], list[list[float]]]:
    """The evaluation samples and per-seed accuracy curves of finished or partial runs, cut to the shortest."""
    evals = [read_jsonl(f / "eval.jsonl") for f in folders]
    evals = [e for e in evals if e]
    if not evals:
        return [], []
    n = min(len(e) for e in evals)
    return [e["samples"] for e in evals[0][:n]], [[e["accuracy"] for e in ev[:n]] for ev in evals]


def reach_report(out: Path, scale: Scale, config: ReachConfig = ReachConfig()) -> dict:
    """GRPO's samples to reach the comparison's level in the long runs, and the ratios to REOPOLD's and OPD's
    (their finished runs, as the comparison reads them), resampling seeds as the comparison does."""
    summary_path = out / "summary.json"
    if not summary_path.exists():
        raise HyflashError(f"{summary_path} is missing: run the comparison's report first "
                           f"(python -m experiments.reopold --out {out} --scale SCALE --report-only)")
    level = json.loads(summary_path.read_text())["level"]
    if level is None:
        raise HyflashError(f"{summary_path} defines no level to reach (OPD did not improve over the warm start)")
    long_samples, long_curves = _curves(sorted((out / "grpo-long").glob("grpo-seed*")))
    if not long_curves:
        raise HyflashError(f"no GRPO run in {out / 'grpo-long'} has evaluated yet: run without --report-only first")
    samples, evals, _ = collect_runs(out, scale)
    curves = {"grpo": long_curves, **{m: [[e["accuracy"] for e in ev] for ev in evals[m].values()]
                                      for m in COMPARED if m in evals}}
    grids = {m: long_samples if m == "grpo" else samples for m in curves}  # GRPO's runs are longer
    point = {m: samples_to_reach(grids[m], mean_smoothed(c, config.window), level) for m, c in curves.items()}
    resamples = [{m: samples_to_reach(grids[m], mean[m], level) for m in mean}
                 for mean in _resampled_means(curves, config)]
    ratios = {}
    for m in COMPARED:
        if m not in curves:
            continue
        ratio = _ratio(point["grpo"], point[m])
        lo, hi = percentile_interval([_ratio(r["grpo"], r[m]) for r in resamples], config.confidence)
        ratios[m] = {"samples_to_reach": point[m], "seeds": len(curves[m]), "ratio": _json(ratio),
                     "ratio_unbounded": math.isinf(ratio), "ci": [_json(lo), _json(hi)],
                     "ci_upper_unbounded": math.isinf(hi)}
    return {"level": level, "grpo_samples": long_samples[-1], "grpo_seeds": len(long_curves),
            "grpo_samples_to_reach": point["grpo"],
            "grpo_samples_to_reach_per_seed": [samples_to_reach(long_samples, smooth(c, config.window), level)
                                               for c in long_curves],
            "grpo_final_smoothed": mean_smoothed(long_curves, config.window)[-1],
            "ratios": ratios, "smoothing_window": config.window, "bootstrap_resamples": config.bootstrap,
            "confidence": config.confidence}


def results_markdown(r: dict) -> str:
    reach = "never" if r["grpo_samples_to_reach"] is None else f"{r['grpo_samples_to_reach']:,.0f}"
    per_seed = ", ".join("never" if s is None else f"{s:,.0f}" for s in r["grpo_samples_to_reach_per_seed"])
    lines = [f"GRPO for {r['grpo_samples']:,} samples ({r['grpo_seeds']} seeds), the comparison's level "
             f"{r['level']:.3f}: reached at **{reach}** samples by the smoothed seed mean (per seed: {per_seed}); "
             f"final smoothed accuracy {r['grpo_final_smoothed']:.3f}.", "",
             "| samples of GRPO / samples of | samples to reach | seeds | ratio [95% CI] |",
             "| --- | --- | --- | --- |"]
    for m, x in r["ratios"].items():
        ratio = "∞" if x["ratio_unbounded"] else "—" if x["ratio"] is None else f"{x['ratio']:.2f}"
        lo, hi = x["ci"]
        upper = "∞" if x["ci_upper_unbounded"] else "—" if hi is None else f"{hi:.2f}"
        ci = f"[{'—' if lo is None else f'{lo:.2f}'}, {upper}]"
        lines.append(f"| {m} | {x['samples_to_reach']:,.0f} | {x['seeds']} | {ratio} {ci} |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, scale: Scale) -> dict:
    result = reach_report(out, scale)
    folder = out / "grpo-long"
    atomic_write_json(folder / "summary.json", result)
    atomic_write_text(folder / "results.md", results_markdown(result))
    groups = {"grpo": [str(f) for f in sorted(folder.glob("grpo-seed*"))]}
    groups.update({m: [str(f) for f in sorted((out / "runs").glob(f"{m}-seed*"))] for m in COMPARED})
    plot_runs(groups, str(folder / "accuracy_entropy.png"), level=result["level"])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.reopold.grpo_long", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the comparison's experiment folder")
    p.add_argument("--scale", default="cpu", choices=list(SCALES))
    p.add_argument("--budget", type=int, default=5, help="times the comparison's samples per run (default 5)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the scale's seeds")
    p.add_argument("--eval-every", type=int, default=None,
                   help="steps between evaluations (default: twice the scale's, a multiple of it)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    scale = get_scale(args.scale)
    if args.budget < 1:
        print("grpo_long: error: --budget must be 1 or more", file=sys.stderr)
        return 2
    if scale.threads:
        torch.set_num_threads(scale.threads)
    try:
        if not args.report_only:
            x = Experiment(Path(args.out), scale, progress=not args.no_progress)
            if not (x.out / "grid.json").exists() or not (x.out / "probe.json").exists():
                raise HyflashError(f"{x.out} has no tuned GRPO rate or warm start: run the comparison first "
                                   f"(python -m experiments.reopold --out {x.out} --scale {scale.name})")
            run_long(x, args.seeds if args.seeds is not None else list(scale.seeds), args.budget,
                     args.eval_every or 2 * scale.eval_every)
        result = write_report(Path(args.out), scale)
    except HyflashError as exc:
        print(f"grpo_long: error: {exc}", file=sys.stderr)
        return 2
    print(results_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
