"""The decoding methods a benchmark compares, behind one call: run(prompt_ids, ...) -> PromptRun.

Three families, timed the same way (prefill excluded: decode time = end - end of the prompt's forward pass):
  LoopMethod      our decoding loop (hyflash.decoding.generate) with no drafter, the n-gram drafter, or a
                  trained drafter; tau and acceptance by position come from the loop itself
  HFMethod        Hugging Face `model.generate` on the same model object, plain or with prompt-lookup
                  decoding (`prompt_lookup_num_tokens`). HF does not report its passes, so a forward hook
                  counts target passes; tau = (new tokens - 1) / (passes - 1) is then the same quantity as our
                  loop's (tokens committed per verification pass, the first token from the prefill excluded).
  LlamaCppMethod  llama-cpp-python's own loop on the GGUF of the same model, plain or with its prompt lookup:
                  the fastest plain decoding a CPU user already has. Passes are counted the same way.
A method that cannot run on this target or install says why (`unavailable`) and is skipped, not failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from hyflash.decoding import generate
from hyflash.drafters import registry
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.targets import gguf_path
from hyflash.targets.llamacpp_build import file_fingerprint

try:  # current RSS; the peak comes from getrusage, which needs nothing installed
    import psutil
except ImportError:  # pragma: no cover - psutil is in the venv, but the suite must not need it
    psutil = None


@dataclass
class PromptRun:
    """One method on one prompt at one temperature."""

    method: str
    tokens: list[int]
    prompt_tokens: int
    target_passes: int  # passes after the prefill
    committed_after_prefill: int  # tokens committed by those passes (new tokens - 1)
    prefill_time: float
    decode_time: float
    decode_times: list[float] = field(default_factory=list)  # each timing, with --repeats (decode_time: the median)
    cached_prompt_tokens: int = 0  # prompt tokens the prefill took from the cache (a repeat, or the method before)
    draft_time: float = 0.0
    verify_time: float = 0.0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    draft_memory_bytes: int = 0  # draft-side state at the end of generation
    draft_sources: dict = field(default_factory=dict)  # source -> passes that verified its draft (hybrid)
    drafter_retired_at: int | None = None  # pass at which the policy retired the trained drafter (0: from the start)
    speedup_ceiling: float | None = None  # the best speed-up the measured costs and acceptance allow (policy.ceiling)
    guard: dict | None = None  # the guard's fall-backs and plain steps (policy.Guard.stats)
    target_kv_bytes: int | None = None  # the target's own KV cache at the end (measured, for scale) ...
    target_kv_tokens: int | None = None  # ... holding this many tokens
    rss_bytes: int | None = None  # process RSS right after this run
    peak_rss_bytes: int = 0  # process-wide peak so far (getrusage cannot isolate one method)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tau(self) -> float:
        return self.committed_after_prefill / self.target_passes if self.target_passes else float("nan")


def process_memory() -> tuple[int | None, int]:
    """(current RSS bytes or None without psutil, peak RSS bytes of the process so far)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    current = psutil.Process().memory_info().rss if psutil is not None else None
    return current, peak


class Method:
    name: str

    def unavailable(self, target) -> str | None:
        """Why this method cannot run with `target` or this install (it is then skipped), else None."""
        return None

    def run(self, target, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig, seed: int) -> PromptRun:
        raise NotImplementedError


def _timed_passes_run(name: str, tokens: list[int], prompt_ids, start: float, end: float,
                      pass_ends: list[float]) -> PromptRun:
    """A PromptRun of a library's own loop whose passes were timed as they ended (the first is the prefill)."""
    rss, peak = process_memory()
    prefill_end = pass_ends[0] if pass_ends else start
    return PromptRun(
        method=name,
        tokens=tokens,
        prompt_tokens=len(prompt_ids),
        target_passes=max(0, len(pass_ends) - 1),
        committed_after_prefill=max(0, len(tokens) - 1),
        prefill_time=prefill_end - start,
        decode_time=end - prefill_end,
        verify_time=end - prefill_end,  # a library's draft lookup is inside its loop; it is not timed apart
        draft_memory_bytes=0,  # prompt lookup searches the token ids the loop already holds
        rss_bytes=rss,
        peak_rss_bytes=peak,
    )


class LoopMethod(Method):
    """Our loop; `make_drafter` returns None for plain decoding. The drafter is built once and reused
    (generate() resets it per prompt), as a user would."""

    def __init__(self, name: str, make_drafter: Callable[[], object | None], measure_target_kv: bool = False,
                 policy=None):
        self.name = name
        self.make_drafter = make_drafter
        self.measure_target_kv = measure_target_kv
        self.policy = policy  # one per method, kept across prompts (what it learns carries over, as for a user)
        self._drafter = None
        self._built = False

    def drafter(self):
        if not self._built:
            self._drafter, self._built = self.make_drafter(), True
        return self._drafter

    def run(self, target, prompt_ids, max_new_tokens, sampling, seed) -> PromptRun:
        result = generate(target, prompt_ids, self.drafter(), max_new_tokens=max_new_tokens, sampling=sampling,
                          seed=seed, policy=self.policy)
        rss, peak = process_memory()
        return PromptRun(
            method=self.name,
            tokens=list(result.tokens),
            prompt_tokens=result.prompt_tokens,
            target_passes=result.target_passes,
            committed_after_prefill=sum(result.committed_per_pass),
            prefill_time=result.prefill_time,
            decode_time=result.total_time - result.prefill_time,
            cached_prompt_tokens=result.cached_prompt_tokens,
            draft_time=result.draft_time,
            verify_time=result.verify_time,
            drafted_by_position=list(result.drafted_by_position),
            accepted_by_position=list(result.accepted_by_position),
            draft_memory_bytes=result.draft_memory_bytes,
            draft_sources=dict(result.policy.get("draft_sources", {})),
            drafter_retired_at=result.policy.get("expensive_drafter_retired_at_step"),
            speedup_ceiling=result.speedup_ceiling,
            guard=result.policy.get("guard"),
            target_kv_bytes=target.kv_bytes() if self.measure_target_kv else None,
            target_kv_tokens=target.cache_length if self.measure_target_kv else None,
            rss_bytes=rss,
            peak_rss_bytes=peak,
        )


class HFMethod(Method):
    """transformers' own generate(); prompt_lookup_tokens=None is plain HF decoding (the like-for-like
    baseline for HF prompt lookup, since HF's loop has its own overheads)."""

    def __init__(self, name: str, prompt_lookup_tokens: int | None = None, max_matching_ngram: int = 2):
        self.name = name
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.max_matching_ngram = max_matching_ngram

    def unavailable(self, target) -> str | None:
        if target.backend != "transformers":
            return f"Hugging Face generate needs the transformers backend; this target runs on {target.backend}"
        return None

    def _config(self, target, max_new_tokens: int, sampling: SamplingConfig):
        from transformers import GenerationConfig

        eos = sorted(target.eos_token_ids) or None
        # Sampling needs explicit top_k=0 / top_p=1: unset values are filled from transformers' defaults
        # (top_k=50). Greedy leaves them unset (transformers warns that they are ignored).
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_k=None if sampling.greedy else sampling.top_k,
            top_p=None if sampling.greedy else sampling.top_p,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else 0,
            prompt_lookup_num_tokens=self.prompt_lookup_tokens,
            max_matching_ngram_size=self.max_matching_ngram if self.prompt_lookup_tokens else None,
        )

    def run(self, target, prompt_ids, max_new_tokens, sampling, seed) -> PromptRun:
        model = target.model
        config = self._config(target, max_new_tokens, sampling)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
        pass_ends: list[float] = []
        hook = model.register_forward_hook(lambda *_: pass_ends.append(time.perf_counter()))
        try:
            torch.manual_seed(seed)
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            end = time.perf_counter()
        finally:
            hook.remove()
        tokens = [int(t) for t in out[0, ids.shape[1] :]]
        return _timed_passes_run(self.name, tokens, prompt_ids, start, end, pass_ends)


def target_gguf(target):
    """The GGUF file of the model `target` runs: its own file on llama.cpp, else a built-in model's shipped one."""
    return getattr(target, "path", None) or gguf_path(target.name)


class LlamaCppMethod(Method):
    """llama-cpp-python's own decoding: `Llama.generate` (the token loop inside create_completion, without its
    per-token detokenising and stop-string checks) on the GGUF of the same model, with the same thread count,
    flash-attention setting, KV cache types and context size as the llama.cpp target (`llama_cpp_peer`). With prompt_lookup_tokens it is
    llama-cpp-python's prompt-lookup decoding (`LlamaPromptLookupDecoding` as draft_model), which verifies by
    sampling at every drafted position and comparing: lossless, greedy and sampled.

    Passes are timed by wrapping the instance's `eval` (one call per pass; the first is the prefill). The
    Llama object is built on first use and kept, as a user would; `reset()` before each run makes every prompt
    prefill from scratch, like every other method (llama-cpp-python would otherwise reuse a cached prefix)."""

    def __init__(self, name: str, prompt_lookup_tokens: int | None = None, max_matching_ngram: int = 2):
        self.name = name
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.max_matching_ngram = max_matching_ngram
        self._llm = None
        self._pass_ends: list[float] = []

    def unavailable(self, target) -> str | None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return "llama-cpp-python is not installed (pip install -r requirements-llamacpp.txt)"
        try:
            path = target_gguf(target)
        except HyflashError as exc:
            return f"needs the model as a GGUF file: {exc}"
        return None if path.is_file() else f"no GGUF file at {path}"

    def _model(self, target):
        if self._llm is None:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            from hyflash.targets.llamacpp import BATCH, DEFAULT_N_CTX
            from hyflash.targets.llamacpp_build import llama_cpp_peer

            draft = None if not self.prompt_lookup_tokens else LlamaPromptLookupDecoding(
                max_ngram_size=self.max_matching_ngram, num_pred_tokens=self.prompt_lookup_tokens)
            llm = llama_cpp_peer(target_gguf(target), target, n_ctx=min(target.max_context, DEFAULT_N_CTX), n_batch=BATCH,
                                 n_ubatch=BATCH, swa_full=True, draft_model=draft,
                                 # With a draft model llama-cpp-python keeps logits of every position but sizes
                                 # that array from this argument: without it, prompts over n_batch tokens crash.
                                 logits_all=draft is not None)
            evaluate = llm.eval

            def timed_eval(tokens):
                evaluate(tokens)
                self._pass_ends.append(time.perf_counter())

            llm.eval = timed_eval
            self._llm = llm
        return self._llm

    def run(self, target, prompt_ids, max_new_tokens, sampling, seed) -> PromptRun:
        llm = self._model(target)
        max_new_tokens = min(max_new_tokens, llm.n_ctx() - len(prompt_ids))  # as our loop: never past the context
        llm.set_seed(seed)
        llm.reset()
        self._pass_ends = []
        tokens: list[int] = []
        start = time.perf_counter()
        # temp 0 is llama.cpp's greedy sampler; otherwise top-k 0 and top-p 1 are no-ops, as in SamplingConfig.
        stream = llm.generate(prompt_ids, temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                              min_p=0.0, repeat_penalty=1.0, reset=True)
        with contextlib.closing(stream):
            for token in stream:
                tokens.append(int(token))
                if len(tokens) >= max_new_tokens or token in target.eos_token_ids:
                    break
        end = time.perf_counter()
        return _timed_passes_run(self.name, tokens, prompt_ids, start, end, self._pass_ends)


PLAIN_METHODS = ("plain", "hf-plain", "llamacpp-plain")  # no drafting: what a speed-up is quoted against
BUILTIN_METHODS = ("plain", "hf-plain", "hf-prompt-lookup", "llamacpp-plain", "llamacpp-prompt-lookup", "ngram")


def build_methods(names, drafters: dict[str, str], target, pld_tokens: int = 10, ngram_block: int = 8,
                  make_policy: Callable[..., object] = lambda tree=0: None, trees=(0,)) -> list[Method]:
    """Methods by name, then one LoopMethod per drafter (NAME -> folder, 'default' or model:NAME|PATH). 'default' is
    what `generate --drafter default` runs: the shipped drafter with the n-gram lookup beside it (hybrid);
    a folder is that drafter alone. Each speculative method gets its own policy from make_policy.

    Drafters load lazily (on first use) so a broken folder fails its own method, not the whole setup.
    """
    factories: dict[str, Callable[[], Method]] = {
        "plain": lambda: LoopMethod("plain", lambda: None, measure_target_kv=True),
        "hf-plain": lambda: HFMethod("hf-plain"),
        "hf-prompt-lookup": lambda: HFMethod("hf-prompt-lookup", prompt_lookup_tokens=pld_tokens),
        "llamacpp-plain": lambda: LlamaCppMethod("llamacpp-plain"),
        "llamacpp-prompt-lookup": lambda: LlamaCppMethod("llamacpp-prompt-lookup", prompt_lookup_tokens=pld_tokens),
        "ngram": lambda: LoopMethod("ngram", lambda: registry.build_drafter("ngram", target, block_size=ngram_block),
                                    policy=make_policy()),
    }
    methods = []
    for name in names:
        if name not in factories:
            raise HyflashError(f"unknown method {name!r}: choose from {', '.join(BUILTIN_METHODS)} (drafters: --drafter)")
        methods.append(factories[name]())
    for name, spec in drafters.items():
        if name in factories:
            raise HyflashError(f"drafter name {name!r} clashes with a built-in method: pick another name")
        for tree in trees:  # one method per tree budget; the chain keeps the plain name
            label = name if tree == 0 else f"{name}@t{'auto' if tree < 0 else tree}"
            methods.append(LoopMethod(label, lambda spec=spec: _load_drafter(spec, target), policy=make_policy(tree)))
    return methods


def _load_drafter(spec: str, target):
    """What `generate --drafter SPEC` runs (for 'default': the hybrid build_drafter makes), except that a
    missing shipped drafter is an error here instead of a quiet n-gram fall-back."""
    folder = _drafter_folder(spec, target)
    return registry.build_drafter("default" if spec == "default" else folder, target)


def drafter_identity(spec: str, target) -> dict:
    """Which drafter a result is about: its folder, configuration and a hash of its weights (a shipped
    drafter is replaced when it is retrained, so the folder name alone does not say which one ran). A draft
    model (model:NAME|PATH) is named by its file: the GGUF's fingerprint on llama.cpp."""
    if spec.startswith(registry.DRAFT_MODEL_PREFIX):
        name = spec.removeprefix(registry.DRAFT_MODEL_PREFIX)
        out = {"spec": spec, "draft_model": name}
        if target.backend == "llama.cpp":
            path = gguf_path(name)
            out.update(file=str(path), gguf=file_fingerprint(path))
        return out
    folder = Path(_drafter_folder(spec, target))
    out: dict = {"spec": spec, "folder": str(folder)}
    if (folder / "config.json").exists():
        out["config"] = json.loads((folder / "config.json").read_text())
    for weights in sorted(folder.glob("*.safetensors")):
        out.setdefault("sha256", {})[weights.name] = hashlib.sha256(weights.read_bytes()).hexdigest()
    return out


def _drafter_folder(spec: str, target) -> str:
    """'default' must mean the shipped drafter: build_drafter's quiet fall-back to the n-gram drafter would
    benchmark n-gram under the name of the trained drafter."""
    return registry.resolve_spec(spec, target.name)
