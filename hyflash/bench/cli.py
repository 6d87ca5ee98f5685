"""`hyflash bench`: run the benchmark suite, or redraw the report of an earlier run."""

from __future__ import annotations

import shlex
import sys

from hyflash.errors import HyflashError
from hyflash.flags import MODEL_HELP, add_engine_args, target_options


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_drafter(spec: str) -> tuple[str, str]:
    """NAME=PATH, or a bare 'default' / PATH (named after itself)."""
    name, sep, path = spec.partition("=")
    if not sep:
        return spec.rstrip("/").split("/")[-1] or spec, spec
    if not name or not path:
        raise HyflashError(f"--drafter wants NAME=PATH (or 'default'), got {spec!r}")
    return name, path


def add_cli(sub) -> None:
    from hyflash.bench.datasets import DEFAULT_SETS, SETS
    from hyflash.bench.methods import BUILTIN_METHODS

    p = sub.add_parser("bench", help="benchmark decoding methods side by side on held-out sets")
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)

    add_engine_args(p)
    p.add_argument("--trees", type=lambda s: tuple(-1 if x == "auto" else int(x) for x in _csv(s)), default=(),
                   help="comma list of tree budgets: every trained drafter runs once per budget (overrides --tree)")
    p.add_argument("--sets", type=_csv, default=DEFAULT_SETS, help=f"comma list from: {', '.join(SETS)}")
    p.add_argument("--n", type=int, default=5, help="prompts per set (deterministic selection)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1,
                   help="time each generation this many times (methods in rotated order, each from the same policy "
                        "state) and keep the run of median decode time: one run's speed is noisy by ~5%%")
    p.add_argument("--temperatures", type=lambda s: tuple(float(x) for x in _csv(s)), default=(0.0, 0.7, 1.0),
                   help="comma list; 0 = greedy")
    p.add_argument("--methods", type=_csv, default=BUILTIN_METHODS,
                   help=f"comma list from: {', '.join(BUILTIN_METHODS)} (llamacpp-*: llama-cpp-python's own loop on "
                        "the model's GGUF, skipped with a note without it; hf-*: transformers backend only)")
    p.add_argument("--drafter", action="append", default=[], metavar="NAME=PATH",
                   help="a trained drafter folder, 'default', or model:NAME|PATH (draft-model speculation with a "
                        "smaller LM, e.g. draft-0.5b=model:qwen2.5-coder-0.5b); repeat for several")
    p.add_argument("--pld-tokens", type=int, default=10,
                   help="draft length of prompt lookup (HF prompt_lookup_num_tokens, llama.cpp num_pred_tokens)")
    p.add_argument("--ngram-block", type=int, default=8, help="block size of our n-gram drafter")
    p.add_argument("--memory-contexts", type=lambda s: tuple(int(x) for x in _csv(s)),
                   default=(256, 1024, 2048, 4096, 8192), help="context lengths of the draft-memory sweep ('' = skip)")
    p.add_argument("--sweep-kinds", type=_csv, default=("full", "local", "memory", "hyflash"),
                   help="untrained drafters of these kinds join the memory sweep only ('' = none)")
    p.add_argument("--sweep-depths", type=lambda s: tuple(int(x) for x in _csv(s)), default=(1, 2))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads, and llama.cpp's (default: one per physical core)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the target and drafters run (cuda: one GPU, TF32 off; tau does not depend on it)")
    p.add_argument("--replay", action="store_true",
                   help="acceptance replay: one recorded greedy decode per prompt, every drafter replayed against it "
                   "(tau, acceptance, draft time and memory as in a real run, one target decode per prompt instead "
                   "of one per method; no speeds). Needs --temperatures 0 --no-adaptive; hyflash's loop only")
    p.add_argument("--quick", action="store_true",
                   help="regression mode (overrides --sets/--n/--max-new-tokens/--temperatures): 2 prompts, "
                   "32 tokens, T=0 and 1, sets humaneval, code, long-4k, prose (< 10 min on 2 CPU cores)")
    p.add_argument("--out", default="bench-results", help="folder for results.json, table.md and plots")
    p.add_argument("--resume", action="store_true",
                   help="continue the results.json in --out: keep its records of the same settings and drafters, "
                   "run only what it lacks (a stopped bench, or one grown by new --drafter folders)")
    p.add_argument("--report-only", metavar="RESULTS_JSON", help="redraw table and plots from a results.json")
    p.set_defaults(handler=cmd_bench)
    add_train_eval(sub)


def add_train_eval(sub) -> None:
    """`hyflash train-eval` (the name it had beside `hyflash train`): HumanEval tau and speed-up of one drafter."""
    p = sub.add_parser(
        "train-eval",
        help="benchmark a drafter on HumanEval chat prompts: tau and speed-up vs plain decoding (JSON + markdown)",
    )
    p.add_argument("--drafter", default="default", help="default | PATH to a drafter folder (or a `hyflash train --out` folder)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=20, help="how many HumanEval problems (evenly spaced over the 164)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--exact-n", type=int, default=10, help="problems to compare against plain decoding in fp32")
    p.add_argument("--out", default="runs/train-eval", help="folder for humaneval.json / humaneval.md")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(handler=cmd_train_eval)


def cmd_train_eval(args) -> int:
    from hyflash.bench.humaneval import run_humaneval_benchmark

    run_humaneval_benchmark(args)
    return 0


def cmd_bench(args) -> int:
    import json
    from pathlib import Path

    from hyflash.bench.report import markdown_table, write_report

    if args.report_only:
        results = json.loads(Path(args.report_only).read_text())
        out = Path(args.out if args.out != "bench-results" else Path(args.report_only).parent)
        for path in write_report(results, out):
            print(path)
        return 0

    from hyflash.bench.run import BenchConfig, quick, run_bench

    config = BenchConfig(
        model=args.model, backend=args.backend, dtype=args.dtype, adaptive=args.adaptive,
        keep_drafter=args.keep_drafter, trees=args.trees if args.trees else (args.tree,), sets=args.sets, n=args.n, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        temperatures=args.temperatures, methods=args.methods, drafters=dict(parse_drafter(d) for d in args.drafter),
        pld_tokens=args.pld_tokens, ngram_block=args.ngram_block, seed=args.seed,
        memory_contexts=args.memory_contexts, sweep_kinds=args.sweep_kinds, sweep_depths=args.sweep_depths,
        threads=args.threads, target_options=target_options(args), device=args.device, replay=args.replay,
    )
    if args.quick:
        config = quick(config)
    command = "hyflash " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    results = run_bench(config, out_dir=args.out, log=lambda line: print(line, flush=True), command=command,
                        resume=args.resume)
    write_report(results, args.out)
    print(markdown_table(results))
    for name, error in results["errors"].items():
        print(f"method {name} did not run: {error}", file=sys.stderr)
    for name, reason in results["skipped"].items():
        print(f"method {name} skipped: {reason}", file=sys.stderr)
    print(f"results in {args.out}/ ({results['meta']['seconds']:.0f} s)")
    return 0
