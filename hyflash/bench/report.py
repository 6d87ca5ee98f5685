"""Tables and plots from a results.json (see run.py). Everything shown is read from the results.

  table.md                      a compact comparison, then one table per temperature with every metric
  tau_vs_context.png            tau against prompt length on the stdlib code sets (same kind of text, 1k-8k)
  speedup.png                   speed-up over plain decoding per set (greedy)
  draft_memory_vs_context.png   draft-side bytes from the memory sweep, target KV cache for scale
  acceptance_by_position.png    acceptance rate of each draft slot, pooled over sets, per temperature
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from hyflash.bench.methods import PLAIN_METHODS
from hyflash.bench.run import GREEDY_REFERENCES, HF_PLD, PLAIN, _sum_lists
from hyflash.files import atomic_write_text

CODE_SETS = ("code", "long-2k", "long-4k", "long-8k")  # one kind of text at growing context
NON_DRAFTING = PLAIN_METHODS  # tau is 1 by construction


def human_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # unreachable


def _num(x, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _num_of(count: int | None, total: int) -> str:
    return "–" if count is None else f"{count}/{total}"


def markdown_table(results: dict) -> str:
    rows = results["summary"]
    lines = []
    for temperature in sorted({r["temperature"] for r in rows}):
        greedy = temperature == 0
        lines += [
            f"### Temperature {temperature:g}" + (" (greedy)" if greedy else ""),
            "",
            "| set | prompt tok | method | τ | tok/s | × plain | × HF plain | × HF prompt lookup | × llama.cpp plain "
            "| × fastest plain | draft share | draft memory | accept@1..4 | drafts verified by source |"
            + (" = plain | = llama.cpp |" if greedy else ""),
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|" + ("---:|---:|" if greedy else ""),
        ]
        for r in (r for r in rows if r["temperature"] == temperature):
            accept = " ".join(f"{a:.2f}" for a in r["acceptance_by_position"][:4]) or "–"
            cells = [
                r["set"], f"{r['prompt_tokens_mean']:.0f}", r["method"], _num(r["tau"], ".2f"),
                _num(r["tokens_per_second"], ".1f"), _num(r["speedup"], ".2f"), _num(r["speedup_vs_hf_plain"], ".2f"),
                _num(r["speedup_vs_hf_pld"], ".2f"), _num(r.get("speedup_vs_llamacpp_plain"), ".2f"),
                _num(r.get("speedup_vs_fastest_plain"), ".2f"),
                _num(r["draft_share"], ".0%"),
                human_bytes(r["draft_memory_bytes"]), accept,
                ", ".join(f"{k} {v}" for k, v in sorted((r.get("draft_sources") or {}).items())) or "–",
            ]
            if greedy:
                cells += [_num_of(r.get(field), r["prompts"]) for field in GREEDY_REFERENCES.values()]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += _fastest_plain_lines([r for r in rows if r["temperature"] == temperature])
    meta = results.get("meta", {})
    if meta.get("config", {}).get("replay"):
        lines.append("Acceptance replay (`--replay`): every drafter replayed against one recorded greedy decode per "
                     "prompt. τ, acceptance by position, draft time and draft memory are measured; speeds are not "
                     "(the replayed target's passes cost nothing), and every text is the recording's by construction.")
        lines.append("")
    if meta.get("dtype"):
        lines.append(f"Target dtype: {meta['dtype']} ({meta.get('dtype_reason', '')}); draft length "
                     f"{'adaptive (policy.py)' if meta.get('config', {}).get('adaptive', True) else 'whole blocks'}.")
        lines.append("")
    for name, reason in (results.get("skipped") or {}).items():
        lines.append(f"Method {name} skipped: {reason}.")
        lines.append("")
    peak = max((r["peak_rss_bytes"] for r in rows), default=None)
    lines.append(f"Peak process RSS over the run: {human_bytes(peak)} (the whole process -- target, every drafter, "
                 "transformers' buffers; getrusage cannot attribute it to one method). Draft memory: bytes the "
                 "drafter holds at the end of a prompt (n-gram: its token history; HF prompt lookup keeps none).")
    return "\n".join(lines) + "\n"


def _fastest_plain_lines(rows: list[dict]) -> list[str]:
    """One line per set naming the fastest plain decoding of the run (the '× fastest plain' baseline)."""
    fastest = {r["set"]: r["fastest_plain"] for r in rows if r.get("fastest_plain")}
    speed = {(r["set"], r["method"]): r["tokens_per_second"] for r in rows}
    if not fastest:
        return []
    parts = [f"{s}: {m} ({_num(speed.get((s, m)), '.1f')} tok/s)" for s, m in fastest.items()]
    return ["Fastest plain decoding (the × fastest plain baseline): " + "; ".join(parts) + ".", ""]


def comparison_table(results: dict) -> str:
    """Compact view: one row per (temperature, set) with the fastest plain decoding of the run; per drafting
    method its τ and speed-ups over our plain decoding, over HF prompt lookup (HF prompt lookup itself: over
    plain HF) and over the fastest plain decoding."""
    rows = results["summary"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m not in NON_DRAFTING]
    by = {(r["temperature"], r["set"], r["method"]): r for r in rows}
    head = ["T", "set", "prompt tok", "plain tok/s", "fastest plain"]
    for m in methods:
        other = "× HF plain" if m == HF_PLD else "× HF PL"
        head += [f"{m} τ", f"{m} × plain", f"{m} {other}", f"{m} × fastest plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for temperature, set_name in dict.fromkeys((r["temperature"], r["set"]) for r in rows):
        plain = by.get((temperature, set_name, PLAIN))
        any_row = next(r for r in rows if (r["temperature"], r["set"]) == (temperature, set_name))
        fastest = by.get((temperature, set_name, any_row.get("fastest_plain")))
        cells = [f"{temperature:g}", set_name, f"{(plain or any_row)['prompt_tokens_mean']:.0f}",
                 _num(plain["tokens_per_second"] if plain else None, ".1f"),
                 f"{fastest['method']} {fastest['tokens_per_second']:.1f}" if fastest else "–"]
        for m in methods:
            r = by.get((temperature, set_name, m))
            other = (r or {}).get("speedup_vs_hf_plain" if m == HF_PLD else "speedup_vs_hf_pld")
            cells += [_num(r and r["tau"], ".2f"), _num(r and r["speedup"], ".2f"), _num(other, ".2f"),
                      _num((r or {}).get("speedup_vs_fastest_plain"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _figure(panels: int = 1, width: float = 5.0):
    """A row of `panels` axes on an Agg figure (no display on a server)."""
    import matplotlib

    matplotlib.use("Agg")  # must precede pyplot
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, 4), squeeze=False)
    return fig, list(axes[0])


def _finish(fig, axes, path: Path, log_x_ticks: list[int] | None = None, legend_outside: bool = False) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    for ax in axes:
        if log_x_ticks:  # label the measured lengths themselves, not 10^k (context lengths are powers of 2)
            ax.set_xscale("log")
            ax.set_xticks(log_x_ticks, [str(t) for t in log_x_ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            where = dict(loc="center left", bbox_to_anchor=(1.02, 0.5)) if legend_outside else {}
            ax.legend(fontsize=8, **where)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _temperatures(results: dict) -> list[float]:
    return sorted({r["temperature"] for r in results["summary"]})


def plot_tau_vs_context(results: dict, path: Path) -> None:
    temps = _temperatures(results)
    fig, axes = _figure(len(temps))
    ticks = set()
    for ax, temperature in zip(axes, temps):
        rows = [r for r in results["summary"] if r["temperature"] == temperature and r["set"] in CODE_SETS]
        for method in dict.fromkeys(r["method"] for r in rows if r["method"] not in NON_DRAFTING):
            pts = sorted((r["prompt_tokens_mean"], r["tau"]) for r in rows if r["method"] == method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
            ticks.update(round(p[0]) for p in pts)
        ax.set(xlabel="prompt tokens (stdlib code sets)", ylabel="τ (tokens per target pass)",
               title=f"temperature {temperature:g}")
    _finish(fig, axes, path, sorted(ticks))


def plot_speedup(results: dict, path: Path) -> None:
    rows = [r for r in results["summary"] if r["temperature"] == _temperatures(results)[0]]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != PLAIN]
    width = 0.8 / max(1, len(methods))
    fig, (ax,) = _figure(1, max(6.0, 1.4 * len(sets)))
    for j, method in enumerate(methods):
        vals = {r["set"]: r["speedup"] for r in rows if r["method"] == method}
        ax.bar([i + j * width for i in range(len(sets))], [vals.get(s) or 0 for s in sets], width, label=method)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(sets))], sets)
    ax.set(ylabel="speed-up over plain decoding (same run)", title=f"temperature {rows[0]['temperature']:g}")
    _finish(fig, [ax], path)


def plot_draft_memory(results: dict, path: Path) -> None:
    fig, (ax,) = _figure(1, 8.0)
    ticks = set()
    for name, sweep in results.get("memory_sweep", {}).items():
        pts = sorted((int(k), v) for k, v in sweep.items())
        ax.plot([p[0] for p in pts], [max(p[1], 1) for p in pts], marker="o", label=name)
        ticks.update(p[0] for p in pts)
    kv = sorted((r["target_kv_tokens"], r["target_kv_bytes"]) for r in results["runs"] if r.get("target_kv_bytes"))
    if kv:
        ax.scatter([p[0] for p in kv], [p[1] for p in kv], color="gray", marker="x", label="target KV cache (measured)")
    ax.set(yscale="log", xlabel="context tokens", ylabel="bytes", title="draft-side memory")
    _finish(fig, [ax], path, sorted(ticks) or None, legend_outside=True)


def plot_acceptance(results: dict, path: Path) -> None:
    temps = _temperatures(results)
    runs = [r for r in results["runs"] if r["drafted_by_position"]]
    fig, axes = _figure(len(temps))
    for ax, temperature in zip(axes, temps):
        these = [r for r in runs if r["temperature"] == temperature]
        for method in dict.fromkeys(r["method"] for r in these):
            mine = [r for r in these if r["method"] == method]
            drafted = _sum_lists([r["drafted_by_position"] for r in mine])
            accepted = _sum_lists([r["accepted_by_position"] for r in mine])
            rate = [a / d if d else float("nan") for a, d in zip(accepted, drafted)]
            ax.plot(range(1, len(rate) + 1), rate, marker="o", label=method)
        ax.set(xlabel="draft slot", ylabel="acceptance rate (all sets)", ylim=(0, 1), title=f"temperature {temperature:g}")
    _finish(fig, axes, path)


PLOTS = {
    "tau_vs_context.png": plot_tau_vs_context,
    "speedup.png": plot_speedup,
    "draft_memory_vs_context.png": plot_draft_memory,
    "acceptance_by_position.png": plot_acceptance,
}


def write_report(results: dict, out_dir: str | Path) -> list[Path]:
    """Write table.md and every plot into out_dir; return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "table.md"]
    machine = results.get("meta", {}).get("machine", {})
    where = f"Machine: {machine.get('cpu_model', '?')}, {machine.get('torch_threads', '?')} threads. " if machine else ""
    command = results.get("meta", {}).get("command", "")
    sections = ["## Summary", "", where + (f"Command: `{command}`" if command else ""), "",
                comparison_table(results), "## All metrics", "", markdown_table(results)]
    atomic_write_text(written[0], "\n".join(sections) + "\n" + memory_table(results))
    replay = results.get("meta", {}).get("config", {}).get("replay")
    for name, plot in PLOTS.items():
        if replay and name == "speedup.png":  # a replay measures no speed
            continue
        plot(results, out_dir / name)
        written.append(out_dir / name)
    return written


def prompt_ratios(results: dict, method: str, baseline: str = PLAIN) -> list[dict]:
    """Per (temperature, prompt): `method`'s decode speed over `baseline`'s (plain decoding unless named, e.g.
    llama-cpp-python's own loop, `llamacpp-plain`) on the same prompt in the same run (the never-slower suite's
    ratio; with --repeats the median of the repeats' paired ratios), with its tau, ceiling (policy.ceiling), the
    guard's fall-backs and whether the greedy text equals plain's."""
    runs = {(r["temperature"], r["set"], r["item_id"], r["method"]): r for r in results["runs"]}
    rows = []
    for (temperature, set_name, item, name), r in runs.items():
        plain = runs.get((temperature, set_name, item, baseline))
        if name != method or plain is None or not r["decode_time"] or not plain["decode_time"]:
            continue
        speed = lambda run: run["new_tokens"] / run["decode_time"]  # noqa: E731
        # With --repeats: the ratio of each repeat's pair of timings (plain's i-th against this method's i-th,
        # run next to each other), whose spread shows how much one run's ratio moves. The prompt's ratio is then
        # the median of these paired ratios: the ratio of the two methods' median timings can pair a run from a
        # slow minute with one from a fast minute (on the Zen 3, 6k code: paired 0.93 / 0.99 / 0.79, medians' 0.81).
        pairs = [p / t * r["new_tokens"] / plain["new_tokens"]
                 for p, t in zip(plain.get("decode_times") or [], r.get("decode_times") or []) if t > 0]
        of_medians = speed(r) / speed(plain)
        rows.append({"temperature": temperature, "set": set_name, "item_id": item, "kind": item.split(":")[0],
                     "prompt_tokens": r["prompt_tokens"],
                     "ratio": statistics.median(pairs) if len(pairs) > 1 else of_medians,
                     "ratio_of_medians": of_medians, "repeat_ratios": [round(x, 4) for x in pairs],
                     "tau": r["tau"],
                     "speedup_ceiling": r.get("speedup_ceiling"), "fallbacks": (r.get("guard") or {}).get("fallbacks"),
                     "budget_pauses": (r.get("guard") or {}).get("budget_pauses"),
                     "identical_to_plain": r.get("identical_to_plain")})
    return sorted(rows, key=lambda x: (x["temperature"], x["kind"], x["prompt_tokens"]))


def ratio_summary(rows: list[dict]) -> dict:
    """Minimum and median ratio over the rows, and the share of the ceiling's margin taken (median)."""
    ratios = [r["ratio"] for r in rows]
    shares = [(r["ratio"] - 1) / (r["speedup_ceiling"] - 1) for r in rows
              if r["speedup_ceiling"] and r["speedup_ceiling"] > 1]
    return {"prompts": len(rows), "min_ratio": min(ratios, default=None),
            "median_ratio": statistics.median(ratios) if ratios else None,
            "median_ceiling": statistics.median([r["speedup_ceiling"] for r in rows if r["speedup_ceiling"]] or [0])
            or None, "median_ceiling_share": statistics.median(shares) if shares else None}


def memory_table(results: dict) -> str:
    sweep = results.get("memory_sweep") or {}
    if not sweep:
        return ""
    contexts = sorted({int(c) for s in sweep.values() for c in s})
    params = results.get("drafter_params") or {}
    lines = [
        "### Draft-side memory (bytes held after ingesting the context)",
        "",
        "| drafter | parameters | " + " | ".join(str(c) for c in contexts) + " |",
        "|---|---:|" + "---:|" * len(contexts),
    ]
    for name, s in sweep.items():
        vals = {int(k): v for k, v in s.items()}
        count = f"{params[name]:,}" if params.get(name) else "–"
        lines.append(f"| {name} | {count} | " + " | ".join(human_bytes(vals.get(c)) for c in contexts) + " |")
    return "\n".join(lines) + "\n"
