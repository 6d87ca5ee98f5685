"""The fastest exact llama.cpp configuration for a GGUF on this machine, chosen by measurement (issue 36).

A pass's speed on a CPU depends on the thread count, flash attention, the K/V cache types and whether ggml
repacks the weights for its kernels; which is fastest differs by file and CPU. Some of them also change how a
multi-token pass rounds against a one-token pass, and there speculative greedy text can differ from plain
decoding's. So `search_settings` tries a small grid, and for each configuration measures

  - exactness: calibration.measure_exactness (an 8-token pass against 8 one-token passes, after 300 and 1,000
    tokens; 0.0 = bit-identical),
  - c(1), c(2), c(4) after SEARCH_CONTEXT tokens: calibration.measure_target (one-token passes sampled most,
    q's timed in rounds), without features, as plain decoding runs,

and `llamacpp_settings.choose` picks: the lowest c(1) among the bit-identical configurations (ties within 3%: the
lowest c(4)/c(1)); the fastest overall, reported as not exact, if none is. The trials are cached per file and
machine, and `LlamaCppTarget.load` runs the choice wherever the user gave no setting of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from hyflash.calibration import measure_exactness, measure_target
from hyflash.errors import HyflashError
from hyflash.machine import physical_cores
from hyflash.targets import gguf_path
from hyflash.targets.llamacpp import LlamaCppTarget
from hyflash.targets.llamacpp_build import default_cache_types, default_repack
from hyflash.targets.llamacpp_settings import SEARCH_QS, LlamaCppSettings, Trial, choose, save_search

SEARCH_CONTEXT = 300  # a chat prompt's length; issue 36 compared files at this context
# The exactness check reads 1,000 tokens (an F16 K cache rounds differently past 512 cells): a context this size
# holds it, and the cache's size does not change a pass's cost (attention reads the cells in use).
SEARCH_N_CTX = 2048
# Besides "auto" (the file's exact default): llama.cpp's own f16, and both in q8_0 (half the cache to read).
CACHE_PAIRS = (("f16", "f16"), ("q8_0", "q8_0"))


@dataclass
class SearchResult:
    model: str
    path: Path
    precision: str
    trials: list[Trial]
    choice: Trial | None
    cache_file: Path | None = None

    @property
    def exact(self) -> bool:
        return self.choice is not None and self.choice.exactness == 0.0

    def to_dict(self) -> dict:
        return {"model": self.model, "gguf": str(self.path), "precision": self.precision,
                "trials": [t.to_dict() for t in self.trials],
                "choice": None if self.choice is None else self.choice.to_dict(), "exact": self.exact}


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to the physical cores, and the cores themselves (every count would be too many trials
    on a large machine, and the powers of two show the trend)."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return counts + [cores]


def settings_grid(precision: str, cores: int | None = None) -> list[LlamaCppSettings]:
    """Every combination of thread_counts, flash attention on/off, the file's "auto" K/V types and CACHE_PAIRS,
    and repacked weights on/off (only off where repacking crashes: `default_repack`), except a quantised V cache
    without flash attention, which llama.cpp refuses."""
    pairs = list(dict.fromkeys([default_cache_types(precision), *CACHE_PAIRS]))
    repacks = (True, False) if default_repack() else (False,)
    return [LlamaCppSettings(threads, fa, k, v, repack)
            for threads, fa, (k, v), repack in product(thread_counts(cores or physical_cores()), (True, False),
                                                       pairs, repacks)
            if fa or v in ("f16", "bf16")]


def measure_settings(path: Path, settings: LlamaCppSettings, reps: int = 5) -> Trial:
    """The exactness and c(q), q in SEARCH_QS, of `path` run with `settings` (a Trial with `error` if llama.cpp
    refuses the configuration)."""
    try:
        target = LlamaCppTarget(path, record_features=False, n_ctx=SEARCH_N_CTX, **settings.options())
    except HyflashError:
        return Trial(settings, error="llama.cpp refused this configuration")
    exactness = measure_exactness(target)
    row = measure_target(target, [SEARCH_CONTEXT], max_q=max(SEARCH_QS), reps=reps, features=False)[0]
    return Trial(settings, exactness, [row[q - 1] for q in SEARCH_QS])


def search_settings(model: str, grid: list[LlamaCppSettings] | None = None, reps: int = 5,
                    announce: Callable[[str], None] | None = None, save: bool = True) -> SearchResult:
    """Measure every configuration of `grid` (default: settings_grid for the file) for `model` (a built-in
    name or a .gguf), choose one (llamacpp_settings.choose), and cache the trials for LlamaCppTarget.load
    (save=False: only report). `announce(line)` is told each configuration's result as it is measured."""
    path = gguf_path(model)
    precision = LlamaCppTarget(path, record_features=False, n_ctx=64).precision
    grid = grid or settings_grid(precision)
    trials = []
    for i, settings in enumerate(grid, 1):
        trial = measure_settings(path, settings, reps)
        trials.append(trial)
        if announce:
            announce(f"hyflash: configuration {i}/{len(grid)}: {settings.label()}: {trial_summary(trial)}")
    result = SearchResult(model, path, precision, trials, choose(trials))
    if save:
        result.cache_file = save_search(path, precision, trials)
    return result


def trial_summary(trial: Trial) -> str:
    if not trial.ran:
        return f"not run ({trial.error})"
    exact = "exact" if trial.exactness == 0.0 else f"not exact (max |dlogit| {trial.exactness:.3g})"
    return f"{exact}, c(1) {trial.pass_ms[0]:.2f} ms"


def search_table(result: SearchResult) -> str:
    """Markdown: one row per configuration, the chosen one marked."""
    lines = ["| threads | flash attn | K / V cache | weights | exact? | max abs dlogit | c(1) ms | c(2)/c(1) "
             "| c(4)/c(1) |", "|---:|---|---|---|---|---:|---:|---:|---:|"]
    for t in result.trials:
        s = t.settings
        cells = [str(s.threads), "on" if s.flash_attn else "off", f"{s.cache_type_k} / {s.cache_type_v}",
                 "repacked" if s.repack else "plain"]
        if t.ran:
            cells += ["yes" if t.exactness == 0.0 else "no", f"{t.exactness:.3g}", f"{t.pass_ms[0]:.2f}",
                      f"{t.ratio(2):.2f}", f"{t.ratio(4):.2f}"]
        else:
            cells += ["not run: " + t.error.replace("|", "/"), "", "", "", ""]
        mark = " **(chosen)**" if t is result.choice else ""
        lines.append("| " + " | ".join(cells) + mark + " |")
    return "\n".join(lines)


def choice_line(result: SearchResult) -> str:
    if result.choice is None:
        return f"{result.model}: no configuration ran; llama.cpp's and hyflash's defaults stay"
    what = (f"{result.model} ({result.precision}): chosen {result.choice.settings.label()}, "
            f"c(1) {result.choice.pass_ms[0]:.2f} ms")
    if result.exact:
        return what + ": bit-identical (speculative greedy text equals plain decoding's)"
    return what + (": NOT bit-identical, no configuration was, so this is merely the fastest (a near-tie can flip "
                   "a greedy token between speculative and plain decoding)")
