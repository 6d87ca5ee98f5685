"""What one draft of the shipped drafter costs on the llama.cpp backend, next to a target step.

    ../shared/bin/heavy .venv/bin/python docs/results/llamacpp/draft_cost.py

The shipped SmolLM2 Q4_1 GGUF with 300 tokens of context (hyflash's own source). Median of 60 of each:
- a one-token and an eight-token target pass (features on, as in speculative decoding);
- one 7-token chain draft warm (drafts back to back), and right after an eight-token target pass (as in the
  decoding loop), and right after streaming 256 MB through the cache with no target pass at all (if that
  costs what the loop does, the loop's extra is the pass evicting the drafter's weights, not threads);
- with torch on 1 and on 2 threads.
Writes draft_cost.json and draft_cost.md next to this file.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.calibration import cpu_description
from hyflash.drafters.loading import load_drafter_for_target
from hyflash.sampling import SamplingConfig
from hyflash.targets.llamacpp import LlamaCppTarget, gguf_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
GREEDY = SamplingConfig()


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 3)


def timed(fn, n: int = 60) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def draft_after(setup, drafter, last: int, n: int = 60) -> float:
    samples = []
    for _ in range(n):
        setup()
        start = time.perf_counter()
        drafter.draft(last, 7, GREEDY, None)
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def main() -> None:
    target = LlamaCppTarget(gguf_path("smollm2-135m"), n_threads=2)
    drafter = load_drafter_for_target(ROOT / "hyflash" / "assets" / "drafters" / "smollm2-135m", target)
    ids = target.tokenizer.encode((ROOT / "hyflash" / "decoding.py").read_text()[:3000])[:300]
    out = target.prefill(torch.tensor(ids), features=True)
    drafter.reset()
    drafter.ingest(torch.tensor(ids), out.features)
    block = torch.tensor(ids[-8:])
    junk = np.ones(256 << 20, dtype=np.uint8)

    def pass_of(q: int):
        def run():
            target.score(block[:q], features=True)
            target.rollback(target.cache_length - q)
        return run

    def stream():
        junk.sum()  # reads 256 MB

    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        row = {"torch_threads": threads, "target_pass_1_ms": timed(pass_of(1)), "target_pass_8_ms": timed(pass_of(8)),
               "draft_warm_ms": timed(lambda: drafter.draft(ids[-1], 7, GREEDY, None)),
               "draft_after_target_pass_ms": draft_after(pass_of(8), drafter, ids[-1]),
               "draft_after_256MB_stream_ms": draft_after(stream, drafter, ids[-1])}
        row["draft_in_loop_share_of_one_token_step"] = round(row["draft_after_target_pass_ms"] / row["target_pass_1_ms"], 3)
        rows.append(row)
        print(row, flush=True)
    cpu = cpu_description()[0]
    (HERE / "draft_cost.json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))
    keys = list(rows[0])
    lines = [f"# One draft on the llama.cpp backend ({cpu}, llama.cpp on 2 threads, Q4_1, 300 tokens of context)",
             "", "`docs/results/llamacpp/draft_cost.py`; medians of 60, milliseconds.", "",
             "| " + " | ".join(k.replace("_", " ") for k in keys) + " |", "|" + "---:|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    (HERE / "draft_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
