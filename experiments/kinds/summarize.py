"""Summary, claims table, plot and memory-rule table of the kinds grid (experiments/kinds/grid.sh, issue 17).

usage: python experiments/kinds/summarize.py BENCH [BENCH ...] [--out DIR]

BENCH is a `hyflash bench` folder (or its results.json) whose trained drafters are named
KIND-dDEPTH-sSEED (e.g. hyflash-d1-s0, full-d2-s1) and KIND-dDEPTH-rule-RULE (e.g. hyflash-d1-rule-delta);
other methods (plain, ngram, drafters named otherwise, tree variants NAME@tN) are not used. Several BENCHes
(one grid benched over several sessions or machines) are read as one: their settings must agree, and each
drafter must be in one of them. Writes into DIR (default: the folder of a single BENCH's results.json):

  summary.json          {kind-depth: {set: {"tau_mean": m, "tau_seeds": [t0, t1, ...]}}}: greedy tau per prompt,
                        averaged over the prompts of a set for each seed (tau_seeds, in seed order), then over
                        seeds (tau_mean). Memory-rule runs are not in it.
  claims.md             one row per claim with its verdict (the noise rule is stated in the file), then the
                        hyflash - full gain per set and depth, and the memory-rule table
  memory_rules.json     {rule: {"drafter": name, "sets": {set: tau}}}: hyflash-d1 seed 0 under each memory rule;
                        the default rule's row is the seed-0 grid run itself unless a -rule- run of it exists
  memory_rules.md       that table, with the noise of its mean column and which rule should be the default
  tau_vs_context_by_kind.png   greedy tau against prompt length per kind-depth, seed range as error bars
  summary_t1.json       the summary at T = 1, when the bench sampled at T = 1 (claims.md has its claims too)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from hyflash.bench.run import settings_differ  # noqa: E402
from hyflash.drafters.config import KINDS, MEMORY_RULES  # noqa: E402
from hyflash.errors import HyflashError  # noqa: E402
from hyflash.files import atomic_write_json, atomic_write_text  # noqa: E402

SEED_NAME = re.compile(rf"^(?P<kind>{'|'.join(KINDS)})-d(?P<depth>[1-9][0-9]*)-s(?P<seed>[0-9]+)$")
RULE_NAME = re.compile(rf"^(?P<kind>{'|'.join(KINDS)})-d(?P<depth>[1-9][0-9]*)-rule-(?P<rule>{'|'.join(MEMORY_RULES)})$")
DEFAULT_RULE = "gated_delta"  # DrafterConfig.memory_rule's default: what every seed run of the grid uses
SHORT, LONG = "code", "long-8k"  # claim (c): the gain at the longest context against 1k-token code
PLOT = "tau_vs_context_by_kind.png"
SAMPLED = 1.0  # the bench's sampling temperature: its claims are reported beside the greedy verdicts
SAMPLED_TITLE = "At T = 1 (sampling; the same statistics and noise rule, reported beside the greedy verdicts)"

NOISE_RULE = (
    "Each cell (kind-depth, set) has one greedy τ per seed (the mean over that set's prompts) and its seed "
    "spread = max − min over the seeds. A claim's statistic is a difference of seed means; its noise is the "
    "largest seed spread among the cells the statistic is built from. Verdict: **supported** if the "
    "statistic > noise, **refuted** if it is < −noise, **within noise** otherwise; a claim whose cells do not "
    "all have ≥ 2 seeds is **not enough seeds**, one with a missing cell **not measured**."
)


# ----- reading ---------------------------------------------------------------------------------------------
def load_results(path: str | Path) -> tuple[dict, Path]:
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(file.read_text())
    except FileNotFoundError:
        raise HyflashError(f"{file} does not exist: give a `hyflash bench` folder or its results.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:  # unreadable, or cut short by a killed bench
        raise HyflashError(f"{file} cannot be read as JSON ({exc}): rerun the bench") from exc
    if not isinstance(results, dict) or not isinstance(results.get("runs"), list):
        raise HyflashError(f"{file} is not a `hyflash bench` results.json (no list of runs)")
    return results, file.parent


def merge_results(benches: list[tuple[dict, Path]]) -> dict:
    """One results dict from several benches of the same settings: their records side by side, their drafters
    united. τ does not depend on the machine (the timings in the records do; nothing here reads them)."""
    if len(benches) == 1:
        return benches[0][0]
    (first, first_folder), merged_runs, drafters, owner = benches[0], [], {}, {}
    for results, folder in benches:
        meta = results.get("meta") or {}
        differ = settings_differ(first.get("meta") or {}, meta)
        if differ:
            raise HyflashError(f"{folder} was benched with other settings than {first_folder} ({', '.join(differ)}): "
                               "its τ cannot stand beside theirs; bench the drafters again with the same settings")
        for method in {r.get("method") for r in results["runs"]} - {"plain"}:
            if method in owner:
                raise HyflashError(f"{method} is in both {owner[method]} and {folder}: keep it in one bench")
            owner[method] = folder
        merged_runs += [r for r in results["runs"] if r.get("method") != "plain" or results is first]
        drafters.update(meta.get("drafters") or {})

    def united(key: str) -> dict:
        return {k: v for results, _ in benches for k, v in (results.get(key) or {}).items()}

    meta = {**(first.get("meta") or {}), "drafters": drafters,
            "benches": [{"folder": str(f), "command": (r.get("meta") or {}).get("command", "?")} for r, f in benches]}
    return {**first, "meta": meta, "runs": merged_runs, "errors": united("errors"),
            "drafter_params": united("drafter_params")}


def _check_identity(name: str, kind: str, depth: int, rule: str | None, drafters: dict) -> None:
    """The name must say what the drafter is: its recorded config (meta.drafters) is checked when present."""
    config = (drafters.get(name) or {}).get("config")
    if not config:
        return
    said = f"{kind}, depth {depth}" + (f", rule {rule}" if rule else "")
    was = f"{config.get('kind')}, depth {config.get('num_layers')}" + (f", rule {config.get('memory_rule')}" if rule else "")
    if said != was:
        raise HyflashError(f"drafter {name!r} is named as ({said}) but its folder holds ({was}): fix the --drafter name")


def taus(results: dict, temperature: float = 0.0) -> tuple[dict, dict, list[str], list[str]]:
    """(seeds, rules, sets, notes): seeds[kind-depth][seed][set] and rules[rule][set] = mean tau at this
    temperature over that set's prompts (per-prompt tau, NaN prompts left out); sets in bench order."""
    drafters = results.get("meta", {}).get("drafters") or {}
    per_prompt: dict[str, dict[str, list[float]]] = {}
    sets: list[str] = []
    for r in results["runs"]:
        try:
            if float(r["temperature"]) != temperature:
                continue
            method, set_name, tau = r["method"], r["set"], float(r["tau"])
        except (KeyError, TypeError, ValueError) as exc:
            raise HyflashError(f"a run record in results.json lacks a usable field ({exc}): rerun the bench") from exc
        if set_name not in sets:
            sets.append(set_name)
        if math.isfinite(tau):
            per_prompt.setdefault(method, {}).setdefault(set_name, []).append(tau)
    seeds: dict[str, dict[int, dict[str, float]]] = {}
    rules: dict[str, dict] = {}
    notes = []
    unused = sorted(m for m in per_prompt if not SEED_NAME.match(m) and not RULE_NAME.match(m) and m != "plain")
    if unused:
        notes.append(f"not used (not named KIND-dN-sS or KIND-dN-rule-RULE): {', '.join(unused)}")
    for method, by_set in per_prompt.items():
        means = {s: sum(v) / len(v) for s, v in by_set.items()}
        if m := SEED_NAME.match(method):
            kind, depth, seed = m["kind"], int(m["depth"]), int(m["seed"])
            _check_identity(method, kind, depth, None, drafters)
            seeds.setdefault(f"{kind}-d{depth}", {})[seed] = means
        elif m := RULE_NAME.match(method):
            if (m["kind"], m["depth"]) != ("hyflash", "1"):
                notes.append(f"{method}: memory-rule runs are compared for hyflash-d1 only; left out")
                continue
            _check_identity(method, m["kind"], int(m["depth"]), m["rule"], drafters)
            rules[m["rule"]] = {"drafter": method, "sets": means}
    if DEFAULT_RULE not in rules and 0 in seeds.get("hyflash-d1", {}):
        config = (drafters.get("hyflash-d1-s0") or {}).get("config") or {}
        if config.get("memory_rule", DEFAULT_RULE) == DEFAULT_RULE:
            rules[DEFAULT_RULE] = {"drafter": "hyflash-d1-s0", "sets": seeds["hyflash-d1"][0]}
    for name, error in (results.get("errors") or {}).items():
        notes.append(f"method {name} did not run: {error}")
    return seeds, rules, sets, notes


def summary(seeds: dict, sets: list[str]) -> dict:
    """{kind-depth: {set: {"tau_mean", "tau_seeds"}}}, kind-depths in kind then depth order."""
    def order(key: str) -> tuple:
        kind, depth = key.rsplit("-d", 1)
        return KINDS.index(kind), int(depth)

    out = {}
    for key in sorted(seeds, key=order):
        cells = {}
        for s in sets:
            values = [seeds[key][seed][s] for seed in sorted(seeds[key]) if s in seeds[key][seed]]
            if values:
                cells[s] = {"tau_mean": round(sum(values) / len(values), 4), "tau_seeds": [round(v, 4) for v in values]}
        if cells:
            out[key] = cells
    return out


# ----- claims ----------------------------------------------------------------------------------------------
def _spread(cell: dict) -> float:
    return max(cell["tau_seeds"]) - min(cell["tau_seeds"])


def verdict(statistic: float, cells: list[dict | None]) -> tuple[str, float | None]:
    """(verdict, noise) for a statistic built from these summary cells (None = missing)."""
    if any(c is None for c in cells):
        return "not measured", None
    noise = max(_spread(c) for c in cells)
    if any(len(c["tau_seeds"]) < 2 for c in cells):
        return "not enough seeds", noise
    if statistic > noise:
        return "supported", noise
    if statistic < -noise:
        return "refuted", noise
    return "within noise", noise


def _gain(table: dict, depth: int, set_name: str) -> tuple[float | None, list]:
    h = table.get(f"hyflash-d{depth}", {}).get(set_name)
    f = table.get(f"full-d{depth}", {}).get(set_name)
    return (h["tau_mean"] - f["tau_mean"] if h and f else None), [h, f]


def _mean_gain(table: dict, depth: int, sets: list[str]) -> tuple[float | None, list]:
    gains, cells = [], []
    for s in sets:
        g, c = _gain(table, depth, s)
        cells += c
        if g is not None:
            gains.append(g)
    return (sum(gains) / len(gains) if gains and len(gains) == len(sets) else None), cells


def claims(table: dict, sets: list[str]) -> list[dict]:
    """Rows (a), (b), (c): claim, statistic, noise, verdict, and what the statistic is."""
    rows = []
    a, cells_a = _mean_gain(table, 1, sets)
    rows.append({"claim": "(a) hyflash has a higher τ than full at equal parameters (depth 1)",
                 "statistic": a, "cells": cells_a,
                 "what": f"mean over the {len(sets)} sets of τ(hyflash-d1) − τ(full-d1)"})
    g1, cells_1 = _mean_gain(table, 1, sets)
    g2, cells_2 = _mean_gain(table, 2, sets)
    rows.append({"claim": "(b) the gain of hyflash over full is larger for shallow (d1) than deep (d2) drafters",
                 "statistic": None if g1 is None or g2 is None else g1 - g2, "cells": cells_1 + cells_2,
                 "what": "gain(d1) − gain(d2), gain = mean over sets of τ(hyflash) − τ(full)"})
    long_gain, cells_long = _gain(table, 1, LONG)
    short_gain, cells_short = _gain(table, 1, SHORT)
    rows.append({"claim": f"(c) the gain is larger at long context ({LONG}) than at {SHORT} (depth 1)",
                 "statistic": None if long_gain is None or short_gain is None else long_gain - short_gain,
                 "cells": cells_long + cells_short,
                 "what": f"[τ(hyflash-d1) − τ(full-d1)] on {LONG} − the same on {SHORT}"})
    for row in rows:
        cells = row.pop("cells")
        if row["statistic"] is None:
            row["verdict"], row["noise"] = "not measured", None
        else:
            row["verdict"], row["noise"] = verdict(row["statistic"], cells)
    return rows


def _num(x: float | None, sign: bool = False) -> str:
    return "–" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def _claims_lines(table: dict, sets: list[str], what: str) -> list[str]:
    """The claims table, the gain per set and τ per kind-depth, for the τ of one temperature (`what`)."""
    lines = ["| claim | statistic | value | noise (max seed spread) | verdict |", "|---|---|---:|---:|---|"]
    for r in claims(table, sets):
        lines.append(f"| {r['claim']} | {r['what']} | {_num(r['statistic'], True)} | {_num(r['noise'])} | "
                     f"**{r['verdict']}** |")
    lines += ["", f"### Gain τ(hyflash) − τ(full) per set ({what}, mean of seeds; seed spreads in brackets)", "",
              "| depth | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    for depth in (1, 2):
        cells = []
        for s in sets:
            g, (h, f) = _gain(table, depth, s)
            cells.append("–" if g is None else f"{g:+.3f} [{_spread(h):.3f}, {_spread(f):.3f}]")
        lines.append(f"| d{depth} | " + " | ".join(cells) + " |")
    return lines + ["", f"### τ per kind-depth ({what}, mean of seeds, seed range)", "", *table_lines(table, sets)]


def table_lines(table: dict, sets: list[str]) -> list[str]:
    """A markdown table of τ per kind-depth and set: the mean of seeds and, in brackets, the seed range."""
    lines = ["| kind-depth | seeds | " + " | ".join(sets) + " |", "|---|---:|" + "---:|" * len(sets)]
    for key, cells in table.items():
        n = max(len(c["tau_seeds"]) for c in cells.values())
        row = [f"{cells[s]['tau_mean']:.3f} ({min(cells[s]['tau_seeds']):.2f}–{max(cells[s]['tau_seeds']):.2f})"
               if s in cells else "–" for s in sets]
        lines.append(f"| {key} | {n} | " + " | ".join(row) + " |")
    return lines


def tau_with_seed_range(cells: dict, sets: list[str]) -> tuple[list[float], list[list[float]]]:
    """(mean τ per set, [below, above] error bars reaching the lowest and highest seed) for a plot."""
    y = [cells[s]["tau_mean"] for s in sets]
    return y, [[cells[s]["tau_mean"] - min(cells[s]["tau_seeds"]) for s in sets],
               [max(cells[s]["tau_seeds"]) - cells[s]["tau_mean"] for s in sets]]


def claims_markdown(results: dict, table: dict, rules: dict, sets: list[str], notes: list[str],
                    sampled: dict | None = None) -> str:
    """The claims on greedy τ (the verdicts), then the same at T = 1 when the bench sampled (`sampled`: its
    summary table), the memory rules and notes."""
    params = results.get("drafter_params") or {}
    meta = results.get("meta", {})
    benches = [f"- {b['folder']}: `{b['command']}`" for b in meta.get("benches", [])]
    source = ["Benches:", *benches] if benches else [f"Bench: `{meta.get('command', '?')}`"]
    lines = ["# Kinds grid: claims", "", *source, "",
             f"Noise rule: {NOISE_RULE}", "", "## Greedy (the verdicts)", "", *_claims_lines(table, sets, "greedy")]
    if params:
        counted = {k: v for k, v in params.items() if SEED_NAME.match(k) and k.endswith("-s0")}
        if counted:
            lines += ["", "Parameters (seed 0): " + ", ".join(f"{k[:-3]} {v:,}" for k, v in counted.items())]
    if sampled:
        lines += ["", f"## {SAMPLED_TITLE}", "", *_claims_lines(sampled, sets, "T = 1")]
    lines += ["", memory_rules_markdown(rules, table, sets)]
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# ----- memory rules and plot ---------------------------------------------------------------------------------
def memory_rules_markdown(rules: dict, table: dict, sets: list[str]) -> str:
    lines = ["## Memory rules (hyflash-d1, seed 0, greedy τ)", ""]
    if not rules:
        return "\n".join(lines + ["No memory-rule runs in this bench."])
    lines += ["| rule | drafter | " + " | ".join(sets) + " | mean | vs " + DEFAULT_RULE + " |",
              "|---|---|" + "---:|" * (len(sets) + 2)]
    means = {rule: _set_mean(rules[rule]["sets"], sets) for rule in MEMORY_RULES if rule in rules}
    base_mean = means.get(DEFAULT_RULE)
    for rule, mean in means.items():
        r = rules[rule]
        diff = None if base_mean is None or mean is None else mean - base_mean
        lines.append(f"| {rule} | {r['drafter']} | " + " | ".join(_num(r["sets"].get(s)) for s in sets)
                     + f" | {_num(mean)} | {_num(diff, True)} |")
    cells = table.get("hyflash-d1", {})
    noise = _mean_spread(cells, sets)
    if cells:
        lines.append("| *noise: hyflash-d1 seed spread* | | " + " | ".join(
            _num(_spread(cells[s])) if s in cells else "–" for s in sets) + f" | {_num(noise)} | |")
    return "\n".join(lines + ["", "**Verdict:** " + rule_verdict(means, noise)])


def _mean_spread(cells: dict, sets: list[str]) -> float | None:
    """Seed spread of the mean over the sets (the noise of the table's mean column): None below 2 seeds."""
    if not all(s in cells for s in sets) or len({len(cells[s]["tau_seeds"]) for s in sets}) != 1:
        return None
    means = [sum(seed_taus) / len(sets) for seed_taus in zip(*(cells[s]["tau_seeds"] for s in sets))]
    return max(means) - min(means) if len(means) >= 2 else None


def rule_verdict(means: dict[str, float | None], noise: float | None) -> str:
    """Which rule should be the default, from each rule's mean τ over the sets (None: a set missing): another
    rule only if it beats the default's by more than `noise`, the seed spread of hyflash-d1's mean."""
    base = means.get(DEFAULT_RULE)
    others = {r: m for r, m in means.items() if r != DEFAULT_RULE and m is not None}
    if base is None or not others:
        return f"none: the table needs {DEFAULT_RULE} and another rule over every set."
    if noise is None:
        return "none: hyflash-d1 needs 2 seeds on every set for the noise."
    best = max(others, key=others.get)
    lead = others[best] - base
    if lead > noise:
        return f"**{best}** is ahead of {DEFAULT_RULE} by {lead:+.3f} (noise {noise:.3f}): it should be the default rule."
    return (f"no rule is ahead of {DEFAULT_RULE} beyond noise (the best, {best}, {lead:+.3f}; noise {noise:.3f}): "
            f"{DEFAULT_RULE} stays the default rule.")


def _set_mean(values: dict, sets: list[str]) -> float | None:
    return sum(values[s] for s in sets) / len(sets) if sets and all(s in values for s in sets) else None


def context_lengths(results: dict) -> dict[str, float]:
    """Mean prompt length of each set (what the drafters actually saw), from the greedy runs."""
    lengths: dict[str, list[int]] = {}
    for r in results["runs"]:
        if float(r.get("temperature", 0)) == 0 and "prompt_tokens" in r:
            lengths.setdefault(r["set"], []).append(int(r["prompt_tokens"]))
    return {s: sum(v) / len(v) for s, v in lengths.items()}


def plot(results: dict, table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = context_lengths(results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, cells in table.items():
        sets = sorted((s for s in cells if s in lengths), key=lengths.get)
        x = [lengths[s] for s in sets]
        y, err = tau_with_seed_range(cells, sets)
        kind, depth = key.rsplit("-d", 1)
        ax.errorbar(x, y, yerr=err, fmt="o-" if depth == "1" else "s--", capsize=3, label=key,
                    color=f"C{KINDS.index(kind)}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt length (tokens, mean of the set)")
    ax.set_ylabel("greedy τ (mean of seeds; bars: seed range)")
    ax.set_title("τ against context length per kind and depth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(bench: str | Path | list, out: str | Path | None = None) -> list[Path]:
    benches = [load_results(b) for b in (bench if isinstance(bench, list) else [bench])]
    if out is None and len(benches) > 1:
        raise HyflashError("several benches: give the folder for the outputs (--out DIR)")
    results, folder = merge_results(benches), benches[0][1]
    out = Path(out) if out else folder
    seeds, rules, sets, notes = taus(results)
    table = summary(seeds, sets)
    sampled_seeds, _, sampled_sets, _ = taus(results, SAMPLED)
    sampled = summary(sampled_seeds, [s for s in sets if s in sampled_sets])
    if not table and not rules:  # a bench of memory-rule runs alone still has its rule table
        raise HyflashError(f"no greedy runs of drafters named KIND-dN-sS or KIND-dN-rule-RULE in "
                           f"{folder / 'results.json'}: nothing to summarise (was the bench run with --temperatures "
                           "0 and the grid's drafter names?)")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "claims.md", out / "memory_rules.json", out / "memory_rules.md"]
    atomic_write_json(written[0], table)
    atomic_write_text(written[1], claims_markdown(results, table, rules, sets, notes, sampled))
    atomic_write_json(written[2], {r: rules[r] for r in MEMORY_RULES if r in rules})
    atomic_write_text(written[3], memory_rules_markdown(rules, table, sets) + "\n")
    if table:  # rule runs alone have no kind-depth to draw
        written.append(out / PLOT)
        plot(results, table, written[-1])
    if sampled:
        written.append(out / "summary_t1.json")
        atomic_write_json(written[-1], sampled)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", nargs="+", help="`hyflash bench` folders (or their results.json) of one grid")
    p.add_argument("--out", help="folder for the outputs (default: the bench folder)")
    args = p.parse_args(argv)
    try:
        written = write_all(args.bench, args.out)
    except HyflashError as exc:
        print(f"summarize: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print((Path(written[1])).read_text().split("\n## ")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
