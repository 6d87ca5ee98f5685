"""The never-slower suite's summary from its two bench folders: results.json, results.md, ratio_vs_context.png.

    python -m experiments.never_slower.summarize RUNS_DIR OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from hyflash.bench.report import prompt_ratios, ratio_summary
from hyflash.files import atomic_write_bytes, atomic_write_json

METHOD = "default"
BACKENDS = ("transformers", "llama.cpp")


def summarize(runs: Path, out: Path) -> dict:
    summary = {"method": METHOD, "backends": {}}
    for backend in BACKENDS:
        path = runs / backend / "results.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())
        rows = prompt_ratios(results, METHOD)
        meta = results["meta"]
        summary["backends"][backend] = {
            "cpu": meta["machine"]["cpu_model"], "threads": meta["machine"]["torch_threads"],
            "precision": meta.get("dtype"), "command": meta["command"], "date": meta["date"],
            "overall": ratio_summary(rows),
            "by_temperature": {str(t): ratio_summary([r for r in rows if r["temperature"] == t])
                               for t in sorted({r["temperature"] for r in rows})},
            "prompts": rows,
            "plain_repeat_spread": plain_repeat_spread(results),
        }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", summary)
    atomic_write_bytes(out / "results.md", markdown(summary).encode())
    plot(summary, out / "ratio_vs_context.png")
    return summary


def plain_repeat_spread(results: dict) -> dict | None:
    """How much plain decoding's own timings of one prompt differ across its repeats (max / min - 1): the run's
    noise, against which a ratio's distance from 1.0 has to be read. Median and largest over the prompts."""
    spreads = [max(t) / min(t) - 1 for r in results["runs"] if r["method"] == "plain"
               for t in [r.get("decode_times") or []] if len(t) > 1 and min(t) > 0]
    if not spreads:
        return None
    return {"median": statistics.median(spreads), "max": max(spreads), "prompts": len(spreads)}


def _n(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def markdown(summary: dict) -> str:
    lines = ["# Never slower than plain decoding: the suite (issue 36)", ""]
    for backend, b in summary["backends"].items():
        o = b["overall"]
        lines += [f"## {backend} ({b['precision']}), {b['cpu']}, {b['threads']} threads, {b['date']}", "",
                  f"Command: `{b['command']}`", "",
                  f"**min {_n(o['min_ratio'], '.2f')}x, median {_n(o['median_ratio'], '.2f')}x** over "
                  f"{o['prompts']} prompt runs; median ceiling {_n(o['median_ceiling'], '.2f')}x, median share of "
                  f"its margin taken {_n(o['median_ceiling_share'], '.0%')}", "",
                  "Ratio: the median of the repeats' paired ratios (`--repeats`: plain's i-th timing against the "
                  "default's i-th, run next to each other; their range beside it); the ratio of the two methods' "
                  "median timings beside that.", ""]
        noise = b.get("plain_repeat_spread")
        if noise:
            lines += [f"Noise: plain decoding's own {noise['prompts']} sets of repeats differ from fastest to slowest by "
                      f"{noise['median']:.1%} at the median prompt and up to {noise['max']:.1%}.", ""]
        lines += ["| T | prompt | context | ratio | per repeat | of medians | tau | ceiling | fall-backs | budget pauses | greedy text = plain |",
                  "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
        for r in b["prompts"]:
            same = "–" if r["identical_to_plain"] is None else ("yes" if r["identical_to_plain"] else "**no**")
            spread = r.get("repeat_ratios") or []
            spread = f"{min(spread):.2f}–{max(spread):.2f}" if len(spread) > 1 else "–"
            lines.append(f"| {r['temperature']} | {r['item_id']} | {r['prompt_tokens']} | {r['ratio']:.2f} | {spread} | "
                         f"{_n(r.get('ratio_of_medians'), '.2f')} | "
                         f"{r['tau']:.2f} | {_n(r['speedup_ceiling'], '.2f')} | {_n(r['fallbacks'], 'd')} | {_n(r.get('budget_pauses'), 'd')} | {same} |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    colors = {"transformers": "tab:blue", "llama.cpp": "tab:orange"}
    markers = {"prose": "o", "code": "s", "chat": "^"}
    for backend, b in summary["backends"].items():
        for r in b["prompts"]:
            ax.scatter(r["prompt_tokens"], r["ratio"], color=colors[backend], marker=markers.get(r["kind"], "x"),
                       facecolors="none" if r["temperature"] else colors[backend])
    for backend in summary["backends"]:  # only the backends this summary holds (a one-backend run names one)
        ax.scatter([], [], color=colors[backend], label=backend)
    for kind, marker in markers.items():
        ax.scatter([], [], color="gray", marker=marker, label=kind)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(0.95, color="red", lw=0.8, ls="--", label="0.95 bar")
    ax.set_xscale("log")
    ax.set_xlabel("prompt tokens (filled: greedy, hollow: T = 0.7)")
    ax.set_ylabel("decode speed / plain decoding")
    cpu = next(iter(summary["backends"].values()), {}).get("cpu", "?")
    ax.set_title(f"--drafter default vs plain, same run, on {cpu}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    summarize(Path(sys.argv[1]), Path(sys.argv[2]))
