"""The first REOPOLD sample-efficiency experiment, and the run bookkeeping the decisive one reuses.

One process, one teacher in memory: (1) the teacher's greedy answers on the training prompts are cached;
(2) a student cut from the teacher (its first layers) is warmed up by supervised KD on them; (3) from that
same warm start every method x seed runs `hyflash distill`'s trainer; (4) a summary JSON and a plot of
held-out accuracy and student entropy against samples seen. Finished runs are skipped and unfinished ones
resumed, so the experiment can be restarted after an interruption.

    python -m experiments.reopold.experiment --out runs/reopold-first --seeds 0 1

This is the first, undecided experiment of docs/reopold.md (kept to reproduce experiments/reopold/first). The
decisive one (issue 15: fine-tuned teacher, probed student, learning-rate grid, smoothed samples-to-reach
with bootstrap intervals) is `python -m experiments.reopold` (protocol.py), which reuses the run bookkeeping
below; both draw with hyflash.distill.plots.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.distill import rollout, tasks
from hyflash.distill.plots import plot_runs
from hyflash.distill.student import load_model
from hyflash.distill.trainer import DistillConfig, TeacherSamples, Trainer, evaluate, last_eval_reached
from hyflash.files import atomic_write_json, atomic_write_text, read_jsonl


def samples_to_reach(evals: list[dict], accuracy: float) -> int | None:
    """Samples seen at the first evaluation with accuracy >= `accuracy` (None if never)."""
    return next((e["samples"] for e in evals if e["accuracy"] >= accuracy - 1e-9), None)


def summarise(out: Path, methods: list[str], seeds: list[int], steps: int, extra: dict) -> dict:
    """Final and per-evaluation accuracy (mean over the finished seeds), late entropy, and how many samples
    REOPOLD's seed-mean curve needed to reach OPD's final seed-mean accuracy."""
    summary: dict = dict(extra, methods={})
    for m in methods:
        done = [s for s in seeds if run_finished(out / f"{m}-seed{s}", steps)]
        evals = [read_jsonl(out / f"{m}-seed{s}" / "eval.jsonl") for s in done]
        trains = [read_jsonl(out / f"{m}-seed{s}" / "train.jsonl") for s in done]
        acc = [ev[-1]["accuracy"] for ev in evals]
        summary["methods"][m] = {
            "seeds": done,
            "final_accuracy": acc,
            "final_mean": float(np.mean(acc)) if acc else None,
            "final_std": float(np.std(acc)) if acc else None,
            "best_accuracy": [max(e["accuracy"] for e in ev) for ev in evals],
            "mean_curve": _mean_curve(evals),
            "entropy_first10": [float(np.mean([r["entropy"] for r in tr[:10]])) for tr in trains],
            "entropy_last10": [float(np.mean([r["entropy"] for r in tr[-10:]])) for tr in trains],
            "seconds_per_step": float(np.mean([r["seconds"] for tr in trains for r in tr])) if trains else None,
            # Mean over steps and seeds of the logged credit statistics (absent ones are skipped).
            "step_means": {k: float(np.mean(v)) for k in ("reward_q05", "reward_q50", "reward_q95",
                                                           "kept_fraction", "clipped_fraction", "ratio_mean")
                           if (v := [r[k] for tr in trains for r in tr if k in r])},
            "final_samples": evals[0][-1]["samples"] if evals else None,
        }
    opd, reo = summary["methods"].get("opd"), summary["methods"].get("reopold")
    if opd and reo and opd["final_mean"] is not None and reo["mean_curve"]:
        # Measured after the first update: the shared warm start already "reaches" any accuracy at or below
        # its own, and then the comparison says nothing, which is flagged rather than counted as a win.
        start = reo["mean_curve"][0]["accuracy"]
        reach = samples_to_reach(reo["mean_curve"][1:], opd["final_mean"])
        meaningful = opd["final_mean"] > start
        summary["reopold_vs_opd"] = {
            "start_accuracy": start,
            "opd_final_mean_accuracy": opd["final_mean"],
            "opd_improved_over_start": meaningful,
            "opd_samples": opd["final_samples"],
            "reopold_samples_to_reach_it": reach,
            "within_one_third": (reach is not None and reach <= opd["final_samples"] / 3) if meaningful else None,
        }
    return summary


def results_markdown(summary: dict, final: dict | None) -> str:
    """The results table for docs/reopold.md."""
    rows = ["| method | seeds | held-out accuracy at 0 / mid / end (seed mean) | final per seed | "
            "entropy first 10 → last 10 steps | s/step |" + (" final eval: accuracy, teacher log-p/token |" if final else ""),
            "| --- | --- | --- | --- | --- | --- |" + (" --- |" if final else "")]
    for m, r in summary["methods"].items():
        if not r["seeds"]:
            continue
        curve = r["mean_curve"]
        points = " / ".join(f"{curve[i]['accuracy']:.3f}" for i in (0, len(curve) // 2, len(curve) - 1))
        ent = ", ".join(f"{a:.2f} → {b:.2f}" for a, b in zip(r["entropy_first10"], r["entropy_last10"]))
        row = (f"| {m} | {len(r['seeds'])} | {points} (at {curve[-1]['samples']} samples) | "
               f"{', '.join(f'{a:.3f}' for a in r['final_accuracy'])} | {ent} | {r['seconds_per_step']:.1f} |")
        if final:
            runs = [final[f"{m}-seed{s}"] for s in r["seeds"] if f"{m}-seed{s}" in final]
            row += " " + ", ".join(f"{x['accuracy']:.3f} ({x['teacher_logp_per_token']:.3f})" for x in runs) + " |"
        rows.append(row)
    return "\n".join(rows) + "\n"


def report(out: Path, methods: list[str], seeds: list[int], steps: int, extra: dict) -> dict:
    """Plot and summarise the finished runs (unfinished ones are left out of both)."""
    groups = {m: [str(out / f"{m}-seed{s}") for s in seeds if run_finished(out / f"{m}-seed{s}", steps)]
              for m in methods}
    args = extra.get("args", {})
    switch_at = args.get("switch_step", 0) * args.get("batch_size", 0) if "reopold" in methods else None
    plot_runs(groups, str(out / "accuracy_entropy.png"), extra.get("teacher_accuracy"), switch_at)
    summary = summarise(out, methods, seeds, steps, extra)
    atomic_write_json(out / "summary.json", summary)
    final = json.loads((out / "final_eval.json").read_text()) if (out / "final_eval.json").exists() else None
    atomic_write_text(out / "results.md", results_markdown(summary, final))
    return summary


def final_eval(out: Path, methods: list[str], seeds: list[int], steps: int, size: int) -> dict:
    """Re-evaluate every finished run's final checkpoint (and the warm start and the teacher) on a larger
    held-out set: accuracy overall and per level, and the teacher's mean log-prob per token of the student's
    greedy answers (a smoother measure of how teacher-like the student's outputs are than exact answers)."""
    teacher, tok = load_model("smollm2-135m", "bfloat16")
    problems = tasks.arithmetic_split("test", size, 0)
    folders = {"teacher": None, "warmup": out / "warmup" / "checkpoint"}
    for m in methods:
        for s in seeds:
            if run_finished(out / f"{m}-seed{s}", steps):
                folders[f"{m}-seed{s}"] = out / f"{m}-seed{s}" / "checkpoint"
    results = {}
    for name, folder in folders.items():
        model = teacher if folder is None else load_model(str(folder), "bfloat16")[0]
        correct, levels, logp_sum, n_tokens = 0, {}, 0.0, 0
        for start in range(0, len(problems), 48):
            chunk = problems[start : start + 48]
            got = rollout.sample(model, tok, [p.prompt for p in chunk], 24, temperature=0)
            t_logp, _ = rollout.teacher_scores(teacher, got)
            logp_sum += float(t_logp[got.valid].sum())
            n_tokens += got.num_tokens
            for p, text in zip(chunk, got.texts):
                ok = tasks.is_correct(p, text)
                correct += ok
                levels.setdefault(p.level, []).append(ok)
        results[name] = {
            "accuracy": correct / len(problems),
            "accuracy_by_level": {str(k): sum(v) / len(v) for k, v in sorted(levels.items())},
            "teacher_logp_per_token": logp_sum / max(n_tokens, 1),
            "problems": len(problems),
        }
        print(name, json.dumps(results[name]), flush=True)
        del model
    atomic_write_json(out / "final_eval.json", results)
    return results


def _mean_curve(runs: list[list[dict]]) -> list[dict]:
    runs = [r for r in runs if r]
    n = min((len(r) for r in runs), default=0)
    return [{"samples": runs[0][i]["samples"], "accuracy": sum(r[i]["accuracy"] for r in runs) / len(runs)}
            for i in range(n)]


def run_finished(folder: Path, steps: int, stop_at: float | None = None) -> bool:
    """Whether the run in `folder` checkpointed its last step (or stopped early at its accuracy target; with
    `stop_at`, only if its last evaluation reached that target: a raised target continues the run)."""
    state = folder / "checkpoint" / "state.json"
    if not state.exists():
        return False
    state = json.loads(state.read_text())
    if state["step"] >= steps:
        return True
    if not state.get("stopped_early"):
        return False
    return stop_at is None or last_eval_reached(folder, state["step"], stop_at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/reopold-first", help="experiment folder (runs/ is not tracked)")
    p.add_argument("--methods", nargs="+", default=["reopold", "opd", "gkd", "sft"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--layers", type=int, default=8, help="student = first N layers of the teacher")
    p.add_argument("--warmup-steps", type=int, default=80)
    p.add_argument("--warmup-lr", type=float, default=3e-4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--eval-size", type=int, default=96)
    p.add_argument("--switch-step", type=int, default=16)
    p.add_argument("--train-pool", type=int, default=400, help="training problems (teacher answers cached once)")
    p.add_argument("--rollout-dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true", help="only redo summary.json and the plot")
    p.add_argument("--final-eval", type=int, default=0, metavar="N",
                   help="only re-evaluate the finished runs' final checkpoints on N held-out problems")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if args.final_eval:
        final_eval(out, args.methods, args.seeds, args.steps, args.final_eval)
        return 0
    if args.report_only:
        extra = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        extra = {k: extra[k] for k in ("teacher_accuracy", "warmup_eval", "args") if k in extra}
        print(json.dumps(report(out, args.methods, args.seeds, args.steps, extra), indent=1))
        return 0

    teacher, tok = load_model("smollm2-135m", "bfloat16")
    eval_set = tasks.arithmetic_split("test", args.eval_size, 0)
    teacher_eval_path = out / "teacher_eval.json"
    if not teacher_eval_path.exists():
        atomic_write_json(teacher_eval_path, evaluate(teacher, tok, eval_set, 24))
    teacher_eval = json.loads(teacher_eval_path.read_text())
    print(f"teacher held-out accuracy {teacher_eval['accuracy']:.3f}", flush=True)

    common = dict(teacher="smollm2-135m", batch_size=args.batch_size, eval_size=args.eval_size,
                  sft_cache=str(out / "teacher_samples.jsonl"), train_pool=args.train_pool,
                  rollout_dtype=args.rollout_dtype)
    # The teacher's greedy answers on the whole (small) training pool, once, for warm-up and the SFT baseline.
    pool = [p.prompt for p in tasks.arithmetic_split("train", args.train_pool, 0)]
    cache = TeacherSamples(Path(common["sft_cache"]), teacher, tok, 24)
    t0 = time.time()
    cache.get(pool, batch=64)
    print(f"teacher answers for {len(pool)} training prompts ready ({time.time() - t0:.0f} s)", flush=True)
    # Warm-up: supervised KD on the teacher's greedy answers, from the first N layers.
    warm_dir = out / "warmup"
    warm = DistillConfig(method="sft", student=f"first-{args.layers}", out=str(warm_dir), steps=args.warmup_steps,
                         lr=args.warmup_lr, seed=1000, checkpoint_every=args.warmup_steps,
                         eval_every=args.warmup_steps, **common)
    if not run_finished(warm_dir, args.warmup_steps):
        Trainer(warm, teacher=teacher, teacher_tokenizer=tok, resume=(warm_dir / "checkpoint").exists()).run()
    student_dir = warm_dir / "checkpoint"

    def _extra() -> dict:
        return {"teacher_accuracy": teacher_eval["accuracy"], "args": vars(args),
                "warmup_eval": read_jsonl(warm_dir / "eval.jsonl")[-1], "wall_seconds_this_process": time.time() - t_start}

    for seed in args.seeds:
        for method in args.methods:
            folder = out / f"{method}-seed{seed}"
            if run_finished(folder, args.steps):
                continue
            config = DistillConfig(method=method, student=str(student_dir), out=str(folder), steps=args.steps,
                                   lr=args.lr, seed=seed, switch_step=args.switch_step,
                                   eval_every=args.eval_every, checkpoint_every=args.eval_every, **common)
            Trainer(config, teacher=teacher, teacher_tokenizer=tok, resume=(folder / "checkpoint").exists()).run()
            report(out, args.methods, args.seeds, args.steps, _extra())
    print(json.dumps(report(out, args.methods, args.seeds, args.steps, _extra()), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
