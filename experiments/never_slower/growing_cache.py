"""Decode steps and verify passes with transformers' DynamicCache (concatenation every pass) against the cache
written in place (hyflash/targets/growing_cache.py), at several contexts, on the real model.

Each context: the same random prompt prefilled into either cache; q = 1, 2, 4, 8 tokens scored on top and rolled
back (median of `--repeats`), then 32 one-token decoding steps in a row (their mean); and whether every logit of
those passes is the same bit for bit in both caches.

    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.growing_cache \
        --out experiments/never_slower/growing-cache

Writes results.json and results.md (quoted by docs/engine.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from hyflash.files import atomic_write_text
from hyflash.machine import cpu_description, set_torch_threads
from hyflash.targets.hf import HFTarget

QS = (1, 2, 4, 8)
STEPS = 32


class DynamicCacheTarget(HFTarget):
    """The reference: transformers' own cache."""

    def reset(self) -> None:
        self.cache = DynamicCache()


def measure(target: HFTarget, ids: torch.Tensor, context: int, repeats: int) -> dict:
    target.prefill(ids[:context], features=False)
    passes, logits = {}, []
    for q in QS:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = target.score(ids[context : context + q], features=True)
            times.append((time.perf_counter() - start) * 1e3)
            target.rollback(context)
        passes[q] = round(statistics.median(times), 2)
        logits.append(out.logits)
    start = time.perf_counter()
    for i in range(STEPS):
        logits.append(target.score(ids[context + i : context + i + 1], features=False).logits)
    step_ms = (time.perf_counter() - start) * 1e3 / STEPS
    return {"passes_ms": passes, "decode_step_ms": round(step_ms, 2), "logits": logits}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--contexts", default="1024,4096,6144")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_torch_threads()
    targets = {"DynamicCache": DynamicCacheTarget.load("smollm2-135m", dtype="float32"),
               "in place": HFTarget.load("smollm2-135m", dtype="float32")}
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        ids = torch.randint(100, 40000, (context + STEPS,), generator=torch.Generator().manual_seed(context))
        measured = {name: measure(target, ids, context, args.repeats) for name, target in targets.items()}
        reference, ours = (measured[name].pop("logits") for name in targets)
        rows.append({"context": context, **measured,
                     "bit_identical": all(torch.equal(a, b) for a, b in zip(reference, ours))})
        print(json.dumps(rows[-1]), flush=True)
    command = (f"python -m experiments.never_slower.growing_cache --out {args.out} --contexts {args.contexts} "
               f"--repeats {args.repeats}")
    result = {"model": "smollm2-135m", "dtype": "float32", "cpu": cpu_description()[0],
              "threads": torch.get_num_threads(), "command": command, "rows": rows}
    lines = ["# transformers' DynamicCache against the cache written in place (SmolLM2-135M fp32)", "",
             f"{result['cpu']}, {result['threads']} threads. Command: `{command}`", "",
             "| context | cache | decode step (mean of 32) | " + " | ".join(f"pass q={q}" for q in QS)
             + " | logits bit-identical |",
             "|---:|---|---:|" + "---:|" * len(QS) + "---|"]
    for row in rows:
        for name in targets:
            cells = " | ".join(f"{row[name]['passes_ms'][q]:.1f} ms" for q in QS)
            same = ("yes" if row["bit_identical"] else "**no**") if name == "in place" else ""
            lines.append(f"| {row['context']} | {name} | {row[name]['decode_step_ms']:.1f} ms | {cells} | {same} |")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "results.json", json.dumps(result, indent=1))
    atomic_write_text(args.out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
