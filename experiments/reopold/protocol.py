"""The decisive REOPOLD experiment (issue 15) as one resumable command.

    python -m experiments.reopold --out runs/reopold2 --scale cpu     # or gpu, or tiny (tests)

Stages, in this order, each checkpointed: a finished stage is skipped and an unfinished run resumed, so a
killed command run again continues where it stopped (tensors in safetensors, everything else in JSON).

  task.json              the chain task: split sizes, their pairwise overlap (0), examples
  teacher/               SmolLM2-135M-Instruct fine-tuned on the task's worked solutions until it solves
                         `teacher_stop` of the validation split (early stop) or for `teacher_steps`
  teacher_eval.json      the fine-tuned teacher's greedy accuracy on the test split: teacher_accuracy
  teacher_samples.jsonl  its greedy answers to the runs' training prompts (warm-up and the SFT baseline)
  probe/layers-N/        students cut to the teacher's first N layers after one short warm-up each;
  probe.json             the deepest one that starts at or below `max_start` on validation is kept
  start_eval.json        that warm start on the test split: start_accuracy
  grid/M-lrX/, grid.json one run per method and learning rate (grid seed, validation split); the rate
                         with the largest area under the smoothed validation curve is kept per method
                         (grid.json is written after each method; a method already in it is not re-run)
  runs/M-seedS/          the comparison: every method x seed from the same warm start at its own rate,
                         the same student samples per run, evaluated on the test split
  summary.json, results.md, accuracy_entropy.png, timing.json (wall seconds per stage, kept apart so that
                         a resumed run writes the same summary as an uninterrupted one)

Weights lost with a machine: a folder committed to git keeps every log and JSON but no weights (.gitignore), so
that a long experiment can go on in a later session on a new machine. Whatever still has to train from weights
that are gone is made again by its own stage and seed: the teacher (and its cached answers), the warm start, an
unfinished run (from its first step). Their evaluations are redone; the records they replace move to
history.json, and each comparison run's lineage.json names the teacher and warm start it learned from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from experiments.reopold.experiment import run_finished
from experiments.reopold.report import write_report
from experiments.reopold.scales import Scale
from hyflash.distill import tasks
from hyflash.distill.plots import smooth
from hyflash.distill.student import load_model, save_tiny_model
from hyflash.distill.trainer import DistillConfig, TeacherSamples, Trainer, evaluate, resolve_device
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, file_sha256, read_jsonl
from hyflash.machine import auto_dtype, cpu_description
from hyflash.targets import DTYPES

TEACHER_SEED, PROBE_SEED = 3000, 2000  # seeds of the teacher's fine-tune and the warm-ups (not run seeds)
# How the numbers are computed, not what is computed: "auto" (bf16 where it pays, else float32) continues a
# folder written with either dtype, and each run's lineage.json records the dtype it ran in.
MACHINE_DTYPE_FIELDS = ("rollout_dtype", "teacher_dtype")


def _weight_files(checkpoint: Path) -> list[Path]:
    """A checkpoint's model weights (its optimizer moments left out)."""
    return sorted(p for p in checkpoint.glob("*.safetensors") if p.name != "optimizer.safetensors")


def weights_digest(checkpoint: Path) -> str:
    """sha256 (16 hex digits) of a checkpoint's weights: which teacher or warm start a record belongs to."""
    files = "".join(f"{p.name}:{file_sha256(p)}" for p in _weight_files(checkpoint))
    return hashlib.sha256(files.encode()).hexdigest()[:16]


def weights_gone(folder: Path) -> bool:
    """Whether a run's checkpoint records a step but its weights are not there (committed logs, a new machine)."""
    checkpoint = folder / "checkpoint"
    return (checkpoint / "state.json").exists() and not _weight_files(checkpoint)


def pick_layers(final_accuracy: dict[int, float], max_start: float, min_start: float = 0.0) -> tuple[int, str]:
    """The deepest candidate whose warmed-up accuracy lies in [min_start, max_start] (most capacity to learn
    while starting low, and past the floor that shows it can learn), else the deepest at or below max_start,
    else the shallowest one."""
    fitting = [n for n, acc in final_accuracy.items() if min_start <= acc <= max_start]
    if fitting:
        band = f"in [{min_start}, {max_start}]" if min_start else f"at or below {max_start}"
        return max(fitting), f"deepest student {band} after the warm-up"
    low = [n for n, acc in final_accuracy.items() if acc <= max_start]
    if low:
        return max(low), f"no candidate reached {min_start}: the deepest at or below {max_start}"
    return min(final_accuracy), f"no candidate at or below {max_start} after the warm-up: the shallowest"


def grid_score(accuracies: list[float], window: int) -> float:
    """Area under the smoothed learning curve (mean over the evaluations after the start): what the
    learning rate should buy when the question is how fast a method learns."""
    curve = smooth(accuracies, window)
    return float(sum(curve[1:]) / max(len(curve) - 1, 1))


def best_learning_rate(scores: dict[float, float]) -> float:
    """The rate with the highest score; ties go to the first in grid order."""
    return max(scores, key=lambda lr: (scores[lr], -list(scores).index(lr)))


def rate_past_the_edge(scores: dict[float, float]) -> float | None:
    """The next rate to try when the lowest or the highest rate tried scores strictly better than its
    neighbour and best of all (one grid step, the ratio of the two nearest rates, beyond it); else None."""
    rates, best = sorted(scores), best_learning_rate(scores)
    if len(rates) < 2:
        return None
    for edge, neighbour in ((rates[0], rates[1]), (rates[-1], rates[-2])):
        if best == edge and scores[edge] > scores[neighbour]:
            return edge * edge / neighbour
    return None


def tiny_model(folder: Path, **kwargs) -> str:
    """A tiny random model saved once in `folder` (save_tiny_model's arguments), written aside and renamed in."""
    if not (folder / "config.json").exists():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_tiny_model(tmp, **kwargs)
        os.replace(tmp, folder)
    return str(folder)


def extends(have: dict, want: dict) -> bool:
    """Whether scale `want` is scale `have` with methods added (and the settings that came with them, which a
    folder written before they existed lacks), or with a dtype made "auto" (MACHINE_DTYPE_FIELDS): then the
    folder's finished stages stay valid for the old methods and the new ones are run into it. Any other
    difference is another experiment."""
    have = {k: want[k] if k in MACHINE_DTYPE_FIELDS and want.get(k) == "auto" else v for k, v in have.items()}
    new_fields = set(want) - set(have)
    same = {k: v for k, v in want.items() if k not in new_fields and k != "methods"}
    old_methods = have.get("methods", [])
    return (same == {k: v for k, v in have.items() if k != "methods"} and set(old_methods) <= set(want["methods"])
            and not set(have) - set(want))


class Experiment:
    def __init__(self, out: Path, scale: Scale, progress: bool = True, keep_checkpoints: bool = False):
        self.out, self.scale, self.progress, self.keep_checkpoints = Path(out), scale, progress, keep_checkpoints
        self._teacher = None

    # ----- the whole protocol ----------------------------------------------------------------------------
    def run(self) -> dict:
        hf_logging.disable_progress_bar()  # the stages' own bars say what runs; loading bars only clutter
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_scale()
        self._stage("task", self.describe_task)
        self._stage("teacher", self.fine_tune_teacher)
        self._stage("teacher_samples", self.cache_teacher_answers)
        self._stage("probe", self.probe_students)
        self._stage("grid", self.learning_rate_grid)
        self._stage("runs", self.comparison_runs)

        return write_report(self.out, self.scale)

    def _stage(self, name: str, fn) -> None:
        if self.progress:
            print(f"reopold experiment ({self.scale.name}): stage {name}", flush=True)
        t0 = time.time()
        try:
            fn()
        finally:  # a stage stopped by an error or Ctrl-C still counts its time (a SIGKILL cannot be counted)
            path = self.out / "timing.json"
            timing = json.loads(path.read_text()) if path.exists() else {}
            timing[name] = timing.get(name, 0.0) + time.time() - t0
            atomic_write_json(path, timing)

    def _check_scale(self) -> None:
        path, want = self.out / "scale.json", json.loads(json.dumps(self.scale.as_dict()))
        if path.exists():
            have = json.loads(path.read_text())
            if have != want and not extends(have, want):
                raise HyflashError(f"{self.out} holds a run at scale {have.get('name')!r} with other settings: "
                                   f"pass --scale {have.get('name')} to continue it, or use another --out")
        atomic_write_json(path, want)

    # ----- paths and configs -----------------------------------------------------------------------------
    @property
    def teacher_model(self) -> Path:
        return self.out / "teacher" / "checkpoint"

    @property
    def base_model(self) -> str:
        return self.scale.base if self.scale.base != "tiny" else tiny_model(self.out / "tiny-base")

    def _dtype(self, field: str) -> str:
        """A MACHINE_DTYPE_FIELDS setting made concrete on this machine."""
        return auto_dtype(getattr(self.scale, field), resolve_device(self.scale.device))

    def _config(self, **kw) -> DistillConfig:
        s = self.scale
        base = dict(teacher=str(self.teacher_model), task="chain", levels=s.levels, max_new_tokens=s.max_new_tokens,
                    train_pool=s.pool, eval_batch=s.eval_batch, teacher_dtype=s.teacher_dtype,
                    rollout_dtype=s.rollout_dtype, device=s.device, sft_cache=str(self.out / "teacher_samples.jsonl"),
                    loss_normalization="valid")
        base.update(kw)
        return DistillConfig(**base)

    def teacher(self):
        """The fine-tuned teacher, loaded once (in its scoring dtype, on the device)."""
        if self._teacher is None:
            model, tok = load_model(str(self.teacher_model), self._dtype("teacher_dtype"))
            self._teacher = model.to(resolve_device(self.scale.device)).eval(), tok
        return self._teacher

    def _train(self, config: DistillConfig, prune: bool = True, need_weights: bool = False) -> list[dict]:
        """Run (or resume) one training run unless it has finished; returns its evaluations. Its teacher is the
        experiment's own unless `config.teacher` names another model (the self-distillation extension). A run
        whose weights are gone trains again from its first step if it had not finished, or if a later stage
        loads its weights (`need_weights`: the teacher, the warm start)."""
        folder = Path(config.out)
        if weights_gone(folder) and (need_weights or not run_finished(folder, config.steps, config.stop_at_accuracy)):
            print(f"reopold experiment: {folder} lost its weights (a new machine); training it again from the start",
                  flush=True)
            for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
                shutil.rmtree(folder / name, ignore_errors=True)
        if not run_finished(folder, config.steps, config.stop_at_accuracy):
            teacher, tok = None, None
            if config.sft_source != "ground-truth" and config.method != "grpo":
                teacher, tok = self.teacher() if config.teacher == str(self.teacher_model) else load_model(
                    config.teacher, self._dtype("teacher_dtype"))
            trainer = Trainer(config, teacher=teacher, teacher_tokenizer=tok, resume=True)
            trainer.run(progress=self.progress)
            del trainer
        if prune and not self.keep_checkpoints:
            # Only the logs and state.json of a finished run are read again; its weights, optimizer moments
            # and tokenizer files are ~0.5 GB per SmolLM2-sized run.
            for path in (folder / "checkpoint").iterdir():
                if path.name != "state.json" and path.is_file():
                    path.unlink()
        return read_jsonl(folder / "eval.jsonl")

    # ----- stages ----------------------------------------------------------------------------------------
    def describe_task(self) -> None:
        path = self.out / "task.json"
        if path.exists():
            return
        s = self.scale
        sets = {
            "teacher_pool": tasks.chain_split("train", s.teacher_pool, 0, s.levels),
            "runs_pool": tasks.chain_split("train", s.pool, 0, s.levels),
            "val": tasks.chain_split("val", s.val_size, 0, s.levels),
            "test": tasks.chain_split("test", s.eval_size, 0, s.levels),
        }
        questions = {name: {p.question for p in ps} for name, ps in sets.items()}
        overlap = {f"{a}&{b}": len(questions[a] & questions[b]) for a in questions for b in questions
                   if a < b and not {a, b} <= {"teacher_pool", "runs_pool"}}
        if any(overlap.values()):
            raise HyflashError(f"training and held-out problems overlap ({overlap}): the split hash is broken")
        atomic_write_json(path, {
            "task": "chain", "operations": list(s.levels), "operand_range": list(tasks.CHAIN_OPERAND_RANGE),
            "sizes": {name: len(ps) for name, ps in sets.items()}, "overlap": overlap,
            "examples": [p.prompt + p.solution for p in sets["test"][:3]],
        })

    def fine_tune_teacher(self) -> None:
        s = self.scale
        config = self._config(
            method="sft", sft_source="ground-truth", student=self.base_model, teacher=self.base_model,
            out=str(self.out / "teacher"), steps=s.teacher_steps, batch_size=s.teacher_batch, lr=s.teacher_lr,
            lr_decay=s.teacher_lr_decay,
            train_pool=s.teacher_pool, seed=TEACHER_SEED, eval_split="val", eval_size=s.val_size,
            eval_every=s.teacher_eval_every, checkpoint_every=s.teacher_checkpoint_every or s.teacher_eval_every,
            stop_at_accuracy=s.teacher_stop,
        )
        # Its optimizer moments stay (~1 GB): a raised teacher_stop continues this fine-tune exactly.
        self._train(config, prune=False, need_weights=True)
        path, digest = self.out / "teacher_eval.json", weights_digest(self.teacher_model)
        old = json.loads(path.read_text()) if path.exists() else None
        if old is not None and old.get("weights", digest) == digest:  # no digest: written before digests, same weights
            return
        if old is not None:  # a teacher made again: its answers are another teacher's
            self._replaced("teacher_eval", old)
            (self.out / "teacher_samples.jsonl").unlink(missing_ok=True)
        state = json.loads((self.teacher_model / "state.json").read_text())
        result = self._evaluate(*self.teacher(), "test", s.eval_size)
        result.update(steps=state["step"], stopped_early=state["stopped_early"],
                      val_curve=read_jsonl(self.out / "teacher" / "eval.jsonl"), weights=digest,
                      cpu=cpu_description()[0])
        atomic_write_json(path, result)

    def _replaced(self, name: str, record: dict) -> None:
        """Keep the record of weights that were made again (history.json: name -> earlier records)."""
        path = self.out / "history.json"
        history = json.loads(path.read_text()) if path.exists() else {}
        history.setdefault(name, []).append(record)
        atomic_write_json(path, history)

    def _evaluate(self, model, tokenizer, split: str, size: int) -> dict:
        s = self.scale
        problems = tasks.chain_split(split, size, 0, s.levels)
        return dict(evaluate(model, tokenizer, problems, s.max_new_tokens, s.eval_batch), split=split, problems=size)

    def cache_teacher_answers(self) -> None:
        """The teacher's greedy answers to every training prompt of the runs, in large batches at once."""
        s = self.scale
        model, tok = self.teacher()
        prompts = [p.prompt for p in tasks.chain_split("train", s.pool, 0, s.levels)]
        TeacherSamples(self.out / "teacher_samples.jsonl", model, tok, s.max_new_tokens).get(prompts, s.eval_batch)

    def _probe_folder(self, layers: int) -> Path:
        return self.out / "probe" / f"layers-{layers}"

    def _probe_config(self, layers: int) -> DistillConfig:
        s = self.scale
        return self._config(
            method="sft", student=f"first-{layers}:{self.teacher_model}",
            out=str(self._probe_folder(layers)), steps=s.warmup_steps, batch_size=s.warmup_batch,
            lr=s.warmup_lr, seed=PROBE_SEED, eval_split="val", eval_size=s.val_size,
            eval_every=s.warmup_eval_every or max(1, s.warmup_steps // 2), checkpoint_every=s.warmup_steps,
            stop_at_accuracy=s.min_start or None,
        )

    def _evaluate_start(self, layers: int) -> None:
        warm = self._probe_folder(layers) / "checkpoint"
        start = self._evaluate(*self._load_rollout_copy(warm), "test", self.scale.eval_size)
        atomic_write_json(self.out / "start_eval.json", dict(start, layers=layers, weights=weights_digest(warm),
                                                             cpu=cpu_description()[0]))

    def probe_students(self) -> None:
        path = self.out / "probe.json"
        s = self.scale
        if path.exists():
            chosen = json.loads(path.read_text())["chosen_layers"]
            if not weights_gone(self._probe_folder(chosen)) and self.warm_start.exists():
                return
            # The warm start is gone with its machine: the chosen candidate's warm-up is made again alone.
            self._train(self._probe_config(chosen), prune=False, need_weights=True)
            self._replaced("start_eval", json.loads((self.out / "start_eval.json").read_text()))
            self._evaluate_start(chosen)
            return
        curves = {}
        # With a floor (min_start), each warm-up stops once it reaches the floor, and the deepest candidate
        # goes first: the first one that lands in [min_start, max_start] is the one pick_layers would keep.
        order = sorted(s.probe_layers, reverse=True) if s.min_start else list(s.probe_layers)
        for n in order:
            curves[n] = [e["accuracy"] for e in self._train(self._probe_config(n), prune=False)]
            if s.min_start and s.min_start <= curves[n][-1] <= s.max_start:
                break
        chosen, rule = pick_layers({n: c[-1] for n, c in curves.items()}, s.max_start, s.min_start)
        self._evaluate_start(chosen)
        atomic_write_json(path, {
            "candidates": {str(n): {"val_accuracy_during_warmup": c} for n, c in curves.items()},
            "warmup_steps": s.warmup_steps, "warmup_samples": s.warmup_steps * s.warmup_batch,
            "max_start": s.max_start, "min_start": s.min_start, "chosen_layers": chosen, "rule": rule,
            "warm_start": str((self._probe_folder(chosen) / "checkpoint").relative_to(self.out)),  # the folder may move
        })
        for n in curves:  # only the chosen warm start is used again (pruned after probe.json exists)
            if n != chosen and not self.keep_checkpoints:
                shutil.rmtree(self._probe_folder(n) / "checkpoint", ignore_errors=True)

    def _load_rollout_copy(self, folder: Path):
        """A model as the trainer evaluates it: its fp32 weights cast to the rollout dtype, on the device."""
        model, tok = load_model(str(folder), "float32")
        return model.to(resolve_device(self.scale.device), DTYPES[self._dtype("rollout_dtype")]).eval(), tok

    @property
    def warm_start(self) -> Path:
        return self.out / json.loads((self.out / "probe.json").read_text())["warm_start"]

    def _run_config(self, method: str, lr: float, seed: int, folder: Path, steps: int, split: str, size: int):
        s = self.scale
        return self._config(
            method=method, student=str(self.warm_start), out=str(folder), steps=steps, batch_size=s.batch_size,
            lr=lr, seed=seed, eval_split=split, eval_size=size, eval_every=s.eval_every,
            checkpoint_every=s.run_checkpoint_every or steps,
            switch_step=max(1, round(steps * s.switch_fraction)),
            grpo_group_size=s.grpo_group_size, kl_coef=s.grpo_kl_coef,
        )

    def learning_rate_grid(self) -> None:
        path = self.out / "grid.json"
        s = self.scale
        steps = s.grid_steps or s.steps
        result = json.loads(path.read_text()) if path.exists() else {
            "seed": s.grid_seed, "split": "val", "steps": steps, "score": "area under the smoothed curve",
            "methods": {}}
        for method in s.methods:
            if method in result["methods"]:  # tuned already (a method added to a finished experiment: the rest)
                continue
            scores, extended = {}, 0
            rates = list(s.lr_grid)
            while rates:
                lr = rates.pop(0)
                folder = self.out / "grid" / f"{method}-lr{lr:.3g}"
                evals = self._train(self._run_config(method, lr, s.grid_seed, folder, steps, "val", s.val_size))
                scores[lr] = grid_score([e["accuracy"] for e in evals], s.smoothing_window)
                beyond = None if rates or extended >= s.grid_extend else rate_past_the_edge(scores)
                if beyond is not None:
                    rates.append(beyond)
                    extended += 1
            result["methods"][method] = {"scores": {f"{lr:g}": v for lr, v in scores.items()},
                                         "chosen_lr": best_learning_rate(scores)}
            atomic_write_json(path, result)

    def _write_lineage(self, folder: Path) -> None:
        """What a comparison run learns from: the teacher's and warm start's weights and test accuracy, and
        the CPU (the weights may be made again on another machine between sessions)."""
        teacher = json.loads((self.out / "teacher_eval.json").read_text())
        start = json.loads((self.out / "start_eval.json").read_text())
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "lineage.json", {
            "teacher": {"weights": teacher.get("weights"), "accuracy": teacher["accuracy"]},
            "warm_start": {"weights": start.get("weights"), "accuracy": start["accuracy"]},
            "cpu": cpu_description()[0], "dtypes": {f: self._dtype(f) for f in MACHINE_DTYPE_FIELDS}})

    def comparison_runs(self) -> None:
        s = self.scale
        chosen = {m: r["chosen_lr"] for m, r in json.loads((self.out / "grid.json").read_text())["methods"].items()}
        # The compared methods (REOPOLD, OPD, GRPO) first, then the references (GKD, SFT); each group seed-major,
        # so an interrupted experiment has the verdicts' seeds first and balanced seeds within each group.
        compared = [m for m in s.methods if m in ("reopold", "opd", "grpo")]
        references = [m for m in s.methods if m not in compared]
        for group in (compared, references):
            for seed in s.seeds:
                for method in group:
                    folder = self.out / "runs" / f"{method}-seed{seed}"
                    config = self._run_config(method, chosen[method], seed, folder, s.steps, "test", s.eval_size)
                    if not run_finished(folder, s.steps):
                        self._write_lineage(folder)
                    self._train(config)
