"""Measure what speculation costs on this machine: the target's cached-pass cost curve and the drafter's step.

Speculation pays only when verifying q tokens costs less than q plain steps would. How much less differs by
machine and dtype (on a Zen 3 CPU without native bf16, a 16-token bf16 pass costs 7 plain steps; on a Xeon
with AMX, 1.4), so nothing is assumed: `calibrate` times c(q) = one cached target pass over q tokens, q = 1..16,
at context lengths up to 4k tokens (the decoding loop extrapolates beyond and corrects online: costs.py),
the one-token step of plain decoding (no features), and the drafter's draft and ingest steps, for each dtype
asked. Results are cached per machine (CPU model and flags, threads, torch version, model, dtype), backend
(transformers: its version; llama.cpp: its version, a fingerprint of the GGUF file and the settings that
change a pass's cost) and drafter (what it measured: its weights and config hash, or none), so it runs once,
curves of the two backends never mix, and a drafter's step time never reaches a request without it. On llama.cpp the GGUF's own quantisation runs:
there is one curve per file, under dtype "auto".

`hyflash calibrate` prints the table and draws the curves; `policy.py` turns them into decisions.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hyflash.costs import CostCurve
from hyflash.drafters.registry import build_drafter, fingerprint, needs_features
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json
from hyflash.machine import cpu_description, cpu_times, others_cpu_share
from hyflash.sampling import SamplingConfig
from hyflash.targets import cache_root, identity, load_target

BUSY_LIMIT = 0.25  # the share of the CPU other processes may take while a curve is timed for it to be cached
FORMAT_VERSION = 5  # 2: feature_ms; 3: plain_ms, contexts to 4k, the drafter in the key; 4: drafter timed after a pass;
# 5: plain_ms at most c(1)
# 64: below the first measured context the curve is flat, and a one-token llama.cpp Q4_1 pass costs ~2 ms
# (~17%) less at 64 tokens of context than at 256, so chat-length prompts were costed as if 256 tokens long.
# 4096: a 5k-token prompt was costed as 1k tokens long (issue 36); beyond the last, the curve extrapolates.
DEFAULT_CONTEXTS = (64, 256, 1024, 4096)
DRAFTER_CONTEXT = 256  # a drafter's step is timed with its window full (the shipped drafter reads 256 tokens)
_clock = time.perf_counter  # a module attribute, so tests can give measure_target a clock of their own
MAX_Q = 16


def machine_key(model: str, dtype: str, target=None, drafter: str = "none") -> dict:
    """What a cost curve is valid for: this machine, the target's `identity()` (a transformers target needs
    nothing loaded: its key is versions only; a llama.cpp target adds its library, file and settings) and the
    drafter whose steps it timed (registry.fingerprint: its pass costs also depend on whether features are
    recorded)."""
    cpu, flags = cpu_description()
    key = {
        "cpu": cpu,
        "cpu_flags_sha256": flags,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "model": model,
        "dtype": dtype,
        "drafter": drafter,
    }
    key.update(identity(dtype, target))
    return key


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    name = f"{key['model'].replace('/', '_')}-{key['backend']}-{key['dtype']}-{digest}.json"
    return cache_root() / "calibration" / name


def _median_ms(fn, reps: int, before=None) -> float:
    """The median time of fn() over reps calls; before(), untimed, runs ahead of each."""
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = _clock()
        fn()
        times.append((_clock() - t0) * 1000)
    return statistics.median(times)


@torch.inference_mode()
def measure_target(target, contexts=DEFAULT_CONTEXTS, max_q: int = MAX_Q, reps: int = 3,
                   features: bool = True) -> list[list[float]]:
    """pass_ms[i][q-1] for q = 1..max_q at each context length (token ids are arbitrary: cost does not
    depend on them). Features are recorded as in speculative decoding.

    Every ratio the policy reads divides by c(1), so c(1) gets the most samples: a one-token pass is timed
    again after every other pass. And the q's are timed in rounds (1, 2, ..., max_q, then again), not one q
    after another, so a machine that speeds up or slows down while it is measured moves every q alike instead
    of bending the curve. (Timed q after q with 3 reps, c(1) on a llama.cpp Q4_1 file came out 12.3-12.7 ms at
    256 tokens of context, where the decoding loop's own one-token passes took 10.6.)"""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in contexts:
        context = min(context, target.max_context - max_q - 1)
        ids = torch.randint(0, target.vocab_size, (context + max_q,), generator=gen)
        target.prefill(ids[:context], features=False, feature_free=not features)
        for q in (1, 2):  # warm-up: first calls pay one-off costs
            _timed_pass(target, ids[context : context + q], features, context)
        times: list[list[float]] = [[] for _ in range(max_q)]
        for _ in range(reps):
            for q in range(1, max_q + 1):
                times[q - 1].append(_timed_pass(target, ids[context : context + q], features, context))
                if q > 1:
                    times[0].append(_timed_pass(target, ids[context : context + 1], features, context))
        rows.append([statistics.median(t) for t in times])
    target.reset()
    return rows


def _timed_pass(target, block: torch.Tensor, features: bool, context: int) -> float:
    """ms of one cached target pass over `block` after `context` tokens (the cache is put back after it)."""
    t0 = _clock()
    target.score(block, features=features)
    ms = (_clock() - t0) * 1000
    target.rollback(context)
    return ms


def usable_contexts(target, contexts, max_q: int = MAX_Q) -> list[int]:
    """The contexts that fit the target with a max_q-token pass on top (a short model's longest is cut)."""
    return sorted({min(int(c), target.max_context - max_q - 1) for c in contexts})


@torch.inference_mode()
def measure_plain(target, contexts, reps: int = 7) -> list[float]:
    """ms of one step of plain decoding at each context: a one-token pass with no features in a sequence
    prefilled feature-free (llama.cpp: the context without the eval callback), as `--drafter none` runs."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for context in contexts:
        ids = torch.randint(0, target.vocab_size, (context + 1,), generator=gen)
        target.prefill(ids[:context], features=False, feature_free=True)
        _timed_pass(target, ids[context:], False, context)  # warm-up
        out.append(statistics.median(_timed_pass(target, ids[context:], False, context) for _ in range(reps)))
    target.reset()
    return out


@torch.inference_mode()
def measure_exactness(target, contexts=(300, 1000), q: int = 8) -> float:
    """max |logit difference| between one q-token pass and q one-token passes over the same tokens, after each
    context (0.0: bit-identical; otherwise a near-tie can flip a greedy token between speculative and plain
    decoding: multi-token matrix products or attention may round differently, e.g. llama.cpp K-quant files or
    an F16 K cache over 512+ cells)."""
    worst = 0.0
    gen = torch.Generator().manual_seed(4)
    for context in usable_contexts(target, contexts, q):
        ids = torch.randint(0, target.vocab_size, (context + q,), generator=gen)
        target.prefill(ids[:context], features=False, feature_free=True)
        block = target.score(ids[context:], features=False).logits
        target.rollback(context)
        singles = torch.cat([target.score(ids[context + i : context + i + 1], features=False).logits
                             for i in range(q)])
        worst = max(worst, float((block.float() - singles.float()).abs().max()))
    target.reset()
    return worst


@torch.inference_mode()
def measure_feature_ms(target, context: int, reps: int = 15) -> float:
    """What recording features adds to a one-token pass: the median of paired differences, each a pass with
    features next to one without (in alternating order), so drift cancels within a pair. Two medians taken one
    after the other read 0.4-1.8 ms on the same llama.cpp file within an hour."""
    context = min(context, target.max_context - 2)
    ids = torch.randint(0, target.vocab_size, (context + 1,), generator=torch.Generator().manual_seed(2))
    target.prefill(ids[:context], features=False)
    block = ids[context:]
    for features in (True, False):  # warm-up
        _timed_pass(target, block, features, context)
    diffs = []
    for r in range(reps):
        order = (True, False) if r % 2 == 0 else (False, True)
        ms = {features: _timed_pass(target, block, features, context) for features in order}
        diffs.append(ms[True] - ms[False])
    target.reset()
    return max(0.0, statistics.median(diffs))


@torch.inference_mode()
def measure_drafter(target, drafter, context: int = DRAFTER_CONTEXT, reps: int = 15) -> tuple[float, float]:
    """(ms per drafted block, ms per ingested token) of a drafter after `context` tokens of real features, each
    timed right after a one-token target pass, as the decoding loop runs them: the pass sweeps the CPU's caches,
    and timed back to back instead, the SmolLM2 drafter's ingest read 0.57 ms on llama.cpp (AMD EPYC Zen 3, 2
    cores) where the loop's steps paid ~1.0-1.1 ms, which moved the start decision's break-even at 128 tokens
    from 0.83 to 0.79, under start_retired_above."""
    ids = torch.randint(0, target.vocab_size, (context + 1,), generator=torch.Generator().manual_seed(1))
    out = target.prefill(ids[:context], features=drafter.needs_features)
    drafter.reset()
    drafter.ingest(ids[:context], out.features)

    def a_pass() -> None:  # a verification step's pass, rolled back (the drafter does not see it)
        target.score(ids[context:], features=drafter.needs_features)
        target.rollback(context)

    greedy = SamplingConfig()
    drafter.draft(int(ids[-1]), drafter.block_size - 1, greedy, None)  # warm-up
    draft_ms = _median_ms(lambda: drafter.draft(int(ids[-1]), drafter.block_size - 1, greedy, None), reps, a_pass)
    one = None if out.features is None else out.features[-1:]
    # Ingest grows the drafter's state; the cost of one token is what a verification step adds.
    ingest_ms = _median_ms(lambda: drafter.ingest(ids[-1:], one), reps, a_pass)
    target.reset()
    return draft_ms, ingest_ms


def _drafter_key(spec: str | None, model: str) -> str:
    """The drafter part of the cache key: what will be measured (the default drafter missing from an install
    is measured as no drafter, as `calibrate` does)."""
    try:
        return fingerprint(spec, model)
    except HyflashError:
        if spec != "default":
            raise
        return "none"


def calibrate(model: str, dtype: str, drafter_spec: str | None = "default", contexts=DEFAULT_CONTEXTS,
              reps: int = 3, use_cache: bool = True, target=None, announce=None,
              backend: str = "transformers", target_options: dict | None = None) -> tuple[CostCurve, bool]:
    """The cost curve of (model, dtype) on `backend` on this machine: from the cache, else measured and cached.
    Returns (curve, measured_now); `announce(line)` is told before a measurement starts.

    On llama.cpp, dtype is "auto" and the target is loaded first (well under a second): its file and settings
    are part of the key. It records features only if the drafter reads them (registry.needs_features)."""
    if target is None and backend != "transformers":
        target = load_target(model, dtype, backend, record_features=needs_features(drafter_spec, model),
                             **(target_options or {}))
    key = machine_key(model, dtype, target, _drafter_key(drafter_spec, getattr(target, "name", model)))
    path = cache_path(key)
    if use_cache and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("version") == FORMAT_VERSION and data["curve"]["machine"] == key:
                return CostCurve.from_dict(data["curve"]), False
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            pass  # a corrupt cache entry is simply measured again
    target = target or load_target(model, dtype, backend, **(target_options or {}))
    drafter = None
    if drafter_spec:
        try:
            drafter = build_drafter(drafter_spec, target, quiet=True)
        except HyflashError:
            # The default drafter only adds its step time to the curve; a drafter the caller named (a folder
            # built for another target, say) is an error to report now, not after the measurement.
            if drafter_spec != "default":
                raise
    if announce:
        announce(f"hyflash: measuring {model} {describe(dtype, backend)} on this machine (about a minute, once) ...")
    features = drafter is None or drafter.needs_features
    contexts = usable_contexts(target, contexts)
    started = cpu_times()
    pass_ms = measure_target(target, contexts, reps=reps, features=features)
    # A plain step is a one-token pass without features, so never dearer than c(1): a measurement that says so
    # was disturbed (on a Zen 3, 47.6 ms at 4k tokens against c(1) 41.8 and 26-31 when timed again), and the
    # curve extrapolates beyond its last context along that error.
    plain_ms = [min(p, row[0]) for p, row in zip(measure_plain(target, contexts, reps=2 * reps + 1), pass_ms)]
    draft_ms = ingest_ms = feature_ms = None
    if drafter is not None:
        draft_ms, ingest_ms = measure_drafter(target, drafter, min(DRAFTER_CONTEXT, max(contexts)))
    if features:
        feature_ms = measure_feature_ms(target, contexts[0], reps=5 * reps)
    curve = CostCurve(model, target.precision, contexts, pass_ms, draft_ms, ingest_ms, key, feature_ms, plain_ms,
                      measure_exactness(target))
    # A curve timed while other processes had the CPU is slower than the machine (a Zen 3 curve cached so put a
    # plain step at 4k tokens at 47.6 ms, 25-31 ms when timed again), and a cached one is used until --force:
    # so it serves this run only, and the next run measures again.
    busy = others_cpu_share(started, cpu_times())
    if busy is not None and busy > BUSY_LIMIT:
        if announce:
            announce(f"hyflash: other processes used {busy:.0%} of the CPU while {model} was timed, so these costs "
                     "are used for this run but not cached; they are measured again next time (run on an idle "
                     "machine, or `hyflash calibrate --force` then)")
        return curve, True
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"version": FORMAT_VERSION, "curve": curve.to_dict()})
    return curve, True


def describe(dtype: str, backend: str = "transformers") -> str:
    """'in bfloat16', or 'on llama.cpp' (which runs the GGUF's own quantisation): for messages."""
    return f"in {dtype}" if backend == "transformers" else f"on {backend}"


def table(curves: list[CostCurve]) -> str:
    """Markdown: c(q) in ms (and in plain steps) for q in a few columns, per dtype and context."""
    qs = [q for q in (1, 2, 3, 4, 6, 8, 12, 16) if q <= min(c.max_q for c in curves)]
    lines = ["| dtype | context | " + " | ".join(f"q={q}" for q in qs)
             + " | draft block | ingest/token | features/pass |", "|---|---|" + "---|" * len(qs) + "---|---|---|"]
    for c in curves:
        for context in c.contexts:
            base = c.cost(1, context)
            cells = [f"{c.cost(q, context):.1f} ms" + ("" if q == 1 else f" ({c.cost(q, context) / base:.2f}x)")
                     for q in qs]
            draft = "-" if c.draft_ms is None else f"{c.draft_ms:.1f} ms"
            ingest = "-" if c.ingest_ms is None else f"{c.ingest_ms:.2f} ms"
            feature = "-" if c.feature_ms is None else f"{c.feature_ms:.2f} ms"
            lines.append(f"| {c.dtype} | {context} | " + " | ".join(cells) + f" | {draft} | {ingest} | {feature} |")
    return "\n".join(lines)


def exactness_line(curve: CostCurve) -> str:
    """What the exactness check found, for the calibrate command's report."""
    machine = curve.machine
    what = f"{curve.model} {curve.dtype} ({machine.get('backend', '?')})"
    if "cache_types" in machine:  # llama.cpp: the settings it ran with (calibrate --search-config chooses them)
        k, v = machine["cache_types"]
        what = (f"{curve.model} {curve.dtype} ({machine['backend']}: {machine['threads']} threads, flash attention "
                f"{'on' if machine['flash_attn'] else 'off'}, K {k} / V {v}"
                + ("" if "repack" not in machine else f", {'repacked' if machine['repack'] else 'plain'} weights "
                   "(not the build's default)")
                + (", ggml's two-by-two kernels (patches/)" if machine.get("two_by_two") else "")
                + ")")
    if curve.exactness is None:
        return f"{what}: exactness not checked (calibrate --force checks it)"
    verdict = ("bit-identical: speculative greedy text equals plain decoding's" if curve.exactness == 0 else
               "not bit-identical: a near-tie can flip a greedy token between speculative and plain decoding")
    return f"{what}: an 8-token pass vs 8 one-token passes, max |logit difference| {curve.exactness:.3g}, {verdict}"


def plot(curves: list[CostCurve], path: Path) -> Path:
    import matplotlib  # here: only `hyflash calibrate` draws, and generate should not pay for the import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for c in curves:
        for context in c.contexts:
            qs = list(range(1, c.max_q + 1))
            ax.plot(qs, [c.cost(q, context) for q in qs], marker="o", ms=3, label=f"{c.dtype}, context {context}")
    ax.set_xlabel("tokens in one cached target pass (q)")
    ax.set_ylabel("ms per pass")
    cpu = curves[0].machine.get("cpu", "?") if curves else "?"
    ax.set_title(f"{curves[0].model if curves else ''} on {cpu}, {curves[0].machine.get('threads', '?')} threads",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
