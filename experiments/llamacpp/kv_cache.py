"""Which KV cache types make llama.cpp passes batch-invariant, and what each costs (issue 13's identity bar).

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/kv_cache.py [ROUNDS [GGUF]]

On the shipped SmolLM2 Q4_1 (or GGUF: then the files are named kv_cache-<file stem>.*) at 2 threads (flash attention on, the backend's default) and each K/V type pair:
  - exactness: `batch_invariance.measure` (16 greedy tokens scored one per pass vs in q-token passes, at
    300 and 1,000 tokens of context): the largest logit difference and the argmax flips;
  - cost: a one-token pass (plain decoding's step) and an 8-token pass (a draft's verification) at 100 /
    500 / 1,000 / 2,000 tokens of context; the pairs take turns within each round, medians over rounds.
Writes kv_cache.json and kv_cache.md next to this file; on a llama.cpp built without llamafile's sgemm (as
`make venv` builds it) the names end in -no-llamafile.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from batch_invariance import measure, result_stem
from hyflash.machine import cpu_description
from hyflash.targets.llamacpp import LlamaCppTarget, gguf_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAIRS = (("f16", "f16"), ("q8_0", "f16"), ("q8_0", "q8_0"), ("bf16", "bf16"))
CONTEXTS = (100, 500, 1000, 2000)
THREADS = 2
STEPS, PASSES = 24, 6


def timings(target: LlamaCppTarget, ids: list[int], ctx: int) -> tuple[float, float]:
    """(ms per one-token pass, ms per 8-token pass) after a prefill of `ctx` tokens."""
    out = target.prefill(torch.tensor(ids[:ctx]), features=False)
    nxt = int(out.logits[-1].argmax())
    t0 = time.perf_counter()
    for _ in range(STEPS):
        nxt = int(target.score(torch.tensor([nxt]), features=False).logits[-1].argmax())
    one = (time.perf_counter() - t0) / STEPS
    block = torch.tensor(ids[ctx : ctx + 8])
    t0 = time.perf_counter()
    for _ in range(PASSES):
        target.rollback(ctx)
        target.score(block, features=False)
    eight = (time.perf_counter() - t0) / PASSES
    return one * 1e3, eight * 1e3


def main(rounds: int, path: Path | None = None) -> None:
    stem = result_stem("kv_cache", path)
    build = " — llama.cpp built without llamafile's sgemm" if stem.endswith("-no-llamafile") else ""
    path = path or gguf_path("smollm2-135m")
    exact = {}
    for k, v in PAIRS:
        rows = measure(path, THREADS, True, contexts=(300, 1000), cache_type_k=k, cache_type_v=v)
        exact[f"{k}/{v}"] = {r["context"]: {"max_diff": r["q8_max_diff"], "flips": r["q8_flips"]} for r in rows}
    targets = {f"{k}/{v}": LlamaCppTarget(path, n_threads=THREADS, record_features=False, cache_type_k=k,
                                          cache_type_v=v) for k, v in PAIRS}
    ids = next(iter(targets.values())).tokenizer.encode((ROOT / "hyflash" / "decoding.py").read_text() * 2)
    samples = {name: {ctx: ([], []) for ctx in CONTEXTS} for name in targets}
    for r in range(rounds):
        for ctx in CONTEXTS:
            for name, target in targets.items():  # the pairs take turns: drift hits them alike
                one, eight = timings(target, ids, ctx)
                samples[name][ctx][0].append(one)
                samples[name][ctx][1].append(eight)
        print(f"round {r + 1}/{rounds} done", flush=True)
    cost = {name: {ctx: {"one_token_ms": statistics.median(a), "eight_token_ms": statistics.median(b)}
                   for ctx, (a, b) in per.items()} for name, per in samples.items()}
    cpu = cpu_description()[0]
    (HERE / f"{stem}.json").write_text(json.dumps({"cpu": cpu, "threads": THREADS, "rounds": rounds,
                                                    "exactness": exact, "cost": cost}, indent=1))
    head = " | ".join(f"{c}: 1 tok / 8 tok" for c in CONTEXTS)
    lines = [f"# llama.cpp KV cache types: batch invariance and cost ({cpu}, {THREADS} threads, {path.name}, flash attention){build}",
             "", "`experiments/llamacpp/kv_cache.py`. Exactness: 16 greedy tokens scored in 8-token passes vs one-token",
             "passes (plain decoding), largest logit difference (argmax flips); 0 = bit-identical. Cost: ms per pass,",
             f"median of {rounds} interleaved rounds, by tokens of context.", "",
             f"| K / V | Δ at 300 | Δ at 1,000 | {head} |", "|---|---:|---:|" + "---:|" * len(CONTEXTS)]
    for name in targets:
        e = exact[name]
        cells = " | ".join(f"{cost[name][c]['one_token_ms']:.2f} / {cost[name][c]['eight_token_ms']:.1f}" for c in CONTEXTS)
        lines.append(f"| {name} | {e[300]['max_diff']:.2g} ({e[300]['flips']}) | "
                     f"{e[1000]['max_diff']:.2g} ({e[1000]['flips']}) | {cells} |")
    (HERE / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, Path(sys.argv[2]) if len(sys.argv) > 2 else None)
