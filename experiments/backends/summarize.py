"""Table of the same drafter's tau on each backend's features (tau.sh's bench folders): tau.md, tau.json.

    .venv/bin/python experiments/backends/summarize.py experiments/backends
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BACKENDS = {"transformers-fp32": "transformers, float32", "transformers-bf16": "transformers, bfloat16",
            "llamacpp-q4_1": "llama.cpp, Q4_1 (as shipped)", "llamacpp-f16": "llama.cpp, F16"}


def main(root: Path) -> None:
    table: dict[str, dict[str, dict[str, float]]] = {}
    cpu = ""
    for folder, label in BACKENDS.items():
        path = root / folder / "results.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())
        cpu = cpu or results["meta"]["machine"].get("cpu_model", "")  # older bench files lack it
        for run in results["runs"]:
            if run["method"] == "plain" or run["temperature"] != 0:
                continue
            table.setdefault(run["method"], {}).setdefault(label, {}).setdefault(run["set"], []).append(run["tau"])
    out = {m: {b: {s: round(statistics.mean(v), 3) for s, v in sets.items()} for b, sets in per.items()}
           for m, per in table.items()}
    (root / "tau.json").write_text(json.dumps({"cpu": cpu, "tau_mean": out}, indent=1))
    lines = [f"# One drafter, two backends' features: greedy tau, every draft verified in full ({cpu})", "",
             "`experiments/backends/tau.sh` (6 prompts per set, 64 new tokens, `--no-adaptive`).", ""]
    for method, per in out.items():
        sets = sorted({s for v in per.values() for s in v})
        lines += [f"## drafter `{method}`", "", "| features from | " + " | ".join(sets) + " | mean |",
                  "|---|" + "---:|" * (len(sets) + 1)]
        for backend, taus in per.items():
            vals = [taus.get(s) for s in sets]
            mean = statistics.mean(v for v in vals if v is not None)
            lines.append(f"| {backend} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in vals) + f" | {mean:.2f} |")
        lines.append("")
    (root / "tau.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/backends"))
