"""Claims of the kinds grid without the copy input (issue 41), beside the copy grid (issue 17), with the noise rule
and a paired per-prompt bootstrap; draft memory and draft time per context; τ against context with and without
the copy input.

usage: python experiments/kinds/summarize_nocopy.py BENCH [BENCH ...] [--copy BENCH ...] [--out DIR]
                                                       [--anchor-context FILE]

BENCH: `hyflash bench` folders (or results.json) of the no-copy grid, drafters named KIND-dDEPTH-sSEED. They may
split the grid by set and by temperature (experiments/kinds/kinds_nocopy_gpu.sh runs one bench per set and temperature, in
parallel): their records are pooled, and every other setting (target, dtype, lengths, seed) must agree. A bench
stopped by a deadline counts with the prompts it finished. --copy: the copy grid's benches (default: the committed
experiments/kinds/grid/bench and bench-d2). Writes into DIR (default: the first BENCH's folder):

  summary.json    {kind-depth: {set: {"tau_mean", "tau_seeds"}}}: greedy τ as summarize.py writes it
  claims.json     the claims of both grids (statistic, noise, verdict, bootstrap interval), the draft memory and
                  time per context, prompts and greedy outputs equal to plain decoding per set
  claims.md       the same as tables (T = 1 too when the benches sampled)
  tau_vs_context_nocopy.png   greedy τ against context per kind-depth, solid without, dashed with the copy input
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # summarize.py beside this file (they move together)

import summarize  # noqa: E402
from summarize import SEED_NAME, summary, table_lines, tau_with_seed_range, verdict  # noqa: E402

from hyflash.bench.datasets import SETS  # noqa: E402
from hyflash.bench.run import settings_differ  # noqa: E402
from hyflash.drafters.config import KINDS  # noqa: E402
from hyflash.errors import HyflashError  # noqa: E402
from hyflash.files import atomic_write_json, atomic_write_text  # noqa: E402

PLOT = "tau_vs_context_nocopy.png"
COPY_BENCHES = [HERE / "grid" / "bench", HERE / "grid" / "bench-d2"]
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 2000, 0
# Which sets each claim reads. The no-copy grid trains with --max-length 4096: ctx-4k is the longest context
# inside the training length, ctx-6k and ctx-8k lie beyond it (positions a full-context drafter never saw). The
# copy grid trained with the same length: its long-8k is beyond it too.
GRIDS = {
    "no copy input": {"short": "ctx-1k", "long": "ctx-4k", "beyond": ("ctx-6k", "ctx-8k")},
    "copy input": {"short": "code", "long": "long-4k", "beyond": ("long-8k",)},
}
# Settings the split benches may differ in; `replay` too: the greedy round replays, T = 1 decodes (each record says
# which it was, `replayed`).
SPLIT_SETTINGS = ("sets", "temperatures", "memory_contexts", "sweep_kinds", "sweep_depths", "threads", "device",
                  "replay")


# ----- reading ---------------------------------------------------------------------------------------------------
def pooled(paths: list) -> dict:
    """One results dict from benches that split one grid by set and temperature (their records side by side)."""
    benches = [summarize.load_results(p) for p in paths]
    (first, folder), runs, meta_drafters, sweep, params, errors = benches[0], [], {}, {}, {}, {}
    for results, where in benches:
        differ = [k for k in settings_differ(first["meta"], results["meta"]) if k not in SPLIT_SETTINGS]
        if differ:
            raise HyflashError(f"{where} was benched with other settings than {folder} ({', '.join(differ)}): "
                               "bench the grid with the same ones")
        runs += results["runs"]
        meta_drafters.update(results["meta"].get("drafters") or {})
        sweep.update(results.get("memory_sweep") or {})
        params.update(results.get("drafter_params") or {})
        errors.update(results.get("errors") or {})
    meta = {**first["meta"], "drafters": meta_drafters,
            "benches": [{"folder": str(w), "command": r["meta"].get("command", "?")} for r, w in benches]}
    return {"meta": meta, "runs": runs, "memory_sweep": sweep, "drafter_params": params, "errors": errors}


def per_prompt(results: dict, temperature: float) -> dict:
    """{kind-depth: {set: {item_id: τ averaged over the seeds that ran it}}} for the seed runs."""
    taus: dict = {}
    for r in results["runs"]:
        m = SEED_NAME.match(r.get("method", ""))
        if not m or float(r["temperature"]) != temperature or not math.isfinite(float(r["tau"])):
            continue
        key = f"{m['kind']}-d{m['depth']}"
        taus.setdefault(key, {}).setdefault(r["set"], {}).setdefault(r["item_id"], []).append(float(r["tau"]))
    return {k: {s: {i: sum(v) / len(v) for i, v in items.items()} for s, items in by_set.items()}
            for k, by_set in taus.items()}


# ----- claims ----------------------------------------------------------------------------------------------------
def claim_terms(sets: list[str], grid: dict) -> list[tuple[str, str, list[tuple[float, str, str]]]]:
    """(claim, what, terms): each claim's statistic as a weighted sum of cells, terms (weight, kind-depth, set)."""
    def gain(depth: int, set_names, weight: float = 1.0) -> list:
        w = weight / len(set_names)
        return [t for s in set_names for t in ((w, f"hyflash-d{depth}", s), (-w, f"full-d{depth}", s))]

    beyond = [s for s in grid["beyond"] if s in sets]
    return [
        ("(a) hyflash has a higher τ than full at equal parameters (depth 1)",
         f"mean over the {len(sets)} sets of τ(hyflash-d1) − τ(full-d1)", gain(1, sets)),
        ("(b) the gain of hyflash over full is larger at depth 1 than at depth 2",
         "gain(d1) − gain(d2), gain = mean over sets of τ(hyflash) − τ(full)", gain(1, sets) + gain(2, sets, -1.0)),
        (f"(c) the gain is larger at long context ({grid['long']}) than at {grid['short']} (depth 1)",
         f"gain on {grid['long']} − gain on {grid['short']}", gain(1, [grid["long"]]) + gain(1, [grid["short"]], -1.0)),
        (f"(d) hyflash above full beyond the training length ({', '.join(beyond) or '–'}, depth 1)",
         f"mean gain over {', '.join(beyond) or 'no set'}", gain(1, beyond) if beyond else []),
    ]


def bootstrap(terms: list, prompts: dict) -> tuple[float | None, float | None, int]:
    """Paired per-prompt bootstrap 95% interval of a claim's statistic: prompts are resampled with the same draw
    for every kind (paired), and jointly across sets whose prompts share their ids (the ctx sets: one cut point,
    one continuation), else set by set. Returns (low, high, prompts used)."""
    sets = sorted({s for _, _, s in terms})
    items = {}
    for s in sets:
        shared = [set(prompts.get(kd, {}).get(s, {})) for _, kd, t in terms if t == s]
        items[s] = sorted(set.intersection(*shared)) if shared else []
        if not items[s]:
            return None, None, 0
    joint = len({tuple(v) for v in items.values()}) == 1
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    values = {(kd, s): np.array([prompts[kd][s][i] for i in items[s]]) for _, kd, s in terms}
    draws = {}
    if joint:
        n = len(items[sets[0]])
        pick = rng.integers(0, n, size=(BOOTSTRAP_SAMPLES, n))
        draws = {s: pick for s in sets}
    else:
        draws = {s: rng.integers(0, len(items[s]), size=(BOOTSTRAP_SAMPLES, len(items[s]))) for s in sets}
    stats = sum(w * values[(kd, s)][draws[s]].mean(axis=1) for w, kd, s in terms)
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high), min(len(v) for v in items.values())


def claims(table: dict, prompts: dict, sets: list[str], grid: dict) -> list[dict]:
    rows = []
    for claim, what, terms in claim_terms(sets, grid):
        cells = [table.get(kd, {}).get(s) for _, kd, s in terms]
        row = {"claim": claim, "what": what, "statistic": None, "noise": None, "verdict": "not measured",
               "bootstrap_95": None, "bootstrap_prompts": 0}
        if terms and all(c is not None for c in cells):
            row["statistic"] = sum(w * c["tau_mean"] for (w, _, _), c in zip(terms, cells))
            row["verdict"], row["noise"] = verdict(row["statistic"], cells)
            low, high, n = bootstrap(terms, prompts)
            if low is not None:
                row["bootstrap_95"], row["bootstrap_prompts"] = [round(low, 4), round(high, 4)], n
                row["bootstrap_verdict"] = ("above 0" if low > 0 else "below 0" if high < 0 else "includes 0")
        rows.append(row)
    return rows


# ----- draft memory and time ---------------------------------------------------------------------------------------
def draft_costs(results: dict) -> tuple[dict, dict]:
    """(memory, time): memory[kind-depth][context] = bytes held (the bench's sweep, seed 0's drafter);
    time[kind-depth][set] = {"ms_per_token", "share"}: greedy drafting time per new token and its share of decode
    time, over seeds and prompts."""
    memory = {}
    for name, by_context in (results.get("memory_sweep") or {}).items():
        m = SEED_NAME.match(name)
        if m and m["seed"] == "0":
            memory[f"{m['kind']}-d{m['depth']}"] = {int(c): int(b) for c, b in by_context.items()}
    sums: dict = {}
    for r in results["runs"]:
        m = SEED_NAME.match(r.get("method", ""))
        if m and float(r["temperature"]) == 0:
            cell = sums.setdefault(f"{m['kind']}-d{m['depth']}", {}).setdefault(r["set"], [0.0, 0.0, 0])
            cell[0] += r["draft_time"]
            cell[1] += 0.0 if r.get("replayed") else r["decode_time"]  # a replay's decode time is no decode's
            cell[2] += r["new_tokens"]
    time = {k: {s: {"ms_per_token": round(1000 * d / n, 3) if n else None, "share": round(d / t, 4) if t else None}
                for s, (d, t, n) in by_set.items()} for k, by_set in sums.items()}
    return memory, time


def outputs_check(results: dict) -> dict:
    """{set: {"prompts": greedy prompts, "drafter_runs", "identical_to_plain"}} over the seed runs."""
    out: dict = {}
    for r in results["runs"]:
        if SEED_NAME.match(r.get("method", "")) and float(r["temperature"]) == 0:
            cell = out.setdefault(r["set"], {"prompts": set(), "drafter_runs": 0, "identical_to_plain": 0,
                                             "replayed": 0})
            cell["prompts"].add(r["item_id"])
            cell["drafter_runs"] += 1
            cell["identical_to_plain"] += bool(r.get("identical_to_plain"))
            cell["replayed"] += bool(r.get("replayed"))  # the recording's text by construction (bench --replay)
    return {s: {**c, "prompts": len(c["prompts"])} for s, c in out.items()}


def _draft_time_cell(cell: dict | None) -> str:
    if not cell or cell["ms_per_token"] is None:
        return "–"
    return f"{cell['ms_per_token']:.2f}" + ("" if cell["share"] is None else f" ({cell['share']:.0%})")


def _ordered(sets) -> list[str]:
    return sorted(sets, key=lambda s: list(SETS).index(s) if s in SETS else 99)


# ----- writing -------------------------------------------------------------------------------------------------------
def _num(x, sign=False) -> str:
    return "–" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def claims_lines(rows: list[dict]) -> list[str]:
    lines = ["| claim | statistic | value | noise (max seed spread) | verdict | paired bootstrap 95% (prompts) |",
             "|---|---|---:|---:|---|---|"]
    for r in rows:
        ci = "–" if not r["bootstrap_95"] else (f"[{r['bootstrap_95'][0]:+.3f}, {r['bootstrap_95'][1]:+.3f}] "
                                                 f"({r['bootstrap_prompts']}; {r['bootstrap_verdict']})")
        lines.append(f"| {r['claim']} | {r['what']} | {_num(r['statistic'], True)} | {_num(r['noise'])} | "
                     f"**{r['verdict']}** | {ci} |")
    return lines


def plot(curves: list[tuple[str, dict, dict]], path: Path) -> None:
    """curves: (label, table, context length per set); one line per kind-depth and grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for g, (label, table, lengths) in enumerate(curves):
        for key, cells in table.items():
            sets = sorted((s for s in cells if s in lengths), key=lengths.get)
            if not sets:
                continue
            y, err = tau_with_seed_range(cells, sets)
            kind, depth = key.rsplit("-d", 1)
            ax.errorbar([lengths[s] for s in sets], y, yerr=err, capsize=2, color=f"C{KINDS.index(kind)}",
                        fmt=("o" if depth == "1" else "s") + ("-" if g == 0 else "--"), alpha=1.0 if g == 0 else 0.5,
                        label=f"{key}, {label}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (prompt tokens, mean of the set)")
    ax.set_ylabel("greedy τ (mean of seeds; bars: seed range)")
    ax.set_title("τ against context per kind: without (solid) and with (dashed) the copy input")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(benches: list, copy: list | None = None, out=None, anchor_context=None) -> list[Path]:
    results = pooled(benches)
    out = Path(out) if out else summarize.load_results(benches[0])[1]
    copy_paths = [p for p in (COPY_BENCHES if copy is None else copy) if (Path(p) / "results.json").exists()
                  or Path(p).is_file()]
    copy_results = summarize.merge_results([summarize.load_results(p) for p in copy_paths]) if copy_paths else None
    report: dict = {"grids": {}}
    lines = ["# Kinds grid without the copy input (issue 41): claims", ""]
    lines += [f"- `{b['command']}`" for b in results["meta"]["benches"]]
    lines += ["", f"Noise rule: {summarize.NOISE_RULE}",
              "Paired bootstrap: the claim's statistic recomputed over prompts resampled with replacement "
              f"({BOOTSTRAP_SAMPLES} draws; each prompt's τ the mean over seeds; the same draw for every kind, and for "
              "every set whose prompts share their ids), its 2.5th and 97.5th percentiles.", ""]
    table = None
    for label, res in (("no copy input", results), ("copy input", copy_results)):
        if res is None:
            continue
        for temperature, title in ((0.0, "greedy"), (summarize.SAMPLED, "T = 1")):
            seeds, _, sets, _ = summarize.taus(res, temperature)
            sets = _ordered(sets)
            grid_table = summary(seeds, sets)
            if not grid_table:
                continue
            rows = claims(grid_table, per_prompt(res, temperature), sets, GRIDS[label])
            report["grids"].setdefault(label, {})[title] = {"sets": sets, "claims": rows, "tau": grid_table}
            lines += [f"## {label}, {title}", "", *claims_lines(rows), "", f"τ per kind-depth ({title}):", "",
                      *table_lines(grid_table, sets), ""]
            if label == "no copy input" and temperature == 0:
                table = grid_table
    if not table:
        raise HyflashError("no greedy runs of drafters named KIND-dN-sS in the benches: nothing to summarise")
    memory, time = draft_costs(results)
    checks = outputs_check(results)
    report.update(draft_memory_bytes=memory, draft_time=time, outputs=checks)
    contexts = sorted({c for m in memory.values() for c in m})
    lines += ["## Draft memory (MiB held at each context; the bench's sweep)", "",
              "| kind-depth | " + " | ".join(str(c) for c in contexts) + " |", "|---|" + "---:|" * len(contexts)]
    lines += [f"| {k} | " + " | ".join(f"{m[c] / 2**20:.2f}" if c in m else "–" for c in contexts) + " |"
              for k, m in memory.items()]
    sets = _ordered({s for v in time.values() for s in v})
    lines += ["", f"## Draft time (greedy; ms of drafting per new token, share of decode time; "
              f"{results['meta'].get('machine', {}).get('cpu_model', '?')}, device "
              f"{results['meta'].get('config', {}).get('device', 'cpu')})", "",
              "| kind-depth | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    lines += [f"| {k} | " + " | ".join(_draft_time_cell(v.get(s)) for s in sets) + " |" for k, v in time.items()]
    lines += ["", "## Prompts and exactness (greedy)", "",
              "| set | prompts | drafter runs | identical to plain | replayed (`bench --replay`: plain's text by construction) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {s} | {c['prompts']} | {c['drafter_runs']} | {c['identical_to_plain']} | {c['replayed']} |"
              for s, c in sorted(checks.items(), key=lambda kv: _ordered(checks).index(kv[0]))]
    if anchor_context and Path(anchor_context).exists():
        share = json.loads(Path(anchor_context).read_text())
        report["anchor_context"] = share
        lines += ["", f"Training anchors ({share.get('anchors', 0):,}): "
                  f"{share['share_context_over'].get('1024', 0):.1%} have more than 1,024 tokens of context, "
                  f"{share.get('share_memory_in_use', 0):.1%} have tokens in the memory."]
    if results.get("errors"):
        lines += ["", "Methods that did not run:", *[f"- {k}: {v}" for k, v in results["errors"].items()]]
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "claims.json", out / "claims.md", out / PLOT]
    atomic_write_json(written[0], table)
    atomic_write_json(written[1], report)
    atomic_write_text(written[2], "\n".join(lines) + "\n")
    curves = [("no copy", table, summarize.context_lengths(results))]
    if copy_results is not None and "copy input" in report["grids"]:
        curves.append(("copy", report["grids"]["copy input"]["greedy"]["tau"], summarize.context_lengths(copy_results)))
    plot(curves, written[3])
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", nargs="+", help="`hyflash bench` folders (or results.json) of the no-copy grid")
    p.add_argument("--copy", nargs="*", default=None, help="the copy grid's benches (default: the committed ones)")
    p.add_argument("--out", help="folder for the outputs (default: the first bench's folder)")
    p.add_argument("--anchor-context", help="anchor_context.json of the grid's training data")
    args = p.parse_args(argv)
    try:
        written = write_all(args.bench, args.copy, args.out, args.anchor_context)
    except HyflashError as exc:
        print(f"summarize_nocopy: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(written[2].read_text().split("\n## Draft memory")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
