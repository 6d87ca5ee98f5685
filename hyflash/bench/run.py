"""The benchmark runner: every method on the same prompts with the same target, in one process.

Methods are interleaved prompt by prompt (and their order rotates), so slow drift in machine load -- other
jobs on a shared CPU -- spreads over all methods instead of penalising whichever ran last. Speed-ups are
ratios of measurements from this one run, never against numbers from elsewhere.

results.json holds the configuration and machine, one record per (method, prompt, temperature), the
per-set summary, the draft-memory sweep, any method that failed (`errors`) and any that could not run here
(`skipped`, with the reason: llama.cpp peers without llama-cpp-python, Hugging Face methods on a llama.cpp
target). It is rewritten (atomically) after every prompt, so an interrupted run keeps what it measured.

With resume=True (`hyflash bench --resume`) a run continues the results.json already in its folder: records of
the same (temperature, set, prompt, method) are kept, so a stopped bench goes on where it stopped and a bench
grown by new drafters runs only those. The settings that shape a record (target, dtype, sets, prompts, lengths,
temperatures, seed, policy) must match, and a drafter whose weights changed is measured again. Kept records keep
their times: speed-ups then mix sessions, while tau and acceptance (what a drafter's quality is) do not depend
on the session.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import platform
import time
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from hyflash import engine
from hyflash.bench.datasets import DEFAULT_SETS, SETS, load_set
from hyflash.bench.memory import draft_memory_sweep, param_count, untrained_kinds
from hyflash.bench.methods import (
    BUILTIN_METHODS,
    PLAIN_METHODS,
    LoopMethod,
    PromptRun,
    build_methods,
    drafter_identity,
)
from hyflash.bench.replay import ReplayTarget, record_greedy
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json
from hyflash.machine import cpu_description
from hyflash.policy import PolicyConfig, SpeculationPolicy
from hyflash.sampling import SamplingConfig
from hyflash.targets import check_tree

PLAIN, HF_PLAIN, HF_PLD, LLAMACPP_PLAIN = "plain", "hf-plain", "hf-prompt-lookup", "llamacpp-plain"
# Greedy runs are checked token for token against these references: our plain loop, and llama-cpp-python's own
# loop on the same GGUF (which multi-token passes of K-quant kernels may not reproduce bit for bit).
GREEDY_REFERENCES = {PLAIN: "identical_to_plain", LLAMACPP_PLAIN: "identical_to_llamacpp_plain"}


@dataclass
class BenchConfig:
    model: str = "smollm2-135m"
    backend: str = "transformers"  # what runs the target (our loop's methods); llama.cpp: the GGUF itself
    target_options: dict[str, str] = field(default_factory=dict)  # llama.cpp's KV cache types (load_target)
    dtype: str = "auto"  # auto: the fastest for speculation on this machine (calibration); or bfloat16 / float32
    adaptive: bool = True  # draft length chosen per step from the cost curve (False: whole blocks)
    keep_drafter: bool = False  # never retire a trained drafter that does not pay (policy.py)
    trees: tuple[int, ...] = (0,)  # tree budgets; each trained drafter runs once per budget ("NAME@tN")
    sets: tuple[str, ...] = DEFAULT_SETS
    n: int = 5  # prompts per set
    max_new_tokens: int = 128
    repeats: int = 1  # timings per generation; the run of median decode time stands (_repeated)
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    methods: tuple[str, ...] = BUILTIN_METHODS
    drafters: dict[str, str] = field(default_factory=dict)  # name -> folder or 'default'
    pld_tokens: int = 10  # prompt lookup's draft length (HF prompt_lookup_num_tokens, llama.cpp num_pred_tokens)
    ngram_block: int = 8
    seed: int = 0
    memory_contexts: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    # Untrained drafters of these kinds x depths join the memory sweep only (bytes do not depend on weights).
    sweep_kinds: tuple[str, ...] = ("full", "local", "memory", "hyflash")
    sweep_depths: tuple[int, ...] = (1, 2)
    threads: int | None = None  # torch threads; None keeps torch's default
    # Where the transformers target (and so every drafter) runs: cpu, or cuda (tau does not depend on it; float32
    # there keeps greedy outputs equal to plain decoding only with TF32 off, which run_bench makes sure of).
    device: str = "cpu"
    # Acceptance replay (bench/replay.py): one recorded greedy decode per prompt, every drafter replayed against
    # it. tau, acceptance, draft time and memory as in a real run, at a fraction of the cost; no speeds.
    replay: bool = False

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 2:
            raise HyflashError("need --n >= 1 and --max-new-tokens >= 2 (tau needs a pass after the prefill)")
        if self.repeats < 1:
            raise HyflashError(f"--repeats must be >= 1, got {self.repeats}")
        unknown = [s for s in self.sets if s not in SETS]
        if unknown:
            raise HyflashError(f"unknown evaluation sets {unknown}: choose from {', '.join(SETS)}")
        if self.device not in ("cpu", "cuda"):
            raise HyflashError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.replay:
            wrong = [why for bad, why in (
                (self.temperatures != (0.0,), "--temperatures 0 (sampled text depends on the drafts)"),
                (self.adaptive, "--no-adaptive (an adaptive policy decides by timings a replay does not have)"),
                (self.repeats != 1, "--repeats 1 (a replay times nothing)"),
                (self.trees != (0,), "--tree 0 (a replay verifies chains)")) if bad]
            if wrong:
                raise HyflashError("--replay needs " + "; ".join(wrong))


# Few prompts, short outputs, one long set (4k, not 8k): a regression check that fits in ~10 minutes on 2 CPU
# cores even while they are shared with a training job (measured: docs/results.md).
QUICK = dict(n=2, max_new_tokens=32, sets=("humaneval", "code", "long-4k", "prose"), temperatures=(0.0, 1.0))


def quick(config: BenchConfig) -> BenchConfig:
    return replace(config, **QUICK)


def _llama_cpp_version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def machine_info() -> dict:
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_description()[0],  # lscpu's model name: results differ between CPUs
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp": _llama_cpp_version(),
        "loadavg_start": list(os.getloadavg()),
    }


def _record(run: PromptRun, prompt, temperature: float, seed: int) -> dict:
    out = asdict(run)
    out.update(
        set=prompt.set_name, item_id=prompt.item_id, source=prompt.source, chat=prompt.chat,
        temperature=temperature, seed=seed, new_tokens=run.new_tokens, tau=run.tau,
    )
    return out


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts), None if equal."""
    for k, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return k
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def compare_greedy(tokens: list[int], references: dict[str, list[int] | None]) -> dict:
    """A greedy run's equality with each reference that ran (GREEDY_REFERENCES), and where it first differs
    from llama-cpp-python's own loop."""
    out = {}
    for ref, reference in references.items():
        if reference is not None:
            out[GREEDY_REFERENCES[ref]] = tokens == reference
            if ref == LLAMACPP_PLAIN:
                out["first_difference_vs_llamacpp_plain"] = first_difference(tokens, reference)
    return out


def _sum_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[k] for x in lists if k < len(x)) for k in range(width)]


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def summarise(records: list[dict]) -> list[dict]:
    """One row per (temperature, set, method): pooled tau, tok/s, speed-ups from the same run."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["temperature"], r["set"], r["method"]), []).append(r)
    rows = []
    for (temperature, set_name, method), rs in groups.items():
        decode = sum(r["decode_time"] for r in rs)
        drafted = _sum_lists([r["drafted_by_position"] for r in rs])
        accepted = _sum_lists([r["accepted_by_position"] for r in rs])
        passes = sum(r["target_passes"] for r in rs)
        greedy = temperature == 0
        replayed = any(r.get("replayed") for r in rs)  # a replay's target passes are free: it has no speeds
        tokens = sum(r["new_tokens"] for r in rs)
        kv = [r["target_kv_bytes"] for r in rs if r["target_kv_bytes"] is not None]
        rows.append({
            "temperature": temperature, "set": set_name, "method": method, "prompts": len(rs),
            "prompt_tokens_mean": sum(r["prompt_tokens"] for r in rs) / len(rs),
            "new_tokens": tokens,
            "decode_time": decode,
            "tokens_per_second": None if replayed else tokens / decode if decode > 0 else float("nan"),
            "tau": sum(r["committed_after_prefill"] for r in rs) / passes if passes else float("nan"),
            "acceptance_by_position": [a / d if d else 0.0 for a, d in zip(accepted, drafted)],
            "draft_share": None if replayed else (sum(r["draft_time"] for r in rs) / decode if decode > 0
                                                  else float("nan")),
            "draft_memory_bytes": max(r["draft_memory_bytes"] for r in rs),
            "draft_sources": dict(sum((Counter(r.get("draft_sources") or {}) for r in rs), Counter())),
            "target_kv_bytes": max(kv) if kv else None,
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs),
            **{field: sum(bool(r.get(field)) for r in rs) if greedy and any(field in r for r in rs) else None
               for field in GREEDY_REFERENCES.values()},
            "speedup_ceiling": None if replayed else _mean([r.get("speedup_ceiling") for r in rs]),
        })
    # Speed-ups: ratios of tok/s to baselines measured in this run, same set, same temperature; and to the
    # fastest plain decoding of the run (ours, Hugging Face's or llama.cpp's), the figure a user can quote.
    by_key = {(r["temperature"], r["set"], r["method"]): r for r in rows}
    for row in rows:
        for baseline, column in ((PLAIN, "speedup"), (HF_PLAIN, "speedup_vs_hf_plain"), (HF_PLD, "speedup_vs_hf_pld"),
                                 (LLAMACPP_PLAIN, "speedup_vs_llamacpp_plain")):
            base = by_key.get((row["temperature"], row["set"], baseline))
            row[column] = _ratio(row["tokens_per_second"], base and base["tokens_per_second"])
        plains = [by_key[k] for k in ((row["temperature"], row["set"], m) for m in PLAIN_METHODS)
                  if k in by_key and by_key[k]["tokens_per_second"] is not None]
        fastest = max(plains, key=lambda r: r["tokens_per_second"], default=None)
        # How much of the machine's margin was taken: (speed-up - 1) / (ceiling - 1), the ceiling being the best
        # speed-up the measured pass costs allow the drafter's measured acceptance (policy.ceiling).
        ceiling = row["speedup_ceiling"]
        row["ceiling_share"] = ((row["speedup"] - 1) / (ceiling - 1)
                                if row["speedup"] is not None and ceiling and ceiling > 1 else None)
        row["fastest_plain"] = fastest["method"] if fastest else None
        row["speedup_vs_fastest_plain"] = _ratio(row["tokens_per_second"], fastest and fastest["tokens_per_second"])
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    set_order = {s: i for i, s in enumerate(SETS)}
    rows.sort(key=lambda r: (r["temperature"], set_order.get(r["set"], 99), order[r["method"]]))
    return rows


def run_bench(
    config: BenchConfig,
    target=None,
    out_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
    command: str = "",
    resume: bool = False,
) -> dict:
    """Run every method on every prompt; return (and write, with out_dir) the results dictionary.
    resume: keep the matching records of out_dir's results.json and run only what it lacks (module doc)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    started = time.time()
    check_tree(config.backend if target is None else target.backend, config.trees)
    if target is None:
        # Calibrated for (and, on llama.cpp, recording features for) the first trained drafter, else n-gram.
        drafter = next(iter(config.drafters.values()), "ngram")
        target, choice = engine.prepare(config.model, config.dtype, config.backend, drafter,
                                        calibrated=config.adaptive, log=log, target_options=config.target_options)
    else:  # a target handed in (tests): its dtype, and a flat cost curve unless one is cached
        choice = engine.DtypeChoice(target.precision, "the target given", None)
    if config.device == "cuda":
        _to_cuda(target)
    curve = choice.curve if config.adaptive else None

    def make_policy(tree: int = 0):
        return SpeculationPolicy(curve, PolicyConfig.for_run(config.adaptive, tree, config.keep_drafter))

    methods = build_methods(config.methods, config.drafters, target, config.pld_tokens, config.ngram_block,
                            make_policy, config.trees)
    results = {
        "meta": {
            "command": command, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(), "target": target.name, "backend": target.backend, "config": asdict(config),
            **choice.to_dict(),
            "cost_curve": None if choice.curve is None else choice.curve.to_dict(),
        },
        "runs": [], "summary": [], "memory_sweep": {}, "errors": {}, "skipped": {},
    }
    out_dir = Path(out_dir) if out_dir else None

    def save() -> None:
        results["summary"] = summarise(results["runs"])
        results["meta"]["machine"]["loadavg_end"] = list(os.getloadavg())
        results["meta"]["seconds"] = round(time.time() - started, 1)
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out_dir / "results.json", results)

    prompts = {name: load_set(name, target, config.n, config.max_new_tokens) for name in config.sets}
    methods = _skip_unavailable(methods, target, results["skipped"], log)
    if config.replay:  # a replay plays our loop's target; other libraries' loops run their own
        for m in [m for m in methods if not isinstance(m, LoopMethod)]:
            results["skipped"][m.name] = "--replay runs hyflash's own loop only"
            log(f"method {m.name} skipped: {results['skipped'][m.name]}")
        methods = [m for m in methods if isinstance(m, LoopMethod)]
    methods = _warm_up(methods, target, next(iter(prompts.values()))[0].ids, results["errors"], log)
    kept = {m.name for m in methods}
    results["meta"]["drafters"] = {n: drafter_identity(s, target) for n, s in config.drafters.items()
                                  if any(k == n or k.startswith(f"{n}@t") for k in kept)}
    kept_records = _resumable_records(out_dir, results["meta"], kept, log) if resume and out_dir else {}

    for temperature in config.temperatures:
        sampling = SamplingConfig(temperature=temperature)
        for set_name, items in prompts.items():
            for i, prompt in enumerate(items):
                seed = config.seed + i
                key = (temperature, set_name, prompt.item_id)
                order = [m for m in methods[i % len(methods):] + methods[: i % len(methods)]
                         if (*key, m.name) not in kept_records]
                if not order:  # resumed: every method's record on this prompt is kept
                    runs = {}
                elif config.replay:
                    runs = _replayed(order, target, list(prompt.ids), config.max_new_tokens)
                else:
                    runs = _repeated(order, config.repeats,
                                     lambda m: m.run(target, list(prompt.ids), config.max_new_tokens, sampling, seed))
                references = {ref: runs[ref].tokens if ref in runs else kept_records.get((*key, ref), {}).get("tokens")
                              for ref in GREEDY_REFERENCES}
                for m in methods:  # records in the configured order, whatever order they ran in
                    if m.name not in runs:
                        results["runs"].append(kept_records[(*key, m.name)])
                        continue
                    record = _record(runs[m.name], prompt, temperature, seed)
                    if config.replay:
                        record["replayed"] = True  # its text is the recording's by construction: nothing to compare
                    elif sampling.greedy:
                        record.update(compare_greedy(runs[m.name].tokens, references))
                    results["runs"].append(record)
                if runs:
                    log(_progress_line(set_name, prompt, temperature, runs))
                    save()
    save()

    if config.memory_contexts:
        drafters = {m.name: m.drafter() for m in methods if isinstance(m, LoopMethod) and m.drafter() is not None}
        drafters.update(untrained_kinds(target, config.sweep_kinds, config.sweep_depths))
        log(f"draft-memory sweep of {', '.join(drafters)} over contexts {list(config.memory_contexts)} ...")
        results["memory_sweep"] = draft_memory_sweep(drafters, target, list(config.memory_contexts))
        results["drafter_params"] = {name: param_count(d) for name, d in drafters.items()}
    save()
    return results


def _replayed(order: list, target, prompt_ids: list[int], max_new_tokens: int) -> dict:
    """{method name: its PromptRun} on one prompt by acceptance replay: one recorded greedy decode, then every
    method (our loop's, the only ones a replay can run) against the recording."""
    recording, _ = record_greedy(target, prompt_ids, max_new_tokens)
    replay = ReplayTarget(target, recording)
    return {m.name: m.run(replay, prompt_ids, max_new_tokens, SamplingConfig(), 0) for m in order}


def _repeated(order: list, repeats: int, run: Callable) -> dict:
    """{method name: its PromptRun} on one prompt. With repeats > 1 each method runs `repeats` times, the order
    rotated each round (so a drift in the machine's speed spreads over the methods), each time from the policy
    state it had before the first (a repeat times the same generation, not one that learned from the others),
    and its run of median decode time stands, with all the times in `decode_times`. What the policy learned in
    the first run carries on to the next prompt, as without repeats."""
    if repeats == 1:
        return {m.name: run(m) for m in order}
    start = {m.name: copy.deepcopy(getattr(m, "policy", None)) for m in order}
    after_first, timed = {}, {m.name: [] for m in order}
    for r in range(repeats):
        for m in order[r % len(order):] + order[: r % len(order)]:
            if start[m.name] is not None:
                m.policy = copy.deepcopy(start[m.name])
            timed[m.name].append(run(m))
            if r == 0:
                after_first[m.name] = getattr(m, "policy", None)
    out = {}
    for m in order:
        if after_first[m.name] is not None:
            m.policy = after_first[m.name]
        runs = timed[m.name]
        median = sorted(runs, key=lambda x: x.decode_time)[len(runs) // 2]
        out[m.name] = replace(median, decode_times=[x.decode_time for x in runs])
    return out


# What a record depends on besides its method: a resumed bench must match the earlier one in all of these.
RECORD_SETTINGS = ("model", "backend", "target_options", "dtype", "adaptive", "keep_drafter", "sets", "n",
                   "max_new_tokens", "temperatures", "seed", "pld_tokens", "ngram_block", "replay")


def _default(setting: str):
    """A BenchConfig setting's default: what a bench written before the setting existed ran with."""
    f = BenchConfig.__dataclass_fields__[setting]
    return f.default_factory() if f.default is MISSING else f.default


def settings_differ(meta: dict, other: dict) -> list[str]:
    """The settings (RECORD_SETTINGS, and the target) in which two benches' meta differ: none, and their records
    can stand side by side (a bench resumed, or benches of one grid made in several sessions)."""
    config, other_config = meta.get("config") or {}, other.get("config") or {}
    differ = [k for k in RECORD_SETTINGS
              if json.dumps(config.get(k, _default(k))) != json.dumps(other_config.get(k, _default(k)))]
    return differ + (["target"] if meta.get("target") != other.get("target") else [])


def _resumable_records(out_dir: Path, meta: dict, methods: set[str], log) -> dict[tuple, dict]:
    """(temperature, set, item_id, method) -> the record out_dir/results.json holds for it, for every method that
    runs now with the same identity (a drafter with other weights is measured again)."""
    path = out_dir / "results.json"
    if not path.exists():
        return {}
    try:
        earlier = json.loads(path.read_text())
        old_meta, records = earlier["meta"], earlier["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HyflashError(f"--resume: {path} cannot be read ({exc}); "
                           "rerun without --resume or use another --out") from exc
    differ = settings_differ(old_meta, meta)
    if differ:
        raise HyflashError(f"--resume: {path} was measured with other settings ({', '.join(differ)}); "
                           "run with the same ones, or use another --out")

    def same(name: str) -> bool:
        base = name.split("@t")[0]  # a tree variant NAME@tN is the drafter NAME's
        old, new = old_meta.get("drafters", {}).get(base), meta["drafters"].get(base)
        return name in methods and (old or {}).get("sha256") == (new or {}).get("sha256")

    kept = {(r["temperature"], r["set"], r["item_id"], r["method"]): r for r in records if same(r["method"])}
    meta["resumed"] = [*old_meta.get("resumed", []), {"date": old_meta.get("date"), "seconds": old_meta.get("seconds"),
                                                      "records_kept": len(kept)}]
    log(f"resuming {path}: {len(kept)} of its {len(records)} records kept")
    return kept


def _to_cuda(target) -> None:
    """The target onto the GPU, in float32 without TF32: TF32 matrix products round differently in a block
    verification than in one-token decoding, and greedy speculative output must equal plain decoding."""
    if target.backend != "transformers":
        raise HyflashError(f"--device cuda runs the transformers backend, not {target.backend}")
    if not torch.cuda.is_available():
        raise HyflashError(f"--device cuda: torch {torch.__version__} sees no CUDA device; use --device cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target.model.to("cuda")


def _skip_unavailable(methods, target, skipped: dict, log) -> list:
    """Methods that cannot run here (no llama-cpp-python, no GGUF, a backend they do not support) are noted in
    `skipped` with their reason, not failed."""
    kept = []
    for m in methods:
        reason = m.unavailable(target)
        if reason:
            skipped[m.name] = reason
            log(f"method {m.name} skipped: {reason}")
        else:
            kept.append(m)
    return kept


def _warm_up(methods, target, prompt_ids, errors: dict, log) -> list:
    """One short untimed run per method: loads drafters and pays first-call costs before any timing.
    A method that fails here (say, a drafter folder that does not load) is dropped and reported."""
    kept = []
    for m in methods:
        try:
            m.run(target, list(prompt_ids)[:64], 4, SamplingConfig(), 0)
            kept.append(m)
        except Exception as exc:  # noqa: BLE001 - one bad drafter must not sink the whole benchmark
            errors[m.name] = f"{type(exc).__name__}: {exc}"
            log(f"method {m.name} dropped: {errors[m.name]}")
    if not kept:
        raise HyflashError(f"every method failed to run: {errors}")
    return kept


def _progress_line(set_name, prompt, temperature, runs: dict[str, PromptRun]) -> str:
    parts = [f"{name} {r.new_tokens / r.decode_time if r.decode_time else 0:.1f}t/s tau {r.tau:.2f}" for name, r in runs.items()]
    return f"[T={temperature} {set_name} {prompt.item_id} ({len(prompt.ids)} tok)] " + " | ".join(parts)
