"""summary.json, results.md and the plot of the decisive REOPOLD experiment (experiments/reopold/protocol.py).

Reads only what the stages wrote (JSON files and each finished run's eval.jsonl / train.jsonl), so it can be
redone at any time (`--report-only`), also over a partly finished experiment: unfinished runs are left out
and `seeds_per_method` says which ones count.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.reopold.experiment import run_finished
from experiments.reopold.reach import ReachConfig, compare
from experiments.reopold.scales import Scale
from hyflash.distill.plots import plot_runs, smooth
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, atomic_write_text, read_jsonl

BAR = {"teacher_accuracy": 0.8, "start_accuracy": 0.3, "seeds": 3, "eval_size": 500, "samples_per_run": 2000}


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def collect_runs(out: Path, scale: Scale) -> tuple[list[int], dict[str, dict[int, list[dict]]], dict]:
    """Sample counts of the evaluations, and per method and finished seed its eval and train records."""
    evals: dict[str, dict[int, list[dict]]] = {}
    trains: dict[str, dict[int, list[dict]]] = {}
    for method in scale.methods:
        for seed in scale.seeds:
            folder = out / "runs" / f"{method}-seed{seed}"
            if run_finished(folder, scale.steps):
                evals.setdefault(method, {})[seed] = read_jsonl(folder / "eval.jsonl")
                trains.setdefault(method, {})[seed] = read_jsonl(folder / "train.jsonl")
    runs = [ev for by_seed in evals.values() for ev in by_seed.values()]
    samples = [e["samples"] for e in runs[0]] if runs else []
    if any([e["samples"] for e in ev] != samples for ev in runs):
        raise HyflashError(f"runs in {out / 'runs'} were evaluated at different sample counts, so their curves "
                           "cannot be compared point by point: rerun them with the same scale")
    return samples, evals, trains


def _curves(samples: list[int], evals: dict, trains: dict, window: int) -> dict:
    curves = {}
    for method, by_seed in evals.items():
        acc = {seed: [e["accuracy"] for e in ev] for seed, ev in by_seed.items()}
        ent = {seed: [r["entropy"] for r in trains[method][seed]] for seed in by_seed}
        mean = list(np.mean(list(acc.values()), axis=0))
        curves[method] = {
            "samples": samples,
            "accuracy_per_seed": {str(s): a for s, a in acc.items()},
            "accuracy_mean": [float(x) for x in mean],
            "accuracy_smoothed": smooth(mean, window),
            "entropy_samples": [r["samples"] for r in next(iter(trains[method].values()))],
            "entropy_per_seed": {str(s): e for s, e in ent.items()},
            "entropy_mean": [float(x) for x in np.mean(list(ent.values()), axis=0)],
            "mean_response_tokens": [float(np.mean([ev[i]["mean_tokens"] for ev in by_seed.values()]))
                                     for i in range(len(samples))],
        }
    return curves


def build_summary(out: Path, scale: Scale) -> dict:
    teacher, start = _load(out / "teacher_eval.json"), _load(out / "start_eval.json")
    grid, probe = _load(out / "grid.json"), _load(out / "probe.json")
    samples, evals, trains = collect_runs(out, scale)
    curves = _curves(samples, evals, trains, scale.smoothing_window)
    per_method = {m: [c["accuracy_per_seed"][str(s)] for s in sorted(evals[m])] for m, c in curves.items()}
    reach = compare(samples, per_method, scale.eval_size,
                    ReachConfig(window=scale.smoothing_window, bootstrap=scale.bootstrap))
    reo = reach.get("reopold_vs_opd") or {}
    seeds = {m: sorted(evals.get(m, {})) for m in scale.methods}
    start_accuracy = start["accuracy"] if start else None
    teacher_accuracy = teacher["accuracy"] if teacher else None
    summary = {
        "teacher_accuracy": teacher_accuracy,
        "start_accuracy": start_accuracy,
        "eval_size": scale.eval_size,
        "seeds_per_method": seeds,
        "samples_per_run": scale.samples_per_run,
        "opd_improved_over_start": reach.get("opd_improved_over_start"),
        "samples_to_reach_ratio": reo.get("ratio"),  # samples_OPD / samples_REOPOLD at the level
        "samples_to_reach_ratio_ci": reo.get("ci"),
        "within_one_third": reach.get("within_one_third"),
        "direction": reach.get("direction"),  # confirmed | refuted | within noise (of "REOPOLD needs fewer")
        "level": reach.get("level"),
        # REOPOLD vs GRPO and OPD vs GRPO (and REOPOLD vs OPD again): samples_baseline / samples_method
        "pairs": reach.get("pairs", {}),
        "reach": reach,
        "curves": curves,
        "learning_rates": {m: r["chosen_lr"] for m, r in grid["methods"].items()} if grid else None,
        "grid": grid,
        "probe": probe,
        "student_layers": probe["chosen_layers"] if probe else None,
        "teacher": teacher,
        "task": _load(out / "task.json"),
        "loss_normalization": "valid: every sampled-token loss divides by the batch's response tokens",
        "scale": scale.as_dict(),
    }
    summary["lineage"] = lineage(out, seeds)
    summary["bar"] = _bar(summary)
    return summary


def lineage(out: Path, seeds: dict[str, list[int]]) -> dict:
    """Per finished run, the teacher and warm start it learned from (lineage.json; absent in folders written
    before lineages), and how many distinct ones the runs had: more than one where a later session on a new
    machine made them again (protocol.py), so seeds are then replicates of the whole recipe."""
    runs = {f"{m}-seed{s}": _load(out / "runs" / f"{m}-seed{s}" / "lineage.json") for m, ss in seeds.items() for s in ss}
    known = [r for r in runs.values() if r]
    return {"runs": runs, "teachers": len({r["teacher"]["weights"] for r in known}),
            "warm_starts": len({r["warm_start"]["weights"] for r in known})}


def _bar(summary: dict) -> dict:
    """Issue 15's acceptance bar, criterion by criterion (None = not measured yet)."""
    def at_least(value, bound):
        return None if value is None else value >= bound

    def at_most(value, bound):
        return None if value is None else value <= bound

    seeds = summary["seeds_per_method"]
    checks = {
        "teacher_at_least_0.8": at_least(summary["teacher_accuracy"], BAR["teacher_accuracy"]),
        "start_at_most_0.3": at_most(summary["start_accuracy"], BAR["start_accuracy"]),
        "reopold_and_opd_3_seeds": min(len(seeds.get("reopold", [])), len(seeds.get("opd", []))) >= BAR["seeds"],
        "eval_size_at_least_500": summary["eval_size"] >= BAR["eval_size"],
        "samples_per_run_at_least_2000": summary["samples_per_run"] >= BAR["samples_per_run"],
        "opd_improved_over_start": summary["opd_improved_over_start"],
        "verdict_recorded": summary["within_one_third"] is not None,
    }
    return dict(checks, met=all(v is True for v in checks.values()))


def _fmt(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _ci(lo, hi, upper_unbounded: bool = False) -> str:
    """An interval; a bound past every finite ratio (a method that never reaches the level) prints as ∞."""
    unbounded_lo = upper_unbounded and lo is None and hi is None
    return f"[{'∞' if unbounded_lo else _fmt(lo, 2)}, {'∞' if upper_unbounded else _fmt(hi, 2)}]"


def _censored_cell(pair: dict) -> str:
    """A pair's ratio with never-reached counted as reached at the last sample: '≥' where only the baseline
    never reached the level (a lower bound), '≤' where only the method did, '—' where both never did."""
    side = pair.get("censored")
    if "ratio_censored" not in pair or side == "both":
        return "—"
    sign = {"baseline": "≥ ", "method": "≤ "}.get(side, "")
    return f"{sign}{_fmt(pair['ratio_censored'], 2)} {_ci(*pair['ci_censored'])}"


def _at_final_cell(at: dict | None) -> str:
    """A pair's ratio at the baseline's final accuracy (and that accuracy), or why there is none."""
    if not at or at.get("ratio") is None and not at.get("ratio_unbounded"):
        return "—" if not at else f"— ({at.get('note', 'undefined')})"
    ratio = "∞" if at.get("ratio_unbounded") else _fmt(at["ratio"], 2)
    return f"{ratio} {_ci(*at['ci'], at.get('ci_upper_unbounded', False))} at {_fmt(at['level'])}"


def results_table(summary: dict) -> str:
    """The markdown table for docs/reopold.md: one row per method."""
    reach = summary["reach"].get("methods", {})
    lrs = summary["learning_rates"] or {}
    rows = ["| method | seeds | lr | accuracy start → final (smoothed seed mean) | final per seed | "
            "samples to reach the level | ratio vs OPD [95% CI] | entropy first → last step (seed mean) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, c in summary["curves"].items():
        r = reach.get(method, {})
        finals = ", ".join(_fmt(a[-1]) for a in c["accuracy_per_seed"].values())
        ci = _ci(*r.get("ratio_ci", [None, None]), r.get("ci_upper_unbounded", False)) if r else ""
        ratio = f"{_fmt(r.get('ratio_vs_opd'), 2)} {ci}"
        reach_at = _fmt(r.get("samples_to_reach"), 0) if r else "—"
        if r and r.get("samples_to_reach") is None:  # OPD's samples over infinitely many: no ratio to print
            reach_at, ratio = "never (within the budget)", "—"
        rows.append(
            f"| {method} | {len(c['accuracy_per_seed'])} | {lrs.get(method, '—')} | "
            f"{_fmt(c['accuracy_smoothed'][0])} → {_fmt(c['accuracy_smoothed'][-1])} | {finals} | {reach_at} | "
            f"{ratio} | "
            f"{_fmt(c['entropy_mean'][0], 2)} → {_fmt(c['entropy_mean'][-1], 2)} |")
    reo = summary["reach"].get("reopold_vs_opd") or {}  # the source of samples_to_reach_ratio{,_ci}
    reo_ci = _ci(*(reo.get("ci") or [None, None]), reo.get("ci_upper_unbounded", False))
    verdict = (f"Level: {_fmt(summary['level'])}; REOPOLD vs OPD samples-to-reach ratio "
               f"{_fmt(summary['samples_to_reach_ratio'], 2)}, CI {reo_ci}; "
               f"within_one_third: {summary['within_one_third']}; direction: {summary['direction']}; "
               f"OPD improved over start: {summary['opd_improved_over_start']}; bar met: {summary['bar']['met']}.")
    pairs = ["| comparison | samples-to-reach ratio [95% CI] | censored at the budget [95% CI] | direction | "
             "at the baseline's final accuracy [95% CI] | direction there |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, pair in summary.get("pairs", {}).items():
        method, baseline = name.split("_vs_")
        ratio = "∞" if pair["ratio_unbounded"] else _fmt(pair["ratio"], 2)
        pairs.append(f"| {method} vs {baseline} (samples of {baseline} / samples of {method}) | {ratio} "
                     f"{_ci(*pair['ci'], pair['ci_upper_unbounded'])} | {_censored_cell(pair)} | "
                     f"{pair['direction']} | {_at_final_cell(pair.get('at_baseline_final'))} | "
                     f"{(pair.get('at_baseline_final') or {}).get('direction') or '—'} |")
    head = (f"Teacher {_fmt(summary['teacher_accuracy'])}, warm start {_fmt(summary['start_accuracy'])} "
            f"({summary['student_layers']} layers), {summary['eval_size']} test problems, "
            f"{summary['samples_per_run']} samples per run.")
    made = summary.get("lineage") or {}
    if made.get("teachers", 0) > 1 or made.get("warm_starts", 0) > 1:
        accuracies = sorted({(r["teacher"]["accuracy"], r["warm_start"]["accuracy"])
                             for r in made["runs"].values() if r})
        head += (f" The runs learned from {made['teachers']} teachers and {made['warm_starts']} warm starts, made "
                 f"again on new machines by the same stages and seeds (teacher, start accuracy: "
                 f"{', '.join(f'{t:.3f}, {w:.3f}' for t, w in accuracies)}; lineage per run in summary.json); the "
                 f"head's figures are the latest.")
    tail = ["", *pairs] if len(pairs) > 2 else []
    return "\n".join([head, "", *rows, "", verdict, *tail]) + "\n"


def write_report(out: Path, scale: Scale) -> dict:
    """summary.json, results.md and accuracy_entropy.png from what the stages wrote."""
    summary = build_summary(out, scale)
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "results.md", results_table(summary))
    groups = {m: [str(out / "runs" / f"{m}-seed{s}") for s in seeds]
              for m, seeds in summary["seeds_per_method"].items()}
    teacher = summary["teacher_accuracy"]
    plot_runs(groups, str(out / "accuracy_entropy.png"), teacher, scale.switch_step * scale.batch_size,
              scale.smoothing_window, summary["level"])
    return summary
