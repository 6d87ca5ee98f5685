"""Command-line flags more than one command shares, and the one way a config dataclass becomes flags.

Here, not in cli.py, so that the packages' own command modules (bench/cli.py, training/cli.py, ...) and the
top-level cli.py read them from below instead of from each other.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from hyflash.targets import BACKENDS, CACHE_TYPES

MODEL_HELP = ("built-in name (smollm2-135m, gemma3-270m, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b; the Qwen files need "
              "`make models`), a Hugging Face folder, or with --backend llama.cpp a PATH.gguf")


def add_backend_arg(p) -> None:
    p.add_argument("--backend", default="transformers", choices=BACKENDS,
                   help="what runs the target: transformers (default) or llama.cpp (the GGUF file itself, in its "
                        "own quantisation; needs llama-cpp-python, see README)")
    for part in ("k", "v"):
        p.add_argument(f"--cache-type-{part}", choices=("auto", *CACHE_TYPES), default=None,
                       help=f"llama.cpp only: the KV cache's {part.upper()} type. auto (default): K q8_0, V f16 where "
                            "that keeps speculative text bit-identical to plain on any thread count (a Q4_1 file; "
                            "F16 and Q8_0 too on a llama.cpp built without llamafile, as make venv builds it), else "
                            "llama.cpp's f16 (docs/engine.md)")


def target_options(args) -> dict:
    """The target settings given on the command line (`load_target`'s options), only those given."""
    return {key: getattr(args, key) for key in ("cache_type_k", "cache_type_v") if getattr(args, key, None)}


def add_engine_args(p) -> None:
    """--backend, --dtype, --no-adaptive, --keep-drafter and --tree, shared by generate, demo and bench."""
    add_backend_arg(p)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="auto (default): the fastest on this machine, from its calibration (`hyflash calibrate`); "
                        "on llama.cpp only auto (the GGUF's own quantisation)")
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="verify every draft in full instead of choosing the draft length from measured costs")
    p.add_argument("--keep-drafter", action="store_true",
                   help="never retire a trained drafter whose drafts do not pay (by default it sits out the rest "
                        "of a generation after backing off in vain, and the target stops computing its features)")
    p.add_argument("--tree", type=tree_budget, default=0, metavar="N|auto",
                   help="verify a draft tree of up to N nodes in one pass (0 = a chain, the default; auto = the "
                        "best size up to 15 from the cost curve)")


def tree_budget(text: str) -> int:
    if text == "auto":
        return -1
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--tree wants a node count >= 0 or 'auto', got {text!r}")
    return int(text)


def add_dataclass_flags(p: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), helps: dict | None = None) -> None:
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


def dataclass_from_flags(cls, args, **fixed):
    """The dataclass `cls` from parsed flags (add_dataclass_flags): the flags given, the rest its defaults."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
    values.update(fixed)
    return cls(**values)
