"""The `hyflash` command line. Each command's heavy imports happen inside its handler so --help is fast.

Commands are registered by the packages that own them (`add_cli(subparsers)`), so each concept keeps its
own command-line code next to its implementation.
"""

from __future__ import annotations

import argparse
import json
import sys

from hyflash.drafters.registry import SPEC_HELP
from hyflash.errors import HyflashError
from hyflash.flags import MODEL_HELP, add_backend_arg, add_engine_args, target_options

# Packages that contribute subcommands; each exposes add_cli(subparsers).
COMMAND_MODULES = [
    "hyflash.drafters.cli",
    "hyflash.training.cli",
    "hyflash.bench.cli",
    "hyflash.distill.cli",
    "hyflash.serve.cli",
]


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text, optionally with speculative decoding")
    p.add_argument("--prompt", required=True, help="the user prompt (chat template applied if the model has one)")
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    p.add_argument("--drafter", default="default", help=SPEC_HELP)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    add_engine_args(p)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template (raw continuation)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and every metric")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args) -> int:
    from hyflash.decoding import generate
    from hyflash.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.max_new_tokens < 1:
        raise HyflashError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt.strip():
        raise HyflashError("the prompt is empty: pass some text with --prompt")
    from hyflash import engine

    target, drafter, policy, choice = engine.load(args.model, args.dtype, args.drafter, args.adaptive, args.tree,
                                                  backend=args.backend, keep_drafter=args.keep_drafter,
                                                  target_options=target_options(args))
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
        policy=policy,
    )
    if args.json:
        out = result.to_dict()
        out.update(model=args.model, backend=args.backend, drafter=args.drafter, prompt=args.prompt,
                   adaptive=args.adaptive, tree=args.tree, **choice.to_dict())
        print(json.dumps(out))
    else:
        print()
        dtype = args.dtype if args.dtype != "auto" else f"{choice.dtype} (auto: {choice.reason})"
        print(
            f"[{len(result.tokens)} tokens, {result.tokens_per_second:.1f} tok/s, tau {result.tau:.2f}, "
            f"draft memory {result.draft_memory_bytes / 1024:.1f} KiB, drafter {args.drafter}, {dtype}]"
        )
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="plain decoding vs speculative decoding side by side on held-out prompts")
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    p.add_argument("--drafter", default="default", help="ngram | default | PATH")
    p.add_argument("--prompts", type=int, default=3, help="how many held-out prompts")
    p.add_argument("--max-new-tokens", type=int, default=96)
    add_engine_args(p)
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args) -> int:
    from hyflash.demo import run_demo

    return run_demo(args.model, args.drafter, args.prompts, args.max_new_tokens, backend=args.backend,
                    dtype=args.dtype, adaptive=args.adaptive, tree=args.tree, keep_drafter=args.keep_drafter,
                    target_options=target_options(args))


def _add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine: target pass cost c(q), q = 1..16, and drafter step")
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    add_backend_arg(p)
    p.add_argument("--dtype", default="all", choices=["all", "auto", "bfloat16", "float32"],
                   help="all (default) = auto: every dtype --dtype auto chooses from; on llama.cpp the GGUF's own")
    p.add_argument("--drafter", default="default", help="whose step to time: default | ngram | none | PATH")
    p.add_argument("--force", action="store_true", help="measure again even if this machine has a cached result")
    p.add_argument("--plot", default=None, help="where to draw the cost curves (default: beside the cached "
                   "curves, in hyflash's cache folder; '' = no plot)")
    p.add_argument("--json", action="store_true", help="print one JSON object (key cost_curve) instead of a table")
    p.add_argument("--search-config", action="store_true",
                   help="llama.cpp only: first try threads, flash attention, K/V cache types and repacked weights, "
                        "and keep the fastest configuration whose multi-token passes are bit-identical to one-token "
                        "passes for this file (cached: generate, bench and serve then run it unless given other "
                        "settings; a few minutes)")
    p.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from pathlib import Path

    from hyflash.calibration import calibrate, describe, exactness_line, plot, table
    from hyflash.engine import AUTO_CANDIDATES, GGUF_DTYPE
    from hyflash.policy import choose_dtype

    whole = args.dtype in ("all", "auto")
    if args.backend == "transformers":
        dtypes = list(AUTO_CANDIDATES) if whole else [args.dtype]
    else:  # one curve: the file's own quantisation (an explicit dtype gets load_target's one-line error)
        dtypes = [GGUF_DTYPE if whole else args.dtype]
    say = (lambda line: None) if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    search = None
    if args.search_config:
        if args.backend != "llama.cpp":
            raise HyflashError("--search-config searches llama.cpp's settings: add --backend llama.cpp")
        from hyflash.config_search import search_settings

        say(f"hyflash: searching the fastest exact llama.cpp configuration for {args.model} ...")
        search = search_settings(args.model, announce=say)
    curves = {}  # by the curve's own name for what runs (on llama.cpp the GGUF's quantisation, e.g. Q4_1)
    for dtype in dtypes:
        curve, measured = calibrate(args.model, dtype, None if args.drafter == "none" else args.drafter,
                                    use_cache=not args.force, announce=say, backend=args.backend,
                                    target_options=target_options(args))
        curves[curve.dtype] = curve
        if not measured:
            say(f"hyflash: {args.model} {describe(dtype, args.backend)}: cached result for this machine "
                "(--force measures again)")
    auto = {what: choose_dtype(curves, with_drafter=w) for what, w in (("plain", False), ("speculative", True))}
    if args.plot is None:  # not into the working directory, where it would land in whatever repository one is in
        from hyflash.targets import cache_root

        args.plot = str(cache_root() / "calibration" / f"{Path(args.model).name}-{args.backend}.png")
    if args.plot:
        plot(list(curves.values()), Path(args.plot))
    if args.json:
        out = {"backend": args.backend, "cost_curve": {d: c.to_dict() for d, c in curves.items()},
               "auto_dtype": {k: v[0] for k, v in auto.items()}, "auto_reason": {k: v[1] for k, v in auto.items()}}
        if search is not None:
            out["config_search"] = search.to_dict()
        print(json.dumps(out))
        return 0
    if search is not None:
        from hyflash.config_search import choice_line, search_table

        print(search_table(search))
        print(choice_line(search))
        print()
    print(table(list(curves.values())))
    print()
    for curve in curves.values():
        print(exactness_line(curve))
    for what, (dtype, why) in auto.items():
        print(f"--dtype auto: {'plain decoding' if what == 'plain' else what} -> {dtype} ({why})")
    if args.plot:
        print(f"cost curves: {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="hyflash", description="Fast, lossless speculative decoding with compact HyFlash drafters."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_generate(sub)
    _add_demo(sub)
    _add_calibrate(sub)
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
        from hyflash.machine import set_torch_threads

        set_torch_threads()
        return int(args.handler(args) or 0)
    except HyflashError as exc:
        print(f"hyflash: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hyflash: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
