"""Per prompt of a `hyflash bench --repeats N` folder: `default`'s decode speed over hyflash plain's and over
llama-cpp-python's own plain loop, each the median of the repeats' paired ratios (issue 37's bar reads the latter).
Prints a markdown table and the min / median per temperature.

    python experiments/qwen/paired_ratios.py experiments/qwen/default-vs-plain/results.json
"""

import json
import statistics
import sys

METHOD = "default"
BASELINES = ("plain", "llamacpp-plain")


def paired_ratio(run: dict, baseline: dict) -> tuple[float, float, float]:
    """(median, min, max) over the repeats of the baseline's i-th decode time over the method's i-th, per token."""
    pairs = [b / r * run["new_tokens"] / baseline["new_tokens"]
             for b, r in zip(baseline["decode_times"], run["decode_times"]) if r > 0]
    return statistics.median(pairs), min(pairs), max(pairs)


def rows(results: dict) -> list[dict]:
    runs = {(r["temperature"], r["set"], r["item_id"], r["method"]): r for r in results["runs"]}
    out = []
    for (temperature, set_name, item, method), run in sorted(runs.items()):
        bases = [runs.get((temperature, set_name, item, b)) for b in BASELINES]
        if method != METHOD or None in bases:
            continue
        out.append({"temperature": temperature, "set": set_name, "item": item, "tau": run["tau"],
                    "identical_to_plain": run.get("identical_to_plain"),
                    **{b: paired_ratio(run, base) for b, base in zip(BASELINES, bases)}})
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| T | set | prompt | τ | × hyflash plain | repeats | × llama.cpp plain | repeats | text = plain |",
             "|---:|---|---|---:|---:|---|---:|---|---|"]
    for r in table:
        cells = [f"{r[b][0]:.2f} | {r[b][1]:.2f}–{r[b][2]:.2f}" for b in BASELINES]
        lines.append(f"| {r['temperature']:g} | {r['set']} | {r['item'][:28]} | {r['tau']:.2f} | {cells[0]} | "
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
