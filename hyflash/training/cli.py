"""`hyflash data`, `hyflash train` and `hyflash train-eval`: the drafter training recipe on the command line.

Heavy imports (torch, transformers) happen inside the handlers so `hyflash --help` stays fast.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path


def _add_dataclass_args(p: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), helps: dict | None = None) -> None:
    """One --flag per dataclass field (defaults shown); booleans get --flag / --no-flag."""
    helps = helps or {}
    for f in fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        kind = f.type if isinstance(f.type, type) else str(f.type)
        text = helps.get(f.name, "") + f" (default: {default})"
        if kind in ("bool", bool, "bool | None"):  # None: the default decides (see the field's comment)
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif kind in ("int", int):
            p.add_argument(flag, type=int, default=None, help=text)
        elif kind in ("float", float):
            p.add_argument(flag, type=float, default=None, help=text)
        else:
            p.add_argument(flag, type=str, default=None, help=text)


def _from_args(cls, args, **fixed):
    values = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
    values.update(fixed)
    return cls(**values)


def add_cli(sub) -> None:
    from hyflash.training.config import TrainConfig
    from hyflash.training.data import DataConfig

    p = sub.add_parser(
        "data",
        help="build a training set: the target writes continuations of standard-library prompts (resumable)",
    )
    p.add_argument("--out", required=True, help="data folder (created, or resumed if it exists)")
    p.add_argument("--feature-cache", default="",
                   help="also store the target's features, recorded while generating, in this folder "
                        "(for `hyflash train --feature-cache`; not part of the data folder)")
    p.add_argument("--feature-dtype", default="", choices=["", "bfloat16", "float32"],
                   help="file the features for a training run in this dtype (default: --dtype); e.g. generate "
                        "long sequences in float32, which decodes them faster, for a bfloat16 training run")
    _add_dataclass_args(p, DataConfig, helps={
        "split": "train | heldout (disjoint stdlib modules)",
        "num_prompts": "how many prompts; 0 = all of the split",
        "source": "stdlib: code, completion, explanation prompts from the standard library | varied: many tasks "
                  "(edits, bug fixes, tests, docstrings, multi-turn) in many phrasings; heldout in other phrasings",
        "prompts": "your own prompts: JSONL of OpenAI {\"messages\": [...]}, ShareGPT {\"conversations\": [...]}, "
                   "or plain text, one prompt a line (the chat template is applied)",
        "backend": "transformers | llama.cpp (the GGUF itself, several sequences per batch; prints its speed and "
                   "an ETA first)",
        "dtype": "the transformers target's dtype; on llama.cpp the features' storage dtype"})
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=cmd_data)

    p = sub.add_parser("prompts", help="write the varied prompt source's chat prompts as OpenAI-style JSONL "
                                       "(e.g. a held-out set phrased unlike the training prompts)")
    p.add_argument("--out", required=True, help="the .jsonl file to write")
    p.add_argument("--split", default="heldout", choices=["train", "heldout"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num", type=int, default=0, help="at most this many prompts (0 = all of the split)")
    p.add_argument("--per-file", type=int, default=3, help="prompts per source file")
    p.set_defaults(handler=cmd_prompts)

    p = sub.add_parser("train", help="train a drafter on target-written data (resumable; runs under torchrun)")
    p.add_argument("--data", required=True, nargs="+", help="data folders made by `hyflash data`")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true")
    _add_dataclass_args(p, TrainConfig, skip=("data",), helps={
        "copy_ngram": "give the drafter a copy input: the continuation of the longest recurring suffix of up to "
                      "this many tokens, plus a pointer to copies outside the draft vocabulary; 0 = none",
        "copy_gate": "with a copy input: a learned bonus on each slot's copy-candidate logit, so that the drafter "
                     "can trust a long match for many slots (grown at zero on an --init drafter)"})
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser(
        "train-eval",
        help="benchmark a drafter on HumanEval chat prompts: tau and speed-up vs plain decoding (JSON + markdown)",
    )
    p.add_argument("--drafter", default="default", help="default | PATH to a drafter folder")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=20, help="how many HumanEval problems (evenly spaced over the 164)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--exact-n", type=int, default=10, help="problems to compare against plain decoding in fp32")
    p.add_argument("--out", default="docs/results/training", help="folder for humaneval.json / humaneval.md")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(handler=cmd_train_eval)


def cmd_data(args) -> int:
    from hyflash.training.data import DataConfig, build_dataset

    config = _from_args(DataConfig, args)
    manifest = build_dataset(config, Path(args.out), progress=not args.no_progress, feature_cache=args.feature_cache,
                             feature_dtype=args.feature_dtype)
    shards = manifest["shards"]
    print(
        f"{args.out}: {sum(s['sequences'] for s in shards)} sequences, {sum(s['tokens'] for s in shards)} tokens "
        f"({sum(s['generated'] for s in shards)} written by the target) in {len(shards)} shards"
    )
    return 0


def cmd_prompts(args) -> int:
    import random

    from hyflash.training.user_prompts import write_prompt_file
    from hyflash.training.varied_prompts import varied_prompts

    prompts = varied_prompts(args.split, seed=args.seed, per_file=args.per_file)
    random.Random(args.seed).shuffle(prompts)
    n = write_prompt_file(args.out, prompts[: args.num] if args.num else prompts)
    print(f"{args.out}: {n} {args.split} chat prompts")
    return 0


def cmd_train(args) -> int:
    from hyflash.training.config import TrainConfig
    from hyflash.training.train import train

    config = _from_args(TrainConfig, args, data=list(args.data))
    train(config, resume=args.resume, progress=not args.no_progress)
    return 0


def cmd_train_eval(args) -> int:
    from hyflash.training.evaluate import run_humaneval_benchmark

    run_humaneval_benchmark(args)
    return 0
