"""Plots of distillation runs: held-out accuracy and student entropy against samples seen.

`hyflash distill` draws one run with it; the REOPOLD experiment (experiments/reopold) draws its seeds and
methods together, smoothed as its samples-to-reach reads them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from hyflash.files import read_jsonl

COLORS = {"reopold": "tab:red", "opd": "tab:blue", "gkd": "tab:green", "skew-rkl": "tab:purple", "sft": "tab:gray",
          "grpo": "tab:orange"}
# Groups named otherwise (an extension's runs, a reference run) take these in turn, one colour per group on both
# panels: left to matplotlib's cycle, a group's seeds, mean and entropy lines would each get another.
OTHER_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def smooth(values: list[float], window: int) -> list[float]:
    """Centred moving average; near the ends the window shrinks to stay centred (first and last point raw)."""
    v = np.asarray(values, dtype=float)
    i = np.arange(len(v))
    h = np.minimum(np.minimum(max(window, 1) // 2, i), len(v) - 1 - i)  # half-width at each point
    sums = np.concatenate([[0.0], np.cumsum(v)])
    return [float(x) for x in (sums[i + h + 1] - sums[i - h]) / (2 * h + 1)]


def plot_runs(
    groups: dict[str, list[str]], path: str, teacher_accuracy: float | None = None, switch_at: int | None = None,
    smooth_window: int = 1, level: float | None = None,
) -> None:
    """Held-out accuracy (left) and student sample entropy (right) against samples seen; thin lines are
    seeds, thick lines the mean over seeds (smoothed over `smooth_window` evaluations, as samples-to-reach
    reads them); `switch_at` marks REOPOLD's phase switch (in samples), `level` the accuracy to reach."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_ent) = plt.subplots(1, 2, figsize=(11, 4))
    others = itertools.cycle(OTHER_COLORS)
    for method, runs in groups.items():
        color = COLORS.get(method) or next(others)
        curves = []
        for run in runs:
            ev = read_jsonl(Path(run) / "eval.jsonl")
            if ev:
                ax_acc.plot([e["samples"] for e in ev], [e["accuracy"] for e in ev], color=color, alpha=0.3, lw=1)
                curves.append(ev)
            tr = read_jsonl(Path(run) / "train.jsonl")
            if tr:
                ent = np.convolve([r["entropy"] for r in tr], np.ones(5) / 5, mode="valid")  # 5-step mean
                ax_ent.plot([r["samples"] for r in tr][4:] if len(tr) >= 5 else [], ent if len(tr) >= 5 else [],
                            color=color, alpha=0.6, lw=1, label=method if run == runs[0] else None)
        n = min((len(c) for c in curves), default=0)
        if n:
            xs = [e["samples"] for e in curves[0][:n]]
            mean = smooth(list(np.mean([[e["accuracy"] for e in c[:n]] for c in curves], axis=0)), smooth_window)
            seeds = f"{len(curves)} seed" + ("" if len(curves) == 1 else "s")
            ax_acc.plot(xs, mean, color=color, lw=2.5, label=f"{method} ({seeds})")
    title = "Arithmetic, held-out split"
    top = max((max(line.get_ydata(), default=0.0) for line in ax_acc.get_lines()), default=0.0)
    if teacher_accuracy is not None and teacher_accuracy <= 2 * top + 0.05:
        ax_acc.axhline(teacher_accuracy, color="black", ls="--", lw=1, label="teacher")
    elif teacher_accuracy is not None:  # far above the students: a line there would flatten their curves
        title += f" (teacher {teacher_accuracy:.3f}, off the scale)"
    if level is not None:
        ax_acc.axhline(level, color="gray", ls=":", lw=1, label="level to reach")
    if switch_at:
        for ax in (ax_acc, ax_ent):
            ax.axvline(switch_at, color=COLORS["reopold"], ls=":", lw=1,
                       label="REOPOLD switch" if ax is ax_ent else None)
    ax_acc.set(xlabel="samples seen", ylabel="held-out accuracy (greedy)", title=title)
    ax_ent.set(xlabel="samples seen", ylabel="mean entropy of sampled tokens (nats)", title="Student entropy")
    ax_acc.legend(fontsize=8)
    ax_ent.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


