"""The two extensions the REOPOLD paper claims, each run once on an experiment folder (issue 42):

    python -m experiments.reopold.extensions --out runs/reopold4 --scale cpu-long        # both
    python -m experiments.reopold.extensions --out runs/reopold4 --scale cpu-long --only self

They reuse the folder's fine-tuned teacher, its cached teacher answers, its probed warm start and REOPOLD's
tuned learning rate (the protocol's stages up to the grid run first if missing), and run REOPOLD once (seed 0,
the comparison runs' steps and test split) into `extensions/`:

- cross-vocabulary (`extensions/cross-vocab/`): a student with another vocabulary (`Scale.cross_vocab_student`,
  Gemma-3-270M at the cpu scales: 262k tokens against SmolLM2's 49k) is warmed up by supervised KD on the
  teacher's answers (text, so any tokenizer can learn it) until it reaches the probe's floor `min_start`, then
  distilled from the SmolLM2 teacher, whose log-probs reach it through the text path of
  `rollout.teacher_scores_cross_vocab`.
- self-distillation (`extensions/self/`): the teacher is the student's own checkpoint, the warm start after
  `Scale.self_teacher_steps` steps of supervised training on the task's solutions; the student restarts from
  the warm start and learns from that later self on its own samples (no external teacher).

Resumable like the protocol: finished runs are skipped, unfinished ones resumed. Writes `extensions.json`
(accuracy curves, start and final accuracy, the teacher's accuracy) and `extensions.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from experiments.reopold.protocol import Experiment, tiny_model
from experiments.reopold.reach import improved_over_start
from experiments.reopold.scales import SCALES, get_scale
from hyflash.distill.plots import plot_runs, read_jsonl
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, atomic_write_text

EXTENSIONS = ("cross-vocab", "self")
EXTENSION_SEED = 0
# The cross-vocabulary warm-up (Gemma-3-270M, its 262k-token head in every step, up to 400 steps on 2 cores)
# saves a checkpoint every this many evaluations, so a session that ends during it loses minutes, not the warm-up.
WARMUP_CHECKPOINT_EVALS = 4


class Extensions:
    def __init__(self, experiment: Experiment):
        self.x, self.scale = experiment, experiment.scale
        self.folder = experiment.out / "extensions"

    def prepare(self) -> None:
        """The protocol's stages the extensions build on (each skipped where it has finished)."""
        x = self.x
        x.out.mkdir(parents=True, exist_ok=True)
        x._check_scale()
        for name, fn in (("task", x.describe_task), ("teacher", x.fine_tune_teacher),
                         ("teacher_samples", x.cache_teacher_answers), ("probe", x.probe_students),
                         ("grid", x.learning_rate_grid)):
            x._stage(name, fn)

    @property
    def reopold_lr(self) -> float:
        return json.loads((self.x.out / "grid.json").read_text())["methods"]["reopold"]["chosen_lr"]

    def _reopold_run(self, folder: Path, student: str, teacher: str) -> list[dict]:
        config = self.x._run_config("reopold", self.reopold_lr, EXTENSION_SEED, folder, self.scale.steps, "test",
                                    self.scale.eval_size)
        config.student, config.teacher = student, teacher
        return self.x._train(config)

    # ----- cross-vocabulary ------------------------------------------------------------------------------
    def _cross_vocab_base(self) -> str:
        if self.scale.cross_vocab_student != "tiny-pairs":
            return self.scale.cross_vocab_student
        return tiny_model(self.folder / "tiny-pairs-base", layers=2, width=2)

    def cross_vocab(self) -> dict:
        s, x = self.scale, self.x
        base = self._cross_vocab_base()
        warm = self.folder / "cross-vocab" / "warmup"
        eval_every = s.warmup_eval_every or max(1, s.warmup_steps // 2)
        warmup = x._config(
            method="sft", student=base, out=str(warm), steps=s.warmup_steps, batch_size=s.warmup_batch,
            lr=s.warmup_lr, seed=EXTENSION_SEED, eval_split="val", eval_size=s.val_size,
            eval_every=eval_every, checkpoint_every=min(s.warmup_steps, WARMUP_CHECKPOINT_EVALS * eval_every),
            stop_at_accuracy=s.min_start or None,
        )
        warm_evals = x._train(warmup, prune=False)
        evals = self._reopold_run(self.folder / "cross-vocab" / "reopold", str(warm / "checkpoint"),
                                  str(x.teacher_model))
        return {"student": s.cross_vocab_student, "teacher": "the experiment's fine-tuned teacher",
                "warmup_val_curve": [e["accuracy"] for e in warm_evals], **_curve(evals)}

    # ----- self-distillation -----------------------------------------------------------------------------
    def self_distillation(self) -> dict:
        s, x = self.scale, self.x
        later = self.folder / "self" / "teacher"
        config = x._config(
            method="sft", sft_source="ground-truth", student=str(x.warm_start), out=str(later),
            steps=s.self_teacher_steps, batch_size=s.warmup_batch, lr=s.warmup_lr, seed=EXTENSION_SEED,
            eval_split="test", eval_size=s.eval_size, eval_every=s.self_teacher_steps,
            checkpoint_every=s.self_teacher_steps,
        )
        teacher_evals = x._train(config, prune=False)
        evals = self._reopold_run(self.folder / "self" / "reopold", str(x.warm_start), str(later / "checkpoint"))
        return {"student": "the warm start", "teacher": f"the warm start after {s.self_teacher_steps} supervised "
                "steps on the task's solutions", "teacher_accuracy": teacher_evals[-1]["accuracy"], **_curve(evals)}

    def run(self, only: tuple[str, ...] = EXTENSIONS) -> dict:
        self.prepare()
        path = self.x.out / "extensions.json"
        result = json.loads(path.read_text()) if path.exists() else {}
        runs = {"cross-vocab": self.cross_vocab, "self": self.self_distillation}
        for name in only:
            def stage(name=name):
                result[name] = runs[name]()

            self.x._stage(f"extension-{name}", stage)
            result[name].update(lr=self.reopold_lr, method="reopold", seed=EXTENSION_SEED,
                                samples_per_run=self.scale.samples_per_run)
            atomic_write_json(path, result)
            self.write_report(result)  # after each extension: a session that ends during the next keeps it
        return result

    def write_report(self, result: dict) -> None:
        atomic_write_text(self.x.out / "extensions.md", extensions_table(result, self.x.out, self.scale.eval_size))
        self.plot(result)

    def plot(self, result: dict) -> None:
        """extensions.png: each extension's test accuracy against samples, beside the comparison's REOPOLD run of
        the same seed (the same-vocabulary student, its own teacher) where it exists."""
        groups = {name: [str(self.folder / name / "reopold")] for name in result}
        same_vocab = self.x.out / "runs" / f"reopold-seed{EXTENSION_SEED}"
        if (same_vocab / "eval.jsonl").exists():
            groups["reopold"] = [str(same_vocab)]  # the comparison's own run, drawn in REOPOLD's colour
        plot_runs(groups, str(self.x.out / "extensions.png"))


def _curve(evals: list[dict]) -> dict:
    return {"samples": [e["samples"] for e in evals], "accuracy": [e["accuracy"] for e in evals],
            "start_accuracy": evals[0]["accuracy"], "final_accuracy": evals[-1]["accuracy"]}


def extensions_table(result: dict, out: Path, eval_size: int) -> str:
    """One row per extension, and the comparison's REOPOLD run of the same seed beneath them as the reference; a
    gain counts as one only beyond two binomial standard errors of one evaluation (`reach.improved_over_start`)."""
    teacher = json.loads((out / "teacher_eval.json").read_text())["accuracy"]
    rows = ["| run | student | teacher (test accuracy) | REOPOLD lr | samples | accuracy start → final | gain |",
            "| --- | --- | --- | --- | --- | --- | --- |"]

    def row(name: str, student: str, teacher_cell: str, lr: float, samples: int, start: float, final: float) -> str:
        beyond = improved_over_start(start, final, eval_size)
        gain = f"{final - start:+.3f}" + ("" if beyond else " (within noise)")
        return f"| {name} | {student} | {teacher_cell} | {lr:g} | {samples} | {start:.3f} → {final:.3f} | {gain} |"

    for name, r in result.items():
        t_acc = r.get("teacher_accuracy", teacher)
        student = r["student"]
        if r.get("warmup_val_curve"):  # the cross-vocabulary student starts where its own warm-up left it
            student += f", warmed up by supervised KD to {r['warmup_val_curve'][-1]:.3f} of validation"
        rows.append(row(name, student, f"{r['teacher']} ({t_acc:.3f})", r["lr"], r["samples_per_run"],
                        r["start_accuracy"], r["final_accuracy"]))
    same_vocab = read_jsonl(out / "runs" / f"reopold-seed{EXTENSION_SEED}" / "eval.jsonl")
    if same_vocab and result:
        r = next(iter(result.values()))
        rows.append(row(f"reference: the comparison's REOPOLD, seed {EXTENSION_SEED}", "the warm start",
                        f"the experiment's fine-tuned teacher ({teacher:.3f})", r["lr"], same_vocab[-1]["samples"],
                        same_vocab[0]["accuracy"], same_vocab[-1]["accuracy"]))
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.reopold.extensions", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the experiment folder (its stages up to the grid are reused)")
    p.add_argument("--scale", default="cpu", choices=list(SCALES))
    p.add_argument("--only", nargs="+", choices=EXTENSIONS, default=list(EXTENSIONS))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    scale = get_scale(args.scale)
    if scale.threads:
        torch.set_num_threads(scale.threads)
    try:
        result = Extensions(Experiment(Path(args.out), scale, progress=not args.no_progress)).run(tuple(args.only))
    except HyflashError as exc:
        print(f"reopold extensions: error: {exc}", file=sys.stderr)
        return 2
    for name, r in result.items():
        print(f"{name}: accuracy {r['start_accuracy']:.3f} -> {r['final_accuracy']:.3f} over {r['samples_per_run']} "
              f"samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
