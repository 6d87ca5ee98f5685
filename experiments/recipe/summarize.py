"""Table of the recipe sweep (experiments/recipe/sweep.sh): held-out tau, acceptance by slot, cost per run.

usage: python experiments/recipe/summarize.py runs/recipe   -> experiments/recipe/{results.json,table.md}
"""

import json
import sys
from pathlib import Path

from hyflash.files import atomic_write_json, atomic_write_text, read_jsonl

LEVERS = {
    "base": "CE, exp slot weights, random init, depth 1, block 8, draft vocabulary 16,384",
    "kl": "soft-label KL to the target instead of CE",
    "init-target": "layers initialised from the target's last layer",
    "depth2": "2 drafter layers",
    "block16": "block 16 (gamma 7)",
    "survival": "prefix-survival slot weights",
    "vocab8k": "draft vocabulary 8,192",
    "window256": "local window 256 instead of 64 (not an issue lever: chat answers copy from the prompt)",
}


def read_run(folder: Path) -> dict | None:
    log = folder / "log.jsonl"
    if not log.exists():
        return None
    records = read_jsonl(log)
    evals = [r for r in records if "eval" in r]
    steps = [r for r in records if "loss" in r]
    if not evals:
        return None
    config = json.loads((folder / "train_config.json").read_text())
    wall = folder / "wall_seconds"
    return {
        "tau": evals[-1]["eval"]["tau"],
        "acceptance_by_position": evals[-1]["eval"]["acceptance_by_position"],
        "train_expected_tau": steps[-1]["expected_tau"],
        "train_loss": steps[-1]["loss"],
        "steps": steps[-1]["step"],
        "tokens_seen": steps[-1]["tokens_seen"],
        "mean_seconds_per_step": sum(r["seconds_per_step"] for r in steps) / len(steps),
        "wall_seconds": int(wall.read_text()) if wall.exists() else None,
        "trainable_params": config["trainable_params"],
    }


def main(root: str) -> None:
    runs = {name: r for name in LEVERS if (r := read_run(Path(root) / name))}
    here = Path(__file__).parent
    atomic_write_json(here / "results.json", runs)
    base = runs.get("base", {}).get("tau")
    lines = ["| run | lever | held-out τ | vs base | acceptance by slot (1-4) | train τ (last batch) | s/step | params |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        acc = ", ".join(f"{a:.2f}" for a in r["acceptance_by_position"][:4])
        ratio = f"{r['tau'] / base:.3f}×" if base else "–"
        lines.append(f"| {name} | {LEVERS[name]} | {r['tau']:.3f} | {ratio} | {acc} | {r['train_expected_tau']:.2f} | "
                     f"{r['mean_seconds_per_step']:.2f} | {r['trainable_params'] / 1e6:.1f} M |")
    atomic_write_text(here / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/recipe")
