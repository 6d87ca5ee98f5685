"""The llama.cpp settings a GGUF runs with on this machine: chosen by measurement (`hyflash/config_search.py`),
cached per file and machine, and applied by `LlamaCppTarget.load` to every setting the user did not give.

A setting here is one that changes a pass's speed: threads, flash attention, the K/V cache types and whether
ggml repacks the weights into its extra CPU buffer types. Some also change its rounding, so a searched setting is
kept only where a multi-token pass stays bit-identical to one-token passes (`choose`): speculative greedy text
then equals plain decoding's.

HYFLASH_NO_SEARCHED_SETTINGS=1 ignores the cache (the test suite sets it: its tests assert the defaults).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hyflash.files import atomic_write_json
from hyflash.machine import chosen_threads, cpu_description, physical_cores
from hyflash.targets.base import cache_root

FORMAT_VERSION = 1
SEARCH_QS = (1, 2, 4)  # the pass sizes a trial times: plain decoding's step and the short drafts that pay here
TIE = 0.03  # one-token costs within 3% are a tie (timing noise on a shared CPU is about that)


@dataclass(frozen=True)
class LlamaCppSettings:
    """One configuration of the llama.cpp target (concrete: no "auto")."""

    threads: int
    flash_attn: bool
    cache_type_k: str
    cache_type_v: str
    repack: bool  # weights in ggml's repacked ("extra") CPU buffer types, llama_model_params.use_extra_bufts

    def options(self) -> dict:
        """As LlamaCppTarget's keyword arguments."""
        return {"n_threads": self.threads, "flash_attn": self.flash_attn, "cache_type_k": self.cache_type_k,
                "cache_type_v": self.cache_type_v, "repack": self.repack}

    def label(self) -> str:
        return (f"{self.threads} thread{'s' if self.threads > 1 else ''}, FA {'on' if self.flash_attn else 'off'}, "
                f"K {self.cache_type_k} / V {self.cache_type_v}, {'repacked' if self.repack else 'plain'} weights")


@dataclass
class Trial:
    """What the search measured for one configuration: exactness (max |logit difference| of an 8-token pass
    against 8 one-token passes; 0.0 = bit-identical) and pass_ms (c(q) for q in SEARCH_QS), or why it could not
    run (`error`: llama.cpp refused the configuration, e.g. a quantised V cache without flash attention)."""

    settings: LlamaCppSettings
    exactness: float | None = None
    pass_ms: list[float] | None = None
    error: str = ""

    @property
    def ran(self) -> bool:
        return not self.error and self.pass_ms is not None

    def ratio(self, q: int) -> float:
        """c(q) / c(1)."""
        return self.pass_ms[SEARCH_QS.index(q)] / self.pass_ms[0]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Trial":
        return cls(LlamaCppSettings(**data["settings"]), data.get("exactness"), data.get("pass_ms"),
                   data.get("error", ""))


def choose(trials: list[Trial], fixed: dict | None = None) -> Trial | None:
    """The configuration to run, among the trials that ran and match `fixed` (settings the user gave, by field
    name): the bit-identical ones (exactness 0.0) if any, else all of them (the caller says it is not exact);
    of those the lowest c(1), since plain decoding's step is what users compare with and every speculative
    ratio divides by it; one-token costs within TIE (3%) of the lowest are a tie, which the lowest c(4)/c(1)
    breaks (cheaper drafts). None when no trial qualifies."""
    fixed = fixed or {}
    pool = [t for t in trials if t.ran and all(getattr(t.settings, k) == v for k, v in fixed.items())]
    pool = [t for t in pool if t.exactness == 0.0] or pool
    if not pool:
        return None
    fastest = min(t.pass_ms[0] for t in pool)
    tied = [t for t in pool if t.pass_ms[0] <= fastest * (1 + TIE)]
    return min(tied, key=lambda t: (t.ratio(4), t.pass_ms[0]))


def settings_key(path: Path) -> dict:
    """What a search is valid for: this CPU and the cores this process may use, llama.cpp's version and matrix
    kernels (and the two-by-two patch), and the file (a fingerprint of its header and weights)."""
    import llama_cpp  # optional dependency: only the llama.cpp backend computes keys

    from hyflash.targets.llamacpp_build import file_fingerprint, matmul_kernels, two_by_two_kernels

    cpu, flags = cpu_description()
    key = {"cpu": cpu, "cpu_flags_sha256": flags, "cores": physical_cores(), "llama_cpp": llama_cpp.__version__,
           "kernels": matmul_kernels(), "gguf": file_fingerprint(Path(path))}
    if two_by_two_kernels():  # patched kernels time passes otherwise (a stock build's searches keep their keys)
        key["two_by_two"] = two_by_two_kernels()
    return key


def settings_folder() -> Path:
    """Beside the cost curves."""
    return cache_root() / "calibration" / "llamacpp-settings"


def settings_path(path: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return settings_folder() / f"{Path(path).stem}-{digest}.json"


def save_search(path: Path, precision: str, trials: list[Trial]) -> Path:
    """Cache a search's trials for the file at `path` (atomically); returns the cache file."""
    key = settings_key(path)
    out = settings_path(path, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    choice = choose(trials)
    atomic_write_json(out, {"version": FORMAT_VERSION, "key": key, "precision": precision,
                            "choice": None if choice is None else asdict(choice.settings),
                            "trials": [t.to_dict() for t in trials]})
    return out


def load_search(path: Path) -> tuple[str, list[Trial]] | None:
    """(precision, trials) of the cached search for the file at `path` on this machine, or None."""
    key = settings_key(path)
    cached = settings_path(path, key)
    if not cached.exists():
        return None
    try:
        data = json.loads(cached.read_text())
        if data.get("version") != FORMAT_VERSION or data["key"] != key:
            return None
        return data["precision"], [Trial.from_dict(t) for t in data["trials"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None  # a corrupt entry is as good as none: the defaults run


def user_fixed(given: dict, precision: str) -> dict:
    """The settings the user fixed, by LlamaCppSettings field: LlamaCppTarget options given (not None), and
    threads chosen in the environment (HYFLASH_THREADS / OMP_NUM_THREADS). An explicit "auto" cache type means
    what "auto" means for the file's `precision`."""
    from hyflash.targets.llamacpp_build import default_cache_types

    fixed = {}
    threads = given.get("n_threads") or chosen_threads()
    if threads:
        fixed["threads"] = int(threads)
    for name in ("flash_attn", "repack"):
        if given.get(name) is not None:
            fixed[name] = bool(given[name])
    auto = dict(zip(("cache_type_k", "cache_type_v"), default_cache_types(precision)))
    for name in ("cache_type_k", "cache_type_v"):
        if given.get(name):
            fixed[name] = auto[name] if given[name] == "auto" else given[name]
    return fixed


def searched_options(path: Path, given: dict) -> dict:
    """The target options a cached search chooses for the file at `path`, given the options the user gave
    (which win: the search's choice among the configurations that match them). {} without a cached search,
    or when no searched configuration matches: then llama.cpp's and hyflash's defaults run, as before."""
    if os.environ.get("HYFLASH_NO_SEARCHED_SETTINGS"):
        return {}
    found = load_search(path)
    if found is None:
        return {}
    precision, trials = found
    choice = choose(trials, user_fixed(given, precision))
    return {} if choice is None else choice.settings.options()
