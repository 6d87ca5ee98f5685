"""The `hyflash` command line. Each command's heavy imports happen inside its handler so --help is fast.

Commands are registered by the packages that own them (`add_cli(subparsers)`), so each concept keeps its
own command-line code next to its implementation.
"""

from __future__ import annotations

import argparse
import json
import sys

from hyflash.errors import HyflashError

# Packages that contribute subcommands; each exposes add_cli(subparsers).
COMMAND_MODULES = [
    "hyflash.drafters.cli",
    "hyflash.training.cli",
    "hyflash.bench.cli",
    "hyflash.distill.cli",
]


def build_drafter(spec: str, target, block_size: int | None = None):
    """'none' -> no drafter, 'ngram' -> prompt lookup, 'default' -> the shipped drafter, else a drafter folder.

    'default' falls back to the n-gram drafter (with a note) for targets that have no shipped drafter.
    """
    if spec == "none":
        return None
    if spec == "default":
        from hyflash.training.defaults import DEFAULT_DRAFTERS, default_drafter_path

        if target.name in DEFAULT_DRAFTERS:
            spec = str(default_drafter_path(target.name))
        else:
            print(f"hyflash: no shipped drafter for {target.name}; using the n-gram drafter", file=sys.stderr)
            spec = "ngram"
    if spec == "ngram":
        from hyflash.drafters.ngram import NgramDrafter

        return NgramDrafter(block_size=block_size or 8)
    from hyflash.drafters.loading import load_drafter_for_target

    return load_drafter_for_target(spec, target)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text, optionally with speculative decoding")
    p.add_argument("--prompt", required=True, help="the user prompt (chat template applied if the model has one)")
    p.add_argument("--model", default="smollm2-135m", help="built-in name (smollm2-135m, gemma3-270m) or a folder")
    p.add_argument("--drafter", default="default", help="none | ngram | default | PATH to a drafter folder")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template (raw continuation)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and every metric")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args) -> int:
    from hyflash.decoding import generate
    from hyflash.sampling import SamplingConfig
    from hyflash.targets import Target

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.max_new_tokens < 1:
        raise HyflashError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt.strip():
        raise HyflashError("the prompt is empty: pass some text with --prompt")
    target = Target.load(args.model, dtype=args.dtype)
    drafter = build_drafter(args.drafter, target)
    prompt_ids = target.encode_prompt(args.prompt, chat=False if args.no_chat else None)

    streamed: list[int] = []
    printed = [0]

    def stream(new_tokens: list[int]) -> None:
        # Decode the whole text each time so multi-token characters print correctly.
        streamed.extend(new_tokens)
        text = target.decode(streamed)
        sys.stdout.write(text[printed[0] :])
        sys.stdout.flush()
        printed[0] = len(text)

    result = generate(
        target,
        prompt_ids,
        drafter,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        on_tokens=None if args.json else stream,
    )
    if args.json:
        out = result.to_dict()
        out.update(model=args.model, drafter=args.drafter, dtype=args.dtype, prompt=args.prompt)
        print(json.dumps(out))
    else:
        print()
        print(
            f"[{len(result.tokens)} tokens, {result.tokens_per_second:.1f} tok/s, tau {result.tau:.2f}, "
            f"draft memory {result.draft_memory_bytes / 1024:.1f} KiB, drafter {args.drafter}, {args.dtype}]"
        )
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="plain decoding vs speculative decoding side by side on held-out prompts")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--drafter", default="default", help="ngram | default | PATH")
    p.add_argument("--prompts", type=int, default=3, help="how many held-out prompts")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args) -> int:
    from hyflash.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="hyflash", description="Fast, lossless speculative decoding with compact HyFlash drafters."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_generate(sub)
    _add_demo(sub)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except HyflashError as exc:
        print(f"hyflash: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hyflash: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
