"""`hyflash distill`: on-policy distillation of a student from a teacher on held-out-checked arithmetic."""

from __future__ import annotations

import argparse
import shlex

from hyflash.distill.trainer import METHODS
from hyflash.errors import HyflashError


def add_cli(sub) -> None:
    p = sub.add_parser(
        "distill",
        help="distil a small student from a teacher (REOPOLD, OPD, GKD, skew reverse KL, supervised KD), or train "
        "it by GRPO on the task's checker",
        description="Train a student on arithmetic problems against a teacher; evaluates held-out accuracy "
        "every --eval-every steps and logs it against the number of samples seen (eval.jsonl, train.jsonl).",
    )
    p.add_argument("--method", default="reopold", choices=METHODS)
    p.add_argument("--teacher", default="smollm2-135m", help="built-in name or model folder (a saved student "
                   "works too: self-distillation)")
    p.add_argument("--student", default="first-6", help="first-N[:MODEL] (first N layers of MODEL, default "
                   "the default target) or a model folder")
    p.add_argument("--out", required=True, help="output folder: logs, checkpoint, plot")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8, help="student samples per step (one per prompt; grpo: "
                   "--group-size per prompt)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="arithmetic", choices=["arithmetic", "chain"],
                   help="arithmetic: few-shot one-step sums; chain: multi-step sums taught by fine-tuning")
    p.add_argument("--levels", default="1,2,3", help="arithmetic: difficulty levels to mix (1-3); "
                   "chain: numbers of operations")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=96)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--teacher-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="dtype the teacher scores in; auto (default): bfloat16 where its matrix products beat "
                   "float32's on this machine (native bf16: AMX, GPUs), else float32")
    p.add_argument("--rollout-dtype", default="float32", choices=["auto", "bfloat16", "float32"],
                   help="dtype of the student copy used for sampling and evaluation (training is fp32); auto: "
                   "as --teacher-dtype decides")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    g = p.add_argument_group("REOPOLD")
    g.add_argument("--floor", type=float, default=None, help="reward floor (overrides --lam)")
    g.add_argument("--lam", type=float, default=0.2, help="skew-mixture weight that sets the floor")
    g.add_argument("--floor-form", default="logit", choices=["logit", "ratio"],
                   help="logit: log(lam/(1-lam)); ratio: log(lam)/(1-lam)")
    g.add_argument("--entropy-top", type=float, default=0.2, help="beta: fraction of tokens kept by entropy")
    g.add_argument("--switch-step", type=int, default=20, help="end of phase I (exploration)")
    g.add_argument("--updates-per-rollout", type=int, default=1)
    g.add_argument("--ratio-clip", type=float, default=2.0)
    g.add_argument("--loss-normalization", default="kept", choices=["kept", "valid"],
                   help="kept: divide by the credited tokens (published form); valid: by every response "
                   "token, as OPD does (the fair comparison)")
    g = p.add_argument_group("baselines")
    g.add_argument("--gkd-beta", type=float, default=0.5, help="generalised JSD: 0 forward KL, 1 reverse KL")
    g.add_argument("--skew-alpha", type=float, default=0.1, help="DistiLLM skew reverse KL mixture weight")
    g.add_argument("--sft-cache", default=None, help="JSONL cache of teacher samples for --method sft")
    g = p.add_argument_group("GRPO (reward: the task's exact checker; no teacher)")
    g.add_argument("--group-size", type=int, default=4, help="samples per prompt (G); divides --batch-size")
    g.add_argument("--kl-coef", type=float, default=0.04, help="weight of the k3 KL penalty to the starting student")
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(handler=cmd_distill)
    _add_experiment_cli(sub)


def _add_experiment_cli(sub) -> None:
    # The REOPOLD experiment moved to experiments/reopold (issue 38: the library carries no experiments); the old
    # command stays as a pointer so that scripts and habits get one clear line instead of "invalid choice".
    # prefix_chars="+": the old flags (--out ...) are not options here but words to pass on (argparse's REMAINDER
    # refuses a first word that looks like an option).
    p = sub.add_parser("reopold-experiment", help="moved: python -m experiments.reopold (docs/reopold.md)",
                       description="Moved out of the library: run `python -m experiments.reopold` from the root of "
                       "a hyflash checkout, with the same flags.", prefix_chars="+", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the experiment's flags (python -m experiments.reopold -h)")
    p.set_defaults(handler=cmd_reopold_experiment)


def cmd_reopold_experiment(args) -> int:
    command = " ".join(["python -m experiments.reopold", *(shlex.quote(a) for a in args.rest)])
    raise HyflashError(f"reopold-experiment moved out of the library: from the root of a hyflash checkout, run "
                       f"`{command}` (docs/reopold.md)")


def cmd_distill(args) -> int:
    import torch

    from hyflash.distill.plots import plot_runs
    from hyflash.distill.trainer import DistillConfig, Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        levels = tuple(int(x) for x in args.levels.split(","))
    except ValueError as exc:
        raise HyflashError(f"--levels takes comma-separated integers, got {args.levels!r}") from exc
    config = DistillConfig(
        method=args.method, teacher=args.teacher, student=args.student, out=args.out, steps=args.steps,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        lr=args.lr, seed=args.seed, task=args.task, levels=levels, eval_every=args.eval_every,
        eval_size=args.eval_size, device=args.device, loss_normalization=args.loss_normalization,
        checkpoint_every=args.checkpoint_every, teacher_dtype=args.teacher_dtype,
        rollout_dtype=args.rollout_dtype, floor=args.floor,
        lam=args.lam, floor_form=args.floor_form, entropy_top_fraction=args.entropy_top,
        switch_step=args.switch_step, updates_per_rollout=args.updates_per_rollout,
        ratio_clip=args.ratio_clip, gkd_beta=args.gkd_beta, skew_alpha=args.skew_alpha, sft_cache=args.sft_cache,
        grpo_group_size=args.group_size, kl_coef=args.kl_coef,
    )
    trainer = Trainer(config, resume=args.resume)
    evals = trainer.run()
    if not args.no_plot:
        plot_runs({args.method: [args.out]}, f"{args.out}/accuracy.png")
    last = evals[-1] if evals else {}
    print(f"done: {trainer.step} steps, {trainer.samples_seen} samples, held-out accuracy "
          f"{last.get('accuracy', float('nan')):.3f}; logs in {args.out}")
    return 0
