"""What the eval callback costs a llama.cpp pass: through the C gate, through the Python callback, and with no
callback at all (SmolLM2-135M Q4_1, 2 threads; contexts 300 and 1,500; one- and 4-token passes, with and without
recording features). Medians of 40 passes per cell, the three targets interleaved round by round.

    ../shared/bin/heavy .venv/bin/python -m experiments.llamacpp.eval_gate_cost   (about a minute)

Writes experiments/llamacpp/eval_gate_cost.json and .md.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
from pathlib import Path

from hyflash.files import atomic_write_json, atomic_write_text
from hyflash.targets.llamacpp import LlamaCppTarget

OUT = Path(__file__).with_name("eval_gate_cost")


def cpu_name() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    targets = {"C gate": LlamaCppTarget.load("smollm2-135m", n_threads=2, eval_gate=True),
               "Python callback": LlamaCppTarget.load("smollm2-135m", n_threads=2, eval_gate=False),
               "no callback": LlamaCppTarget.load("smollm2-135m", n_threads=2, record_features=False)}
    base = targets["C gate"].encode_prompt("Explain photosynthesis in detail, with the chemistry. " * 150)
    rows = []
    for context in (300, 1500):
        ids = base[:context]
        times: dict[tuple, list[float]] = {}
        for _ in range(5):
            for name, target in targets.items():
                target.reset()
                target.prefill(ids, features=target.record_features)
                for features in ((False, True) if target.record_features else (False,)):
                    for q in (1, 4):
                        for _ in range(8):
                            n = target.cache_length
                            start = time.perf_counter()
                            target.score(ids[:q], features=features)
                            times.setdefault((name, features, q), []).append(1000 * (time.perf_counter() - start))
                            target.rollback(n)
        rows += [{"context": context, "callback": name, "features": features, "q": q,
                  "median_ms": round(statistics.median(v), 3)} for (name, features, q), v in times.items()]
    result = {"cpu": cpu_name(), "threads": 2, "model": "smollm2-135m Q4_1", "rows": rows}
    atomic_write_json(OUT.with_suffix(".json"), result)
    lines = [f"# The eval callback's cost per llama.cpp pass ({result['cpu']}, 2 threads)", "",
             "| context | callback | recording features | q | median ms |", "|---:|---|---|---:|---:|"]
    lines += [f"| {r['context']} | {r['callback']} | {'yes' if r['features'] else 'no'} | {r['q']} | {r['median_ms']:.2f} |"
              for r in rows]
    atomic_write_text(OUT.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
