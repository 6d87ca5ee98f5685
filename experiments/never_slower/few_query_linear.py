"""Verify-pass costs on transformers fp32 with torch's own linear kernel and with the few-rows kernel
(hyflash/targets/linear.py), at several contexts, and how far the kernel moves the logits.

Each context: the cache prefilled with random tokens, then q = 1..16 tokens scored on top and rolled back, the
median of `--repeats` passes, stock and few-rows interleaved so that both see the same machine. The logits'
difference is the max |logit difference| between the two kernels for the same block, over q = 2..16 (one-token
steps never take the kernel).

    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.few_query_linear \
        --out experiments/never_slower/few-query-linear

Writes results.json and results.md (the table docs/engine.md quotes) and a plot of c(q)/c(1), both kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hyflash.files import atomic_write_text
from hyflash.machine import cpu_description, set_torch_threads
from hyflash.targets.hf import HFTarget
from hyflash.targets.linear import FewRowsConfig, FewRowsLinear

STOCK = FewRowsConfig(head_rows=0, layer_rows=0)  # no row count takes the kernel: torch's own everywhere
QS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def timed_pass(target: HFTarget, block: torch.Tensor, length: int) -> float:
    start = time.perf_counter()
    target.score(block, features=True)
    ms = (time.perf_counter() - start) * 1e3
    target.rollback(length)
    return ms


def measure(target: HFTarget, context: int, repeats: int) -> dict:
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(100, target.vocab_size - 100, (context + 16,), generator=generator)
    target.prefill(ids[:context], features=False)
    block = ids[context:]
    kernels = {"stock": STOCK, "few-rows": FewRowsConfig()}
    times = {name: {q: [] for q in QS} for name in kernels}
    for _ in range(repeats):
        for q in QS:
            for name, config in kernels.items():
                FewRowsLinear.few_rows_config = config
                times[name][q].append(timed_pass(target, block[:q], context))
    differences, same_argmax = [], True
    for q in QS[1:]:
        logits = {}
        for name, config in kernels.items():
            FewRowsLinear.few_rows_config = config
            logits[name] = target.score(block[:q], features=False).logits
            target.rollback(context)
        differences.append(float((logits["stock"] - logits["few-rows"]).abs().max()))
        same_argmax &= bool((logits["stock"].argmax(-1) == logits["few-rows"].argmax(-1)).all())
    FewRowsLinear.few_rows_config = FewRowsConfig()
    return {
        "context": context,
        "ms": {name: {q: round(statistics.median(v), 2) for q, v in per_q.items()} for name, per_q in times.items()},
        "max_logit_difference": max(differences),  # over q = 2..16, each pass against the stock kernel's
        "same_argmax": same_argmax,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Verify-pass costs with the few-rows linear kernel (transformers, float32)",
        "",
        f"{result['model']}, {result['cpu']}, {result['threads']} threads, median of {result['repeats']} passes per "
        f"cell, both kernels interleaved. Command: `{result['command']}`",
        "",
        "c(q)/c(1): a pass over q tokens against a one-token step (which keeps torch's kernel either way).",
        "",
        "| context | kernel | c(1) | " + " | ".join(f"q={q}" for q in QS[1:])
        + " | max \\|logit diff\\| | argmax same |",
        "|---:|---|---:|" + "---:|" * (len(QS) - 1) + "---:|---|",
    ]
    for row in result["rows"]:
        for name in ("stock", "few-rows"):
            ms = row["ms"][name]
            base = row["ms"]["stock"][1]
            cells = " | ".join(f"{ms[q] / base:.2f}" for q in QS[1:])
            extra = (f"{row['max_logit_difference']:.1e} | {'yes' if row['same_argmax'] else 'no'}"
                     if name == "few-rows" else " | ")
            lines.append(f"| {row['context']} | {name} | {ms[1]:.1f} ms | {cells} | {extra} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["rows"]), figsize=(3.2 * len(result["rows"]), 3.2), sharey=True)
    for ax, row in zip(axes, result["rows"]):
        base = row["ms"]["stock"][1]
        for name, style in (("stock", "o--"), ("few-rows", "o-")):
            ax.plot(QS, [row["ms"][name][q] / base for q in QS], style, label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"context {row['context']}")
        ax.set_xlabel("tokens in the pass (q)")
    axes[0].set_ylabel("c(q) / one-token step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--contexts", default="64,256,1024,4096")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_torch_threads()
    target = HFTarget.load(args.model, dtype="float32")
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        rows.append(measure(target, context, args.repeats))
        print(f"context {context}: " + ", ".join(
            f"q={q} {rows[-1]['ms']['stock'][q]:.0f}/{rows[-1]['ms']['few-rows'][q]:.0f} ms" for q in QS), flush=True)
    command = (f"python -m experiments.never_slower.few_query_linear --out {args.out} --contexts {args.contexts} "
               f"--repeats {args.repeats}")
    result = {"model": args.model, "cpu": cpu_description()[0], "threads": torch.get_num_threads(),
              "repeats": args.repeats, "command": command, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "results.json", json.dumps(result, indent=1))
    atomic_write_text(args.out / "results.md", markdown(result))
    plot(result, args.out / "ratio.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
