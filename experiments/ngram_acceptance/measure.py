"""How often the n-gram lookup's draft is accepted, by match length and slot, on the target's own greedy text.

For every position of the target-written (greedy) part of `hyflash data` sequences, the n-gram drafter's draft
(the continuation of the most recent earlier occurrence of the longest recurring suffix, up to 3 tokens: the
drafter's default) is compared with what the target wrote next: slot j counts as reached when slots 1..j-1
matched, and accepted when it matches too (greedy verification accepts exactly the matching prefix). The
result, P(slot j accepted | reached, match length n), is what NgramDrafter reports as its confidence: the
policy's prior for a draft it has not yet seen verified.

    .venv/bin/python -m experiments.ngram_acceptance.measure data/smollm2-135m/train-v3 data/smollm2-135m/long-v1

Writes acceptance.json and acceptance.md beside this file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from hyflash.drafters.copy import suffix_match
from hyflash.files import atomic_write_bytes, atomic_write_json

HERE = Path(__file__).resolve().parent
MAX_NGRAM, SLOTS = 3, 7


def sequences(folder: Path):
    """(tokens, index where the target's own writing starts) of every greedy sequence in a data folder."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for shard in manifest["shards"]:
        data = load_file(folder / shard["file"])
        offsets, tokens = data["offsets"].tolist(), data["tokens"].long()
        for i, (start, end) in enumerate(zip(offsets, offsets[1:])):
            if not int(data["sampled"][i]):
                yield tokens[start:end], int(data["gen_start"][i])


def count(folders: list[Path], limit: int) -> tuple[list[list[int]], list[list[int]], int]:
    reached = [[0] * SLOTS for _ in range(MAX_NGRAM + 1)]
    accepted = [[0] * SLOTS for _ in range(MAX_NGRAM + 1)]
    positions = 0
    for folder in folders:
        for seq, gen_start in sequences(folder):
            for p in range(max(gen_start - 1, 1), len(seq) - 1):
                if positions >= limit:
                    return reached, accepted, positions
                positions += 1
                start, n = suffix_match(seq[: p + 1], MAX_NGRAM)
                if not n:
                    continue
                draft, truth = seq[start : min(start + SLOTS, p + 1)], seq[p + 1 : p + 1 + SLOTS]
                for j, (d, t) in enumerate(zip(draft.tolist(), truth.tolist())):
                    reached[n][j] += 1
                    if d != t:
                        break
                    accepted[n][j] += 1
    return reached, accepted, positions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--positions", type=int, default=60000, help="target-written positions to look at")
    args = parser.parse_args()
    reached, accepted, positions = count(args.folders, args.positions)
    rate = [[round(a / r, 3) if r else None for a, r in zip(accepted[n], reached[n])] for n in range(MAX_NGRAM + 1)]
    atomic_write_json(HERE / "acceptance.json", {"folders": [str(f) for f in args.folders], "positions": positions,
                                                  "reached": reached, "accepted": accepted, "acceptance": rate})
    lines = [f"n-gram draft acceptance on the target's greedy text ({positions} positions of "
             f"{', '.join(str(f) for f in args.folders)}): P(slot j accepted | reached), by match length n", "",
             "| n | " + " | ".join(f"slot {j + 1}" for j in range(SLOTS)) + " | drafts |",
             "|---:|" + "---:|" * (SLOTS + 1)]
    for n in range(1, MAX_NGRAM + 1):
        cells = [f"{r:.2f}" if r is not None else "–" for r in rate[n]]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {reached[n][0]} |")
    text = "\n".join(lines) + "\n"
    atomic_write_bytes(HERE / "acceptance.md", text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
