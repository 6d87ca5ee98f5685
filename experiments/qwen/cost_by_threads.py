"""c(q) of qwen2.5-coder-1.5b (Q4_K_M) on llama.cpp at 1 and 2 threads: the cost of one q-token target pass
after ~300 tokens of context, q = 1, 2, 4, 8, 16, the median of 5 rounds (calibration.measure_target, which
times every q in rounds and c(1) between them). Writes cost_by_threads.{json,md} beside this file.

    PYTHONPATH=$PWD /work/shared/bin/heavy /work/main/.venv/bin/python experiments/qwen/cost_by_threads.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from hyflash.calibration import measure_target
from hyflash.files import atomic_write_bytes, atomic_write_json
from hyflash.machine import cpu_description
from hyflash.targets.llamacpp import LlamaCppTarget

MODEL, CONTEXT, REPS, QS = "qwen2.5-coder-1.5b", 300, 5, (1, 2, 4, 8, 16)
HERE = Path(__file__).resolve().parent


def main(threads_list=(1, 2)) -> None:
    rows = {}
    for threads in threads_list:
        target = LlamaCppTarget.load(MODEL, record_features=False, n_threads=threads)
        ms = measure_target(target, contexts=(CONTEXT,), max_q=max(QS), reps=REPS, features=False)[0]
        rows[threads] = {"cache_types": list(target.cache_types), "ms": {q: ms[q - 1] for q in QS}}
        print(threads, rows[threads], flush=True)
        del target
    atomic_write_json(HERE / "cost_by_threads.json", {"model": MODEL, "context": CONTEXT, "reps": REPS,
                                                      "cpu": cpu_description()[0], "threads": rows})
    head = "| threads | c(1) | " + " | ".join(f"c({q})/c(1)" for q in QS[1:]) + " | tokens per c(1) at q=16 |"
    lines = [head, "|---:|" + "---:|" * (len(QS) + 1)]
    for threads, row in rows.items():
        c1 = row["ms"][1]
        lines.append(f"| {threads} | {c1:.1f} ms | " + " | ".join(f"{row['ms'][q] / c1:.2f}×" for q in QS[1:])
                     + f" | {16 * c1 / row['ms'][16]:.2f} |")
    text = (f"c(q) of {MODEL} Q4_K_M on llama.cpp, {CONTEXT} tokens of context, median of {REPS} rounds; "
            f"{cpu_description()[0]}; KV cache {rows[threads_list[0]]['cache_types']}\n\n" + "\n".join(lines) + "\n")
    atomic_write_bytes(HERE / "cost_by_threads.md", text.encode())
    print(text)


if __name__ == "__main__":
    main(tuple(int(x) for x in sys.argv[1:]) or (1, 2))
