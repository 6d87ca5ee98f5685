"""How far a copy is right, by how far its context agrees: the evidence behind the copy input's match length.

For every position of a bench run's plain (greedy) texts it takes the n-gram lookup's copy (the most recent
earlier occurrence of the longest recurring suffix of up to --max-ngram tokens, hyflash.drafters.copy), counts
how many tokens the context before that occurrence agrees with the context before the position, reading
backwards (the "agreement", uncapped), and how many of the copy's next --slots tokens the target then wrote (the
accepted run). The table gives the mean run and P(run >= 1), P(run >= 4) per agreement bucket. No model runs:
only the tokenizer (to rebuild the prompts) and the token ids in results.json.

usage: python experiments/drafter-copy-2/copy_agreement.py experiments/drafter-copy-2/bench/results.json [--sets prose,code]
           [--max-ngram 3] [--slots 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

BUCKETS = ((1, "1"), (2, "2"), (3, "3"), (4, "4-7"), (8, "8-15"), (16, "16+"))


def bucket(agreement: int) -> str:
    return [name for low, name in BUCKETS if agreement >= low][-1]


def copy_runs(prompt: list[int], text: list[int], max_ngram: int, slots: int) -> list[tuple[int, int]]:
    """(agreement, accepted run) at every position of `text` where the lookup has a copy."""
    import torch

    from hyflash.drafters.copy import suffix_match

    out = []
    for i in range(len(text)):
        context = torch.tensor(prompt + text[:i])
        start, n = suffix_match(context, max_ngram)
        if not n:
            continue
        agreement = 0
        while agreement < start and context[start - 1 - agreement] == context[-1 - agreement]:
            agreement += 1
        run = 0
        while (run < slots and start + run < len(context) and i + run < len(text)
               and int(context[start + run]) == text[i + run]):
            run += 1
        out.append((agreement, run))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a bench run's results.json (its plain records hold the texts)")
    p.add_argument("--sets", default="prose,code")
    p.add_argument("--max-ngram", type=int, default=3)
    p.add_argument("--slots", type=int, default=7)
    p.add_argument("--out", type=Path, help="also write the table as JSON here")
    args = p.parse_args(argv)

    from hyflash.bench.datasets import load_set
    from hyflash.targets import HFTarget

    results = json.loads(args.results.read_text())
    config = results["meta"]["config"]
    target = HFTarget.load(results["meta"]["target"], dtype="float32")
    table = {}
    print("| set | agreement | positions | mean accepted run | P(run >= 1) | P(run >= 4) |\n|---|---|---:|---:|---:|---:|")
    for name in args.sets.split(","):
        prompts = load_set(name, target, config["n"], config["max_new_tokens"])
        texts = {r["item_id"]: r["tokens"] for r in results["runs"]
                 if r["set"] == name and r["method"] == "plain" and r["temperature"] == 0}
        runs = defaultdict(list)
        for prompt in prompts:
            for agreement, run in copy_runs(list(prompt.ids), texts[prompt.item_id], args.max_ngram, args.slots):
                runs[bucket(agreement)].append(run)
        table[name] = {}
        for _, key in BUCKETS:
            if runs[key]:
                r = runs[key]
                row = {"positions": len(r), "mean_run": sum(r) / len(r),
                       "p_run_ge_1": sum(x >= 1 for x in r) / len(r), "p_run_ge_4": sum(x >= 4 for x in r) / len(r)}
                table[name][key] = row
                print(f"| {name} | {key} | {row['positions']} | {row['mean_run']:.2f} | {row['p_run_ge_1']:.2f} | "
                      f"{row['p_run_ge_4']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
