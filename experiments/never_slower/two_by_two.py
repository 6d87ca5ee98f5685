"""llama.cpp pass costs with ggml's stock x86 kernels and with hyflash's two-by-two kernels (patches/), and whether
either changes a number: SmolLM2-135M Q4_1, the target hyflash runs (q8_0 K cache, flash attention).

The two builds differ only in libggml-cpu (`two_by_two_builds.sh` makes both from the pinned llama-cpp-python
source and puts each beside a copy of the installed Python package). Each round runs one worker process per
build, alternating, so both see the same machine; a worker prefills `--contexts` tokens of random ids, times
q = 1..8-token passes (scored on top and rolled back, the median of `--repeats` passes), and checks that every
q-token pass gives bit for bit the logits of q one-token passes.

    experiments/never_slower/two_by_two_builds.sh /tmp/two-by-two
    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.two_by_two \
        --stock /tmp/two-by-two/stock --patched /tmp/two-by-two/patched --out experiments/never_slower/two-by-two

Writes results.json, results.md (the table docs/engine.md quotes) and cost_ratio.png (c(q)/c(1), both builds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

QS = (1, 2, 3, 4, 6, 8)


def worker(contexts: list[int], repeats: int, threads: int) -> dict:
    """In a process whose llama_cpp is one build: {"two_by_two": marker, "costs": {ctx: {q: ms}}, "exact": ...}."""
    import torch

    from hyflash.targets.llamacpp import LlamaCppTarget
    from hyflash.targets.llamacpp_build import two_by_two_kernels

    target = LlamaCppTarget.load("smollm2-135m", n_threads=threads, record_features=False)
    out = {"two_by_two": two_by_two_kernels(), "costs": {}, "exact": {}}
    for context in contexts:
        generator = torch.Generator().manual_seed(context)
        ids = torch.randint(100, 40000, (context + max(QS),), generator=generator).tolist()
        prompt, block = ids[:context], ids[context:]
        target.prefill(prompt, features=False, feature_free=True)
        singles = torch.cat([target.score([t], features=False).logits for t in block])
        target.rollback(context)
        exact = {}
        for q in QS[1:]:
            exact[q] = bool(torch.equal(target.score(block[:q], features=False).logits, singles[:q]))
            target.rollback(context)
        times = {q: [] for q in QS}
        for _ in range(repeats):
            for q in QS:
                start = time.perf_counter()
                target.score(block[:q], features=False)
                times[q].append((time.perf_counter() - start) * 1e3)
                target.rollback(context)
        out["costs"][context] = {q: statistics.median(v) for q, v in times.items()}
        out["exact"][context] = exact
    return out


def run_worker(package_dir: Path, contexts: list[int], repeats: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{package_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "experiments.never_slower.two_by_two", "--worker",
            "--contexts", ",".join(map(str, contexts)), "--repeats", str(repeats), "--threads", str(threads)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker for {package_dir} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(rounds: dict[str, list[dict]]) -> dict:
    """Per build and context: each q's pass cost as the minimum and the median over rounds, c(q)/c(1) as the median
    of each round's own ratio, and exactness. This machine runs in two speed modes ~15% apart that switch every
    few minutes (docs/results.md, the never-slower suite): a worker mostly sees one mode, so its own ratio is
    stable where the median of raw costs jumps with the mode; the minimum is the fast mode's cost."""
    out = {}
    for build, results in rounds.items():
        out[build] = {}
        for context in results[0]["costs"]:
            qs = list(results[0]["costs"][context])
            runs = [r["costs"][context] for r in results]
            out[build][context] = {
                "ms_min": {q: min(run[q] for run in runs) for q in qs},
                "ms_median": {q: statistics.median(run[q] for run in runs) for q in qs},
                "ratio": {q: statistics.median(run[q] / run["1"] for run in runs) for q in qs},
                "bit_identical": all(all(r["exact"][context].values()) for r in results)}
    return out


def write_outputs(summary: dict, meta: dict, out: Path) -> None:
    from hyflash.files import atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", {"meta": meta, "summary": summary})
    qs = list(next(iter(summary["stock"].values()))["ratio"])
    lines = [f"# ggml's x86 two-by-two kernels: llama.cpp pass costs ({meta['cpu']}, {meta['threads']} threads)", "",
             f"SmolLM2-135M Q4_1, q8_0 K cache, flash attention; {meta['rounds']} rounds, builds alternating, each "
             f"worker the median of {meta['repeats']} passes per q. c(1): the fastest round (the machine's fast "
             f"mode); c(q)/c(1): the median of the rounds' own ratios. `{meta['command']}`", "",
             "| context | build | c(1) ms | " + " | ".join(f"c({q})/c(1)" for q in qs[1:])
             + " | q-token pass = q one-token passes |",
             "|---:|---|---:|" + "---:|" * (len(qs) - 1) + "---|"]
    for context in summary["stock"]:
        for build in ("stock", "patched"):
            row = summary[build][context]
            lines.append(f"| {context} | {build} | {row['ms_min']['1']:.2f} | "
                         + " | ".join(f"{row['ratio'][q]:.2f}" for q in qs[1:]) + " | "
                         + ("bit-identical" if row["bit_identical"] else "**differs**") + " |")
    lines += ["", "Each pass's cost, patched against stock: the fastest rounds' costs (the median rounds' in brackets, "
              "which mix the two speed modes):", "",
              "| context | " + " | ".join(f"q = {q}" for q in qs) + " |", "|---:|" + "---:|" * len(qs)]
    for context in summary["stock"]:
        s, p = summary["stock"][context], summary["patched"][context]
        lines.append(f"| {context} | " + " | ".join(
            f"{p['ms_min'][q] / s['ms_min'][q] - 1:+.0%} ({p['ms_median'][q] / s['ms_median'][q] - 1:+.0%})"
            for q in qs) + " |")
    atomic_write_text(out / "results.md", "\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary["stock"]), figsize=(4.2 * len(summary["stock"]), 3.6), squeeze=False)
    for ax, context in zip(axes[0], summary["stock"]):
        for build, style in (("stock", "o--"), ("patched", "s-")):
            ratio = summary[build][context]["ratio"]
            ax.plot([int(q) for q in ratio], list(ratio.values()), style, label=build)
        ax.plot([1, int(qs[-1])], [1, int(qs[-1])], color="grey", lw=0.6, label="q one-token steps")
        ax.set(title=f"{context} tokens of context", xlabel="tokens in the pass (q)", ylabel="c(q) / c(1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "cost_ratio.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stock", type=Path, help="folder holding a llama_cpp package with ggml's stock kernels")
    p.add_argument("--patched", type=Path, help="... and one with the two-by-two kernels")
    p.add_argument("--contexts", default="300,1024,4096")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("experiments/never_slower/two-by-two"))
    p.add_argument("--from-results", type=Path, help="summarise the rounds of an earlier results.json again")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.worker:
        print(json.dumps(worker(contexts, args.repeats, args.threads)))
        return 0
    if args.from_results:
        meta = json.loads(args.from_results.read_text())["meta"]
        write_outputs(summarize(meta["rounds_raw"]), meta, args.out)
        print((args.out / "results.md").read_text())
        return 0
    if not (args.stock and args.patched):
        p.error("--stock and --patched are required (experiments/never_slower/two_by_two_builds.sh makes them)")
    from hyflash.machine import cpu_description

    rounds: dict[str, list[dict]] = {"stock": [], "patched": []}
    for r in range(args.rounds):
        for build in (("stock", "patched") if r % 2 == 0 else ("patched", "stock")):
            result = run_worker(getattr(args, build), contexts, args.repeats, args.threads)
            if bool(result["two_by_two"]) != (build == "patched"):
                raise SystemExit(f"{build}: the library in {getattr(args, build)} says two_by_two={result['two_by_two']}")
            rounds[build].append(result)
            print(f"round {r + 1}/{args.rounds} {build}: " + "; ".join(
                f"{c}: c(2)/c(1) {v['2'] / v['1']:.2f}" for c, v in result["costs"].items()), flush=True)
    meta = {"cpu": f"{cpu_description()[0]}, {os.cpu_count()} cores", "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
            "command": " ".join([os.path.basename(sys.executable), "-m", "experiments.never_slower.two_by_two",
                                 *(argv if argv is not None else sys.argv[1:])]), "rounds_raw": rounds}
    write_outputs(summarize(rounds), meta, args.out)
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
