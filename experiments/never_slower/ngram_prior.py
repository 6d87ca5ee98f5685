"""How often the n-gram lookup's drafts are accepted, by matched suffix length n and draft slot (issue 36).

Replays the lookup over target-written greedy continuations (`hyflash data` folders: the text after each prompt,
decoded by the target itself): at each step it drafts the 7 tokens after the longest recent match of the suffix
(up to --max-ngram tokens), the known continuation says how many are accepted, and the walk moves past them and
the correction, as the decode loop does. Counts P(slot j accepted | slot j reached) per (n, j), the quantity the
policy's calibrator estimates online, whose prior the lookup's confidence is (hyflash/drafters/ngram.py).

    python -m experiments.never_slower.ngram_prior data/smollm2-135m/train-v2 [more folders] --out experiments/never_slower

Writes ngram_prior.json (counts and rates per folder and pooled) and ngram_prior.md.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from hyflash.drafters.copy import TokenHistory
from hyflash.files import atomic_write_json, atomic_write_text
from hyflash.training.data import TokenDataset

SLOTS = 7


def count(folder: Path, max_ngram: int) -> tuple[Counter, Counter, int]:
    """(reached, accepted) counts per (n, slot index) over the folder's greedy sequences, and their number."""
    reached, accepted, sequences = Counter(), Counter(), 0
    data = TokenDataset(folder)
    for sequence, start, sampled in zip(data.sequences, data.gen_start, data.sampled):
        if sampled or len(sequence) - start < 2:
            continue
        sequences += 1
        history = TokenHistory()
        history.extend(sequence[: start - 1])
        p = start - 1  # sequence[p] is the verified token the next draft follows
        while p < len(sequence) - 1:
            begin, n = history.match(int(sequence[p]), max_ngram)
            a = 0
            if n:
                draft = history.continuation(begin, int(sequence[p]), min(SLOTS, len(sequence) - 1 - p))
                truth = sequence[p + 1 : p + 1 + len(draft)]
                while a < len(draft) and draft[a] == truth[a]:
                    a += 1
                for j in range(min(len(draft), a + 1)):
                    reached[n, j] += 1
                    accepted[n, j] += int(j < a)
            history.extend(sequence[p : p + a + 1])
            p += a + 1
    return reached, accepted, sequences


def rates(reached: Counter, accepted: Counter, max_ngram: int) -> list[list[float | None]]:
    return [[round(accepted[n, j] / reached[n, j], 3) if reached[n, j] else None for j in range(SLOTS)]
            for n in range(1, max_ngram + 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--max-ngram", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("experiments/never_slower"))
    args = parser.parse_args()
    pooled_reached, pooled_accepted, report = Counter(), Counter(), {"max_ngram": args.max_ngram, "folders": {}}
    for folder in args.folders:
        reached, accepted, sequences = count(folder, args.max_ngram)
        pooled_reached.update(reached)
        pooled_accepted.update(accepted)
        report["folders"][str(folder)] = {"sequences": sequences, "rates": rates(reached, accepted, args.max_ngram),
                                          "first_slot_drafts": [reached[n, 0] for n in range(1, args.max_ngram + 1)]}
    report["pooled"] = rates(pooled_reached, pooled_accepted, args.max_ngram)
    report["pooled_first_slot_drafts"] = [pooled_reached[n, 0] for n in range(1, args.max_ngram + 1)]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "ngram_prior.json", report)
    lines = ["# The n-gram lookup's acceptance by matched suffix length and slot", "",
             f"`python -m experiments.never_slower.ngram_prior {' '.join(map(str, args.folders))}`: "
             "P(slot j accepted | slot j reached) over target-written greedy continuations, pooled "
             f"(n = {args.max_ngram} counts matches of {args.max_ngram} or more tokens).", "",
             "| n | drafts | " + " | ".join(f"slot {j + 1}" for j in range(SLOTS)) + " |",
             "|---:|---:|" + "---:|" * SLOTS]
    for n, row in enumerate(report["pooled"], start=1):
        cells = " | ".join("–" if x is None else f"{x:.2f}" for x in row)
        lines.append(f"| {n} | {report['pooled_first_slot_drafts'][n - 1]} | {cells} |")
    lines += ["", "Slot 1 per folder:", ""]
    for folder, entry in report["folders"].items():
        first = ", ".join("–" if r[0] is None else f"{r[0]:.2f}" for r in entry["rates"])
        lines.append(f"- `{folder}` ({entry['sequences']} sequences): {first}")
    atomic_write_text(args.out / "ngram_prior.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
