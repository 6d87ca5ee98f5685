"""Held-out tau against training tokens seen (log x): the drafter-v2 run (continued from the shipped drafter)
and the from-scratch base run of the recipe sweep. Writes scaling.{json,png} next to this file.

usage: .venv/bin/python docs/results/drafter-v2/scaling.py [runs/drafter-v2] [runs/recipe/base]
"""

import json
import sys
from pathlib import Path


def curve(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    seen = {r["step"]: r["tokens_seen"] for r in records if "tokens_seen" in r}
    points = []
    for r in records:
        if "eval" in r:
            step = r["step"]
            # tokens_seen is logged every few steps: take the nearest logged step at or after this one
            later = [s for s in seen if s >= step]
            tokens = seen[min(later)] * step / min(later) if later else None
            points.append({"step": step, "tokens_seen": tokens, "tau": r["eval"]["tau"],
                           "acceptance_by_position": r["eval"]["acceptance_by_position"]})
    return points


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"drafter-v2 (from the shipped drafter)": Path(sys.argv[1] if len(sys.argv) > 1 else "runs/drafter-v2"),
            "from scratch (recipe base)": Path(sys.argv[2] if len(sys.argv) > 2 else "runs/recipe/base")}
    out = {name: curve(path) for name, path in runs.items() if (path / "log.jsonl").exists()}
    here = Path(__file__).parent
    (here / "scaling.json").write_text(json.dumps(out, indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in out.items():
        xs = [p["tokens_seen"] for p in points if p["tokens_seen"]]
        ys = [p["tau"] for p in points if p["tokens_seen"]]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens seen in the run (sequence tokens, log scale)")
    ax.set_ylabel("held-out τ (12 chat prompts, greedy, bf16)")
    ax.set_title("SmolLM2-135M drafter: held-out τ vs training tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(here / "scaling.png", dpi=120)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
