"""`hyflash data --backend llama.cpp`: the GGUF target writes its training data, several sequences per batch,
and its features are recorded in the same passes, so the drafter trains on exactly what it sees at inference.

How (the target's SequenceStreams, hyflash/targets/llamacpp.py):
  - one llama_context with `slots` sequences, each in its own KV stream;
  - continuous batching: a slot whose sequence ends (end-of-generation token or length) is cleared
    (llama_memory_seq_rm) and prefilled with the next prompt, alone in its llama_decode; every decoding step
    is then one llama_decode with one token per live slot, all flagged as outputs;
  - features come from the target's eval callback (`l_out-N` tensors) in both kinds of pass: llama.cpp cuts a
    multi-stream batch into runs of consecutive sequence ids, in increasing order, so with tokens in slot
    order the callback's rows are in batch order;
  - sampled continuations draw from a generator per prompt (seeded by the data seed and the prompt's index),
    so a sequence's text does not depend on what it was batched with.

A sequence's features are its prompt's rows (from its prefill), then one row per generated token that was
fed back, and a zero row for the last token (never run through the target; no training block reads it), as
in the transformers path (data.generate_batch).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig, argmax, logits_to_probs, sample
from hyflash.targets.llamacpp import BATCH
from hyflash.training.data import duration_text

CONTEXT_STEP = 256  # a stream's context is rounded up to this (llama.cpp pads its cache views to 256 too)


@dataclass
class GenerationStats:
    """Token counts and seconds of prefill and decoding passes, for the speed and ETA line."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    def decode_rate(self) -> float:
        return self.decode_tokens / max(self.decode_seconds, 1e-9)

    def prefill_rate(self) -> float:
        return self.prefill_tokens / max(self.prefill_seconds, 1e-9)


@dataclass
class Request:
    """One prompt to continue: its ids, how many tokens at most, and how (None = greedy)."""

    ids: list[int]
    max_new_tokens: int
    generator: torch.Generator | None = None  # set: sampled with the generator's SamplingConfig
    # Filled in by generation:
    tokens: list[int] = field(default_factory=list)
    feature_rows: list[torch.Tensor] = field(default_factory=list)


class BatchedGenerator:
    """Generates continuations of many prompts with a LlamaCppTarget's model, `slots` sequences per
    llama_decode. Built per (slots, context per sequence); `close()` frees the llama.cpp context."""

    def __init__(self, target, slots: int, seq_context: int, features: bool, feature_dtype: torch.dtype,
                 sampling: SamplingConfig):
        self.target, self.slots, self.features = target, slots, features
        self.feature_dtype, self.sampling = feature_dtype, sampling
        self.seq_context = CONTEXT_STEP * math.ceil(seq_context / CONTEXT_STEP)
        self.streams = target.open_streams(slots, self.seq_context, features)
        self.stats = GenerationStats()

    def close(self) -> None:
        self.streams.close()

    def _decode(self, entries: list[tuple[int, int, int]], outputs: list[bool]) -> tuple[np.ndarray, torch.Tensor | None]:
        logits, feats = self.streams.decode(entries, outputs)
        return logits.numpy(), None if feats is None else feats.to(self.feature_dtype)

    def _next_token(self, request: Request, logits: np.ndarray) -> int:
        row = torch.from_numpy(logits)
        if request.generator is None:
            return int(argmax(row))
        return int(sample(logits_to_probs(row, self.sampling), request.generator))

    def _start(self, slot: int, request: Request) -> None:
        """Clear the slot's stream and prefill the prompt there (alone: one sequence per llama_decode)."""
        if len(request.ids) + request.max_new_tokens > self.seq_context:
            raise HyflashError(f"a prompt of {len(request.ids)} tokens plus {request.max_new_tokens} new ones does "
                               f"not fit the {self.seq_context}-token context per sequence")
        self.streams.clear(slot)
        begin = time.perf_counter()
        # The final norm's rows exist for output positions only: the target asks for all of them then.
        all_outputs = self.streams.all_outputs
        for start in range(0, len(request.ids), BATCH):
            chunk = request.ids[start : start + BATCH]
            last = start + len(chunk) == len(request.ids)
            flags = [all_outputs or (last and k == len(chunk) - 1) for k in range(len(chunk))]
            logits, feats = self._decode([(t, start + k, slot) for k, t in enumerate(chunk)], flags)
            if feats is not None:
                request.feature_rows.append(feats)
        self.stats.prefill_tokens += len(request.ids)
        self.stats.prefill_seconds += time.perf_counter() - begin
        request.tokens.append(self._next_token(request, logits[-1]))

    def _done(self, request: Request) -> bool:
        return len(request.tokens) >= request.max_new_tokens or request.tokens[-1] in self.target.eos_token_ids

    def generate(self, requests: list[Request]) -> list[Request]:
        """Continue every request (in place; also returned), `slots` at a time, refilling freed slots."""
        queue = list(range(len(requests)))[::-1]
        live: dict[int, int] = {}  # slot -> request index
        while queue or live:
            for slot in range(self.slots):
                while slot not in live and queue:
                    i = queue.pop()
                    self._start(slot, requests[i])
                    if self._done(requests[i]):
                        self._finish(requests[i])
                    else:
                        live[slot] = i
            if not live:
                continue
            order = sorted(live)  # slot order = the order llama.cpp runs (and records) them in
            entries = []
            for slot in order:
                r = requests[live[slot]]
                entries.append((r.tokens[-1], len(r.ids) + len(r.tokens) - 1, slot))
            begin = time.perf_counter()
            logits, feats = self._decode(entries, [True] * len(entries))
            self.stats.decode_seconds += time.perf_counter() - begin
            self.stats.decode_tokens += len(entries)
            for k, slot in enumerate(order):
                r = requests[live[slot]]
                if feats is not None:
                    r.feature_rows.append(feats[k : k + 1].clone())
                r.tokens.append(self._next_token(r, logits[k]))
                if self._done(r):
                    self._finish(r)
                    del live[slot]
        return requests

    def _finish(self, request: Request) -> None:
        """Join the feature rows, with the zero row of the last token."""
        if self.features:
            rows = torch.cat(request.feature_rows)
            request.feature_rows = [torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])]


def sampling_of(config) -> SamplingConfig:
    """The data config's sampling settings (top-k off, as in the transformers path)."""
    return SamplingConfig(temperature=config.temperature, top_p=config.top_p, top_k=0)


def prompt_seed(config, prompt_index: int) -> int:
    """The seed of one prompt's sampling draws: the data seed and the prompt's index (`hyflash prompts
    --self-instruct` seeds its one-at-a-time `generate` with it too, so both paths draw alike)."""
    return config.seed * 1_000_003 + prompt_index


def prompt_generator(config, prompt_index: int) -> torch.Generator:
    """The sampling generator of one prompt: its draws do not depend on its batch or on resuming."""
    return torch.Generator().manual_seed(prompt_seed(config, prompt_index))


class LlamaCppShardMaker:
    """Makes data shards with a LlamaCppTarget: short prompts `batch_size` per batch, long ones
    `long_batch_size` (their streams need a bigger context), greedy and sampled mixed in one queue."""

    def __init__(self, target, config, features: bool, feature_dtype: torch.dtype):
        self.target, self.config, self.features, self.feature_dtype = target, config, features, feature_dtype
        self._generators: dict[tuple[int, int], BatchedGenerator] = {}
        self.stats = GenerationStats()

    def generator(self, slots: int, seq_context: int) -> BatchedGenerator:
        """A generator for this many slots and at least this context per sequence (reused when one fits)."""
        for (n, ctx), gen in self._generators.items():
            if n == slots and ctx >= seq_context:
                return gen
        gen = BatchedGenerator(self.target, slots, seq_context, self.features, self.feature_dtype,
                               sampling_of(self.config))
        self._generators[(slots, gen.seq_context)] = gen
        return gen

    def close(self) -> None:
        for gen in self._generators.values():
            gen.close()
        self._generators.clear()

    def run(self, encoded: list[list[int]], long: list[bool], sampled: list[bool], first_index: int,
            new_tokens: tuple[int, int] | None = None) -> list[Request]:
        """Requests for the prompts (in order), generated. new_tokens: (short, long) maximum new tokens."""
        short_new, long_new = new_tokens or (self.config.max_new_tokens, self.config.long_new_tokens)
        requests = [Request(ids, long_new if is_long else short_new,
                            prompt_generator(self.config, first_index + i) if is_sampled else None)
                    for i, (ids, is_long, is_sampled) in enumerate(zip(encoded, long, sampled))]
        for is_long, slots in ((False, self.config.batch_size), (True, self.config.long_batch_size)):
            group = [r for r, lg in zip(requests, long) if lg == is_long]
            if not group:
                continue
            gen = self.generator(min(slots, len(group)) if is_long else slots,
                                 max(len(r.ids) + r.max_new_tokens for r in group))
            before = GenerationStats(**vars(gen.stats))
            gen.generate(group)
            for key, value in vars(gen.stats).items():
                setattr(self.stats, key, getattr(self.stats, key) + value - getattr(before, key))
        return requests


def speed_line(stats: GenerationStats, slots: int, prompt_tokens: int, new_tokens: int, prompts: int) -> str:
    """The line printed before a long run: measured speeds and the ETA of the rest with every slot busy. Not a bound
    either way: sequences that end early write fewer than their maximum new tokens, but a shard's batch drains as
    its sequences end (measured on Qwen2.5-Coder-1.5B, 64 prompts a shard at 64 slots: runs took 1.3-1.5x this
    ETA), so `build_dataset` also prints the pace each finished shard measures."""
    seconds = prompt_tokens / stats.prefill_rate() + new_tokens / stats.decode_rate()
    return (f"llama.cpp generation here: {stats.decode_rate():.0f} tok/s decoding {slots} sequences per batch, "
            f"{stats.prefill_rate():.0f} tok/s prefill; {prompts} prompts to go ({prompt_tokens:,} prompt tokens, "
            f"at most {new_tokens:,} new): ETA ~{duration_text(seconds)} with every slot busy")
