"""The distillation loop: rollout -> teacher scores -> loss -> update, with evaluation and exact resume.

The same loop runs the reinforcement-learning baseline GRPO (`method="grpo"`): the rollout is G samples per
prompt, the task's exact checker scores them instead of a teacher, and a frozen copy of the starting student
is the reference of its KL penalty.

Every random choice of step s (which problems, which sampled tokens) is a pure function of (seed, s), so a
resumed run needs only the weights, the optimizer state and the step counter to continue bit for bit.
Checkpoints (safetensors for tensors, JSON for the rest) are written to a temporary folder and swapped in,
so a crash never leaves a half-written one.

Runs on the CPU or one CUDA device (`device`): models, batches and the per-step generators live there, and
the hot loops copy nothing back to the host except the sampled texts (one copy per rollout).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hyflash.corpora import humaneval_problems
from hyflash.credit import CreditConfig, floor_from_lambda, reward_quantiles, token_reward
from hyflash.distill import losses, rollout, tasks
from hyflash.distill.student import freeze_embeddings, load_model, same_vocabulary, save_model
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, atomic_write_jsonl, read_jsonl, replace_folder
from hyflash.machine import auto_dtype
from hyflash.optimizer_state import load_optimizer, optimizer_tensors
from hyflash.targets import DTYPES

METHODS = ("reopold", "opd", "gkd", "skew-rkl", "sft", "grpo")
FULL_DISTRIBUTION = ("gkd", "skew-rkl")  # need the teacher's whole distribution, hence a shared vocabulary
SFT_SOURCES = ("teacher", "ground-truth")  # sft learns the teacher's greedy answers, or the task's solutions
DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """'auto' = CUDA when visible, else the CPU; asking for CUDA without one is an error, not a fallback."""
    if name not in DEVICES:
        raise HyflashError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise HyflashError("device cuda asked for, but torch sees no CUDA device: use --device cpu (or auto)")
    return torch.device(name)


@dataclass
class DistillConfig:
    method: str = "reopold"
    teacher: str = "smollm2-135m"
    student: str = "first-6"  # first-N[:MODEL] or a model folder (e.g. a warmed-up student)
    out: str = "runs/distill"
    steps: int = 60
    batch_size: int = 8  # student samples per step: one per prompt (grpo: batch_size / grpo_group_size prompts)
    max_new_tokens: int = 24
    temperature: float = 1.0  # rollout temperature; != 1 makes the importance ratio differ from 1
    lr: float = 5e-5
    lr_decay: str = "constant"  # constant | linear: from lr down to lr / 10 at the last step (a set function
    # of the step, so a resumed run, or one whose steps were raised, follows it exactly from where it is)
    grad_clip: float = 1.0
    seed: int = 0
    task: str = "arithmetic"  # tasks.TASKS
    levels: tuple[int, ...] = (1, 2, 3)  # arithmetic: difficulty levels; chain: numbers of operations
    train_pool: int = 1200  # training problems; the run's seed only orders them and drives sampling
    data_seed: int = 0
    eval_every: int = 10
    eval_size: int = 96
    eval_seed: int = 0  # fixed across runs so every curve is measured on the same held-out problems
    eval_split: str = "test"  # "val" (chain task) for choices made on held-out data: early stops, grids
    eval_batch: int = 32  # prompts per greedy evaluation batch (larger on an accelerator)
    stop_at_accuracy: float | None = None  # stop early once a held-out evaluation reaches this accuracy
    checkpoint_every: int = 10
    device: str = "cpu"  # DEVICES
    # Scoring only. auto: bf16 where its matrix products beat float32's (about 2x faster with AMX; emulated, and
    # several times slower, on AVX2 CPUs), measured once per process by machine.bf16_matmul_pays.
    teacher_dtype: str = "auto"
    # Rollouts and evaluation run on a copy of the student in this dtype (bf16 decodes ~3x faster with AMX or
    # AVX-512 BF16, several times slower on AVX2; auto: as teacher_dtype decides); training stays fp32. The
    # importance ratio of REOPOLD corrects the small sampling mismatch.
    rollout_dtype: str = "float32"
    train_embeddings: bool = False
    # REOPOLD
    floor: float | None = None  # given directly, else from lam and floor_form
    lam: float = 0.2
    floor_form: str = "logit"
    entropy_top_fraction: float = 0.2
    switch_step: int = 20
    updates_per_rollout: int = 1
    ratio_clip: float | None = 2.0
    loss_normalization: str = "kept"  # losses.NORMALIZATIONS: "valid" divides like OPD does
    # baselines
    gkd_beta: float = 0.5
    skew_alpha: float = 0.1
    sft_cache: str | None = None  # JSONL of teacher responses; default <out>/teacher_samples.jsonl
    sft_source: str = "teacher"  # SFT_SOURCES
    # GRPO (reinforcement learning, reward = the task's checker): samples per prompt, and the weight of the
    # k3 KL penalty to the starting student (0 = none, and no reference pass)
    grpo_group_size: int = 4
    kl_coef: float = 0.04

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise HyflashError(f"unknown method {self.method!r}: use one of {', '.join(METHODS)}")
        for name in ("steps", "batch_size", "max_new_tokens", "eval_every", "eval_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise HyflashError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        self.levels = tuple(self.levels)
        choices = (("lr_decay", ("constant", "linear")), ("teacher_dtype", ("auto", *DTYPES)),
                   ("rollout_dtype", ("auto", *DTYPES)),
                   ("task", tasks.TASKS), ("sft_source", SFT_SOURCES), ("device", DEVICES),
                   ("loss_normalization", losses.NORMALIZATIONS))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise HyflashError(f"unknown {name.replace('_', '-')} {getattr(self, name)!r}: "
                                   f"use one of {', '.join(allowed)}")
        if self.method == "grpo" and (self.grpo_group_size < 2 or self.batch_size % self.grpo_group_size):
            raise HyflashError(f"grpo needs groups of >= 2 samples that divide the batch: batch-size "
                               f"{self.batch_size}, group size {self.grpo_group_size}")
        if self.kl_coef < 0:
            raise HyflashError(f"kl-coef must be >= 0, got {self.kl_coef}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise HyflashError(f"stop-at-accuracy must be in (0, 1], got {self.stop_at_accuracy}")

    def credit(self) -> CreditConfig:
        floor = self.floor if self.floor is not None else floor_from_lambda(self.lam, self.floor_form)
        return CreditConfig(floor, self.entropy_top_fraction, self.switch_step)


def last_eval_reached(folder: Path, step: int, target: float) -> bool:
    """Whether the run's last evaluation at or before `step` (its eval.jsonl) reached accuracy `target`: a run
    that stopped early at a lower target has not, and continues."""
    rows = [r for r in read_jsonl(folder / "eval.jsonl") if r["step"] <= step]
    return bool(rows) and rows[-1]["accuracy"] >= target


def _step_rng(seed: int, step: int, device: torch.device) -> tuple[random.Random, torch.Generator]:
    """The step's generators; the torch one lives on the sampling device (CUDA sampling needs a CUDA one)."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)
    return random.Random(f"distill-{seed}-{step}"), gen


class TeacherSamples:
    """Teacher responses for supervised KD, keyed by prompt, generated on demand and cached in a JSONL file
    (greedy, so the cache is valid for every run and seed)."""

    def __init__(self, path: Path, teacher, tokenizer, max_new_tokens: int):
        self.path, self.teacher, self.tokenizer, self.max_new_tokens = path, teacher, tokenizer, max_new_tokens
        # repair: a kill in the middle of an append left a broken last line, which the next append would extend
        self.cache: dict[str, str] = {row["prompt"]: row["response"] for row in read_jsonl(path, repair=True)}

    def get(self, prompts: list[str], batch: int = 32) -> list[str]:
        missing = [p for p in dict.fromkeys(prompts) if p not in self.cache]
        for start in range(0, len(missing), batch):
            chunk = missing[start : start + batch]
            got = rollout.sample(self.teacher, self.tokenizer, chunk, self.max_new_tokens, temperature=0)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                for p, r in zip(chunk, got.texts):
                    self.cache[p] = r
                    f.write(json.dumps({"prompt": p, "response": r}) + "\n")
        return [self.cache[p] for p in prompts]


def rollout_from_texts(
    tokenizer, prompts: list[str], responses: list[str], device: torch.device | str = "cpu"
) -> rollout.Rollout:
    """A batch in rollout layout from given responses (teacher samples or solutions for supervised KD)."""
    ids, mask = (t.to(device) for t in rollout.encode_left_padded(tokenizer, prompts))
    rows = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(max(len(r) for r in rows), 1)
    pad = rollout.pad_id(tokenizer)
    resp = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    valid = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows], device=device)
    return rollout.Rollout(
        prompts=list(prompts),
        ids=torch.cat([ids, resp], 1),
        attention_mask=torch.cat([mask, valid.long()], 1),
        prompt_len=ids.shape[1],
        valid=valid,
        sampling_logp=torch.zeros(valid.shape, device=device),
        texts=list(responses),
    )


@torch.no_grad()
def evaluate(model, tokenizer, problems: list, max_new_tokens: int, batch: int = 32) -> dict:
    """Greedy accuracy on held-out problems and the mean response length in tokens."""
    model.eval()
    correct, lengths = 0, 0
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        got = rollout.sample(model, tokenizer, [p.prompt for p in chunk], max_new_tokens, temperature=0)
        correct += sum(tasks.is_correct(p, r) for p, r in zip(chunk, got.texts))
        lengths += got.num_tokens
    return {"accuracy": correct / len(problems), "mean_tokens": lengths / len(problems)}


HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


@torch.no_grad()
def evaluate_humaneval(model, tokenizer, limit: int | None = None, max_new_tokens: int = 256, batch: int = 8,
                       allow_code_execution: bool = False) -> dict:
    """Greedy pass@1 on HumanEval: complete each prompt, cut at the usual stop sequences, run the tests in an
    isolated subprocess (tasks.check_humaneval, which refuses without allow_code_execution)."""
    problems = list(humaneval_problems().values())[:limit]
    eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    passed = 0
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        got = rollout.sample(model, tokenizer, [p["prompt"] for p in chunk], max_new_tokens, 0, stops=eos)
        for problem, text in zip(chunk, got.texts):
            cut = min([text.find(s) for s in HUMANEVAL_STOPS if s in text], default=len(text))
            passed += tasks.check_humaneval(problem, text[:cut], allow_code_execution=allow_code_execution).passed
    return {"pass@1": passed / len(problems), "problems": len(problems)}


class Trainer:
    def __init__(
        self, config: DistillConfig, student=None, student_tokenizer=None, teacher=None, teacher_tokenizer=None,
        resume: bool = False,
    ):
        """Models may be passed in (tests, experiments sharing a teacher); otherwise they are loaded.
        With `resume`, an existing checkpoint in the output folder replaces the given student."""
        self.config = c = config
        self.out = Path(c.out)
        self.device = resolve_device(c.device)
        self.rollout_dtype = auto_dtype(c.rollout_dtype, self.device)
        # OPD is REOPOLD with every relaxation off (CreditConfig's defaults): one loss code path, so the two
        # share the normalisation and the importance ratio and differ only in the credit rule.
        self.credit_config = c.credit() if c.method == "reopold" else CreditConfig() if c.method == "opd" else None
        # Supervised training on the task's own solutions (fine-tuning a teacher) and GRPO (rewarded by the
        # task's checker) need no teacher at all; one passed in is not used.
        self.needs_teacher = not (c.method == "sft" and c.sft_source == "ground-truth") and c.method != "grpo"
        if teacher is None and self.needs_teacher:
            teacher, teacher_tokenizer = load_model(c.teacher, auto_dtype(c.teacher_dtype, self.device))
        self.teacher = teacher.to(self.device).eval() if self.needs_teacher else None
        self.teacher_tokenizer = teacher_tokenizer if self.needs_teacher else None
        # GRPO's KL reference: the starting student, frozen in fp32 (so the penalty is exactly 0 at the start).
        # Taken before a resume swaps in the checkpoint: the reference stays the start, not the last checkpoint.
        self.reference = None
        if c.method == "grpo" and c.kl_coef > 0:
            start = copy.deepcopy(student) if student is not None else load_model(c.student, "float32")[0]
            self.reference = start.float().to(self.device).eval().requires_grad_(False)
        self.step = 0
        self.stopped_early = False
        resume_from = self._checkpoint_dir()
        if resume_from is not None and not resume:
            raise HyflashError(f"{self.out} already holds a run: pass --resume to continue it, or a new --out")
        if resume_from is not None:
            student, student_tokenizer = load_model(str(resume_from), "float32")
        elif student is None:
            student, student_tokenizer = load_model(c.student, "float32")
        self.student, self.tokenizer = student.to(self.device), student_tokenizer
        if not c.train_embeddings:
            freeze_embeddings(self.student)
        self.fast = self._make_fast_copy()
        self.cross_vocab = self.teacher is not None and not same_vocabulary(self.tokenizer, self.teacher_tokenizer)
        # SFT learns the teacher's answers as text, so another vocabulary is fine there.
        if self.cross_vocab and c.method in FULL_DISTRIBUTION:
            raise HyflashError(
                f"--method {c.method} needs the teacher's token distribution over the student's vocabulary; "
                "with a different tokenizer use reopold or opd (they score text and map credit back)"
            )
        params = [p for p in self.student.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=c.lr, weight_decay=0.0)
        self.samples_seen = 0
        if resume_from is not None:
            self._load_state(resume_from)
        self._truncate_logs()
        self.train_pool = tasks.task_split(c.task, "train", c.train_pool, c.data_seed, c.levels)
        self.eval_set = tasks.task_split(c.task, c.eval_split, c.eval_size, c.eval_seed, c.levels)
        self.teacher_samples = None
        if c.method == "sft" and c.sft_source == "teacher":
            path = Path(c.sft_cache) if c.sft_cache else self.out / "teacher_samples.jsonl"
            self.teacher_samples = TeacherSamples(path, self.teacher, self.teacher_tokenizer, c.max_new_tokens)

    @property
    def _off_policy(self) -> bool:
        """Whether the policy that drew the tokens can differ from the one being trained (then rho != 1)."""
        c = self.config
        return c.updates_per_rollout > 1 or c.temperature != 1 or self.rollout_dtype != "float32"

    # ----- the decoding copy -------------------------------------------------------------------------------
    def _make_fast_copy(self):
        if self.rollout_dtype == "float32":
            return self.student
        return copy.deepcopy(self.student).to(DTYPES[self.rollout_dtype]).eval()

    @torch.no_grad()
    def _sync_fast_copy(self) -> None:
        if self.fast is self.student:
            return
        for fast, p in zip(self.fast.parameters(), self.student.parameters()):
            if p.requires_grad:  # frozen weights (the big embedding) never change
                fast.copy_(p)

    # ----- one step ---------------------------------------------------------------------------------------
    def _batch(self, step: int) -> tuple[list, torch.Generator]:
        """The step's problems, one per sample: GRPO's G samples of a prompt are consecutive rows."""
        c = self.config
        rng, gen = _step_rng(c.seed, step, self.device)
        if c.method != "grpo":
            return rng.sample(self.train_pool, c.batch_size), gen
        prompts = rng.sample(self.train_pool, c.batch_size // c.grpo_group_size)
        return [p for p in prompts for _ in range(c.grpo_group_size)], gen

    def _sft_targets(self, problems: list) -> list[str]:
        if self.teacher_samples is None:  # ground truth
            return [p.solution for p in problems]
        return self.teacher_samples.get([p.prompt for p in problems])

    def train_step(self) -> dict:
        c, step = self.config, self.step
        problems, gen = self._batch(step)
        prompts = [p.prompt for p in problems]
        t0 = time.time()
        teacher_logp = teacher_logits = reference_logp = None
        if c.method == "sft":
            batch = rollout_from_texts(self.tokenizer, prompts, self._sft_targets(problems), self.device)
        else:
            batch = rollout.sample(self.fast, self.tokenizer, prompts, c.max_new_tokens, c.temperature, gen)
            if c.method == "grpo":
                if self.reference is not None:
                    reference_logp = rollout.teacher_scores(self.reference, batch)[0]
            elif self.cross_vocab:
                teacher_logp = rollout.teacher_scores_cross_vocab(
                    self.teacher, self.teacher_tokenizer, self.tokenizer, batch
                )
                teacher_logits = None
            else:
                teacher_logp, teacher_logits = rollout.teacher_scores(
                    self.teacher, batch, full=c.method in FULL_DISTRIBUTION
                )
        record = {"step": step + 1}
        if c.lr_decay == "linear":
            for group in self.optimizer.param_groups:
                group["lr"] = c.lr * (1 - 0.9 * step / c.steps)
        self.student.train()
        correct = [tasks.is_correct(p, r) for p, r in zip(problems, batch.texts)]
        for _ in range(c.updates_per_rollout if c.method == "reopold" else 1):
            logits = rollout.response_logits(self.student, batch.ids, batch.attention_mask, batch.prompt_len)
            logp, entropy = losses.token_logp_entropy(logits, batch.response)
            if c.method == "grpo":
                rewards = torch.tensor(correct, dtype=torch.float32, device=self.device)
                out = losses.grpo_loss(
                    logp, rewards, batch.valid, c.grpo_group_size, reference_logp, c.kl_coef,
                    sampling_logp=batch.sampling_logp if self._off_policy else None, ratio_clip=c.ratio_clip,
                )
                loss, stats = out.loss, out.stats
            else:
                loss, stats = self._loss(logits, logp, entropy, teacher_logp, teacher_logits, batch, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.student.parameters() if p.requires_grad], c.grad_clip
            )
            self.optimizer.step()
            self._sync_fast_copy()
        valid = batch.valid
        record.update(stats)
        if teacher_logp is not None and "reward_q50" not in record:  # baselines log the same reward too
            record.update(reward_quantiles(token_reward(teacher_logp, logp), valid))
        self.step += 1
        self.samples_seen += len(problems)
        record.update(
            samples=self.samples_seen,
            loss=float(loss.detach()),
            grad_norm=float(grad_norm),
            entropy=float(entropy[valid].mean()) if valid.any() else 0.0,
            response_tokens=batch.num_tokens / len(problems),
            # For sft these are the teacher's samples, for the other methods the student's own.
            sample_accuracy=sum(correct) / len(problems),
            seconds=time.time() - t0,
        )
        return record

    def _loss(self, logits, logp, entropy, teacher_logp, teacher_logits, batch, step):
        c, valid = self.config, batch.valid
        if c.method in ("reopold", "opd"):
            out = losses.reopold_loss(
                logp, entropy, teacher_logp, valid, step, self.credit_config,
                sampling_logp=batch.sampling_logp if self._off_policy else None,
                ratio_clip=c.ratio_clip, normalize=c.loss_normalization,
            )
            if c.method == "opd":  # keeps every token: no phases, nothing clipped
                for key in ("phase", "kept_fraction", "clipped_fraction"):
                    out.stats.pop(key)
            return out.loss, out.stats
        if c.method == "gkd":
            return losses.generalized_jsd(logits, teacher_logits, valid, c.gkd_beta), {}
        if c.method == "skew-rkl":
            return losses.skew_reverse_kl(logits, teacher_logits, valid, c.skew_alpha), {}
        return losses.sft_loss(logp, valid), {}

    # ----- the loop ---------------------------------------------------------------------------------------
    def run(self, progress: bool = True) -> list[dict]:
        from tqdm.auto import tqdm

        c = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.out / "config.json", dataclasses.asdict(c))
        evals = []
        if self.step == 0:
            evals.append(self._evaluate())
        bar = tqdm(total=c.steps, initial=self.step, desc=f"{c.method} seed {c.seed} {self.out.name}",
                   disable=not progress)
        while self.step < c.steps and not self.stopped_early:
            record = self.train_step()
            self._append("train.jsonl", record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", ent=f"{record['entropy']:.2f}",
                            acc=f"{record['sample_accuracy']:.2f}")
            if self.step % c.eval_every == 0 or self.step == c.steps:
                evals.append(self._evaluate())
                if progress:
                    bar.write(f"step {self.step}: held-out accuracy {evals[-1]['accuracy']:.3f}")
                self.stopped_early = c.stop_at_accuracy is not None and evals[-1]["accuracy"] >= c.stop_at_accuracy
            if self.step % c.checkpoint_every == 0 or self.step == c.steps or self.stopped_early:
                self.save_checkpoint()
        bar.close()
        return evals

    def _evaluate(self) -> dict:
        result = evaluate(self.fast, self.tokenizer, self.eval_set, self.config.max_new_tokens, self.config.eval_batch)
        result.update(step=self.step, samples=self.samples_seen)
        self._append("eval.jsonl", result)
        return result

    def _append(self, name: str, record: dict) -> None:
        with (self.out / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    # ----- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint_dir(self) -> Path | None:
        for name in ("checkpoint", "checkpoint.old"):  # .old survives a crash in the middle of a swap
            path = self.out / name
            if (path / "state.json").exists():
                return path
        return None

    def save_checkpoint(self) -> Path:
        final, tmp, old = self.out / "checkpoint", self.out / "checkpoint.tmp", self.out / "checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(self.student, self.tokenizer, tmp)
        # The optimizer state: its tensors in safetensors, its hyper-parameters and scalars in JSON (no pickle).
        from safetensors.torch import save_file

        tensors, info = optimizer_tensors(self.optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        state = {"step": self.step, "samples_seen": self.samples_seen, "stopped_early": self.stopped_early,
                 "optimizer": info, "config": dataclasses.asdict(self.config)}
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        return replace_folder(tmp, final, old)  # `old` is kept until the new one is in place (_checkpoint_dir)

    def _load_state(self, folder: Path) -> None:
        state = json.loads((folder / "state.json").read_text())
        self.step, self.samples_seen = int(state["step"]), int(state["samples_seen"])
        self.stopped_early = bool(state.get("stopped_early", False))
        if self.stopped_early and self.config.stop_at_accuracy is not None:  # a raised target continues it
            self.stopped_early = last_eval_reached(self.out, self.step, self.config.stop_at_accuracy)
        if "optimizer" in state:
            from safetensors.torch import load_file

            # Read on the CPU: load_state_dict moves moments to each parameter's device and keeps `step` on
            # the CPU, where AdamW expects it (a CUDA step would cost a sync per parameter per update).
            tensors = load_file(str(folder / "optimizer.safetensors"))
            load_optimizer(self.optimizer, tensors, state["optimizer"])
        else:  # checkpoints written before the safetensors format (tensors and plain containers only)
            self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))

    def _truncate_logs(self) -> None:
        """Logs may run ahead of the checkpoint after a crash (or exist without one, when the crash came
        before the first checkpoint): drop the records the run will redo, and a line cut short by a kill."""
        for name in ("train.jsonl", "eval.jsonl"):
            path = self.out / name
            if path.exists():
                keep = [r for r in read_jsonl(path) if r["step"] <= self.step]
                if self.step == 0:  # the step-0 evaluation is redone too
                    keep = []
                atomic_write_jsonl(path, keep)
