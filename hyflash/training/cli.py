"""`hyflash data` and `hyflash train`: the drafter training recipe on the command line (`hyflash train-eval`,
which benchmarks the result, is a bench command: bench/cli.py).

Heavy imports (torch, transformers) happen inside the handlers so `hyflash --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

from hyflash.errors import HyflashError
from hyflash.flags import add_dataclass_flags, dataclass_from_flags


def add_cli(sub) -> None:
    from hyflash.training.config import TrainConfig
    from hyflash.training.data import DataConfig
    from hyflash.training.self_instruct import SelfInstructConfig

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
    add_dataclass_flags(p, DataConfig, helps={
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

    p = sub.add_parser("prompts", help="write chat prompts as OpenAI-style JSONL for `hyflash data --prompts`: the "
                                       "varied source's (e.g. a held-out set phrased unlike the training prompts), "
                                       "or with --self-instruct N requests the model writes itself")
    p.add_argument("--out", required=True, help="the .jsonl file to write (--self-instruct: continued if it exists)")
    p.add_argument("--split", default=None, choices=["train", "heldout"], help="the varied source's split "
                   "(default heldout)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num", type=int, default=0, help="at most this many prompts (0 = all of the split)")
    p.add_argument("--per-file", type=int, default=None, help="the varied source's prompts per source file "
                   "(default 3)")
    p.add_argument("--self-instruct", type=int, default=0, metavar="N",
                   help="instead: N user requests sampled from --model itself, given its chat template up to a user "
                        "turn (the Magpie method), deduplicated; resumable")
    p.add_argument("--model", default="smollm2-135m", help="--self-instruct: the model that writes the requests")
    p.add_argument("--backend", default="transformers", choices=["transformers", "llama.cpp"],
                   help="--self-instruct: the backend it runs on")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="--self-instruct on transformers: the model's dtype (auto: bf16 where it pays here)")
    p.add_argument("--batch-size", type=int, default=SelfInstructConfig.batch_size,
                   help="--self-instruct on llama.cpp: sequences per batch (1: one generation at a time)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=cmd_prompts)

    p = sub.add_parser("train", help="train a drafter on target-written data (resumable; runs under torchrun)")
    p.add_argument("--data", required=True, nargs="+", help="data folders made by `hyflash data`")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true")
    add_dataclass_flags(p, TrainConfig, skip=("data",), helps={
        "copy_ngram": "give the drafter a copy input: the continuation of the longest recurring suffix of up to "
                      "this many tokens, plus a pointer to copies outside the draft vocabulary; 0 = none",
        "copy_gate": "with a copy input: a learned bonus on each slot's copy-candidate logit, so that the drafter "
                     "can trust a long match for many slots (grown at zero on an --init drafter)"})
    p.set_defaults(handler=cmd_train)


def cmd_data(args) -> int:
    from hyflash.training.data import DataConfig, build_dataset

    config = dataclass_from_flags(DataConfig, args)
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

    if args.self_instruct:
        return _self_instruct(args)
    split, per_file = args.split or "heldout", args.per_file or 3
    prompts = varied_prompts(split, seed=args.seed, per_file=per_file)
    random.Random(args.seed).shuffle(prompts)
    n = write_prompt_file(args.out, prompts[: args.num] if args.num else prompts)
    print(f"{args.out}: {n} {split} chat prompts")
    return 0


def _self_instruct(args) -> int:
    import torch

    from hyflash.machine import auto_dtype
    from hyflash.targets import load_target
    from hyflash.training.self_instruct import SelfInstructConfig, self_instruct

    for flag, value in (("--split", args.split), ("--per-file", args.per_file), ("--num", args.num or None)):
        if value is not None:
            raise HyflashError(f"{flag} is for the varied source; with --self-instruct N, N is the number of prompts "
                               f"and the model writes them: leave {flag} out")
    config = SelfInstructConfig(num=args.self_instruct, seed=args.seed, batch_size=args.batch_size)
    dtype = "auto" if args.backend == "llama.cpp" else auto_dtype(args.dtype, torch.device("cpu"))
    target = load_target(args.model, dtype=dtype, backend=args.backend)
    prompts = self_instruct(target, args.out, config, progress=not args.no_progress)
    print(f"{args.out}: {len(prompts)} requests written by {args.model}")
    return 0


def cmd_train(args) -> int:
    from hyflash.training.config import TrainConfig
    from hyflash.training.train import train

    config = dataclass_from_flags(TrainConfig, args, data=list(args.data))
    train(config, resume=args.resume, progress=not args.no_progress)
    return 0
