"""Per prompt of a `hyflash bench --repeats N` folder: `default`'s decode speed over hyflash plain's and over
llama-cpp-python's own plain loop, each the median of the repeats' paired ratios (`hyflash.bench.report.prompt_ratios`;
issue 37's bar reads the latter). Prints a markdown table and the min / median per temperature.

    python experiments/qwen/paired_ratios.py experiments/qwen/default-vs-plain/results.json
"""

import json
import statistics
import sys

from hyflash.bench.report import prompt_ratios

METHOD = "default"
BASELINES = ("plain", "llamacpp-plain")


def rows(results: dict) -> list[dict]:
    """One row per (temperature, prompt) that has every baseline: prompt_ratios' row against the first, with each
    baseline's ratio and repeat ratios under its name."""
    by_baseline = [{(r["temperature"], r["set"], r["item_id"]): r for r in prompt_ratios(results, METHOD, b)}
                   for b in BASELINES]
    out = []
    for key in sorted(set.intersection(*(set(rows) for rows in by_baseline))):
        row = dict(by_baseline[0][key])
        for baseline, table in zip(BASELINES, by_baseline):
            row[baseline] = (table[key]["ratio"], min(table[key]["repeat_ratios"]), max(table[key]["repeat_ratios"]))
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| T | set | prompt | τ | × hyflash plain | repeats | × llama.cpp plain | repeats | text = plain |",
             "|---:|---|---|---:|---:|---|---:|---|---|"]
    for r in table:
        cells = [f"{r[b][0]:.2f} | {r[b][1]:.2f}–{r[b][2]:.2f}" for b in BASELINES]
        lines.append(f"| {r['temperature']:g} | {r['set']} | {r['item_id'][:28]} | {r['tau']:.2f} | {cells[0]} | "
                     f"{cells[1]} | {r['identical_to_plain']} |")
    for t in sorted({r["temperature"] for r in table}):
        at = [r for r in table if r["temperature"] == t]
        summary = "; ".join(f"× {b}: min {min(r[b][0] for r in at):.2f}, median "
                            f"{statistics.median(r[b][0] for r in at):.2f}" for b in BASELINES)
        lines.append(f"\nT = {t:g}, {len(at)} prompts: {summary}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/qwen/paired_ratios.py BENCH_FOLDER/results.json")
    with open(sys.argv[1], encoding="utf-8") as f:
        print(markdown(rows(json.load(f))))
