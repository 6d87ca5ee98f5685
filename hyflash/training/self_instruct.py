"""Prompts the target writes itself (`hyflash prompts --self-instruct N`), so that a drafter trains on requests
phrased the way the model's users phrase them rather than the way hyflash's templates do.

An instruct model given its chat template up to the start of a user turn continues it with a plausible user
request (the "Magpie" method, Xu et al. 2024). Sampled at temperature 1 under a handful of system messages (code
help, tutoring, review, data work, tools, docs), deduplicated and kept within sensible lengths, those requests
are as varied as the model's own idea of its users, and none of them comes from hyflash's templates. They are
written as OpenAI-style JSONL with their system message, the format `hyflash data --prompts FILE` reads, so the
same target then answers them.

The file is the checkpoint: run the same command again (or with a larger N) and it continues after the last
attempt it holds. Attempt k samples with seed (seed, k), so the file does not depend on where a run stopped.

On llama.cpp the attempts run `batch_size` sequences per batch (continuous batching, as `hyflash data` does):
Qwen2.5-Coder-1.5B Q4_K_M decodes 64 sequences at ~76 tok/s on 2 Zen 4 cores against ~28 tok/s for one, and most
of the time goes to runaways that write all of max_new_tokens. Each attempt keeps its own generator, so its
draws do not depend on its batch; its text does not either wherever the file's batched passes give the logits of
one-sequence passes (bit for bit on SmolLM2's Q4_1, tested; on K-quants up to their kernels' rounding, which can
flip a near-tie). Attempts after the one that completes N are discarded, and made again by a later, larger run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from hyflash.corpora import Prompt
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.training.llamacpp_data import BatchedGenerator, Request, prompt_generator, prompt_seed
from hyflash.training.user_prompts import write_prompt_file

SYSTEMS = (
    "You are a helpful assistant.",
    "You are a helpful coding assistant. Users ask you to write, fix, explain and review code.",
    "You are an expert Python developer helping users with their projects.",
    "You are a programming tutor who explains concepts clearly to beginners.",
    "You are a senior software engineer who reviews code and suggests improvements.",
    "You are a data scientist who helps with pandas, NumPy, SQL and plotting questions.",
    "You are a helpful assistant for the shell, git and developer tools.",
    "You are a technical writer who helps users document their code and projects.",
)
SENTINEL = "\u2063HYFLASH-USER-TURN\u2063"  # a user turn's content, to find where the template puts it
SOURCE = "self-instruct"


@dataclass
class SelfInstructConfig:
    num: int  # prompts to keep
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256  # a request still unfinished here is dropped (a runaway, not a request)
    min_words: int = 3
    max_attempts_per_prompt: int = 4  # give up when fewer than 1 in this many samples is usable
    batch_size: int = 64  # sequences per llama.cpp batch (transformers: one generation at a time)

    def __post_init__(self) -> None:
        if self.num < 1:
            raise HyflashError(f"--self-instruct needs a number of prompts >= 1, got {self.num}")
        if not 0 < self.temperature:
            raise HyflashError(f"self-instruct samples its prompts: temperature must be > 0, got {self.temperature}")
        if self.batch_size < 1:
            raise HyflashError(f"--batch-size must be >= 1, got {self.batch_size}")


def user_turn_prefix(target, system: str) -> list[int]:
    """The token ids of the chat template up to where a user turn's content begins (after `system`)."""
    if not getattr(target.tokenizer, "chat_template", None):
        raise HyflashError(f"{target.name} has no chat template, so it cannot write a user turn: self-instruct "
                           "needs an instruct model (e.g. smollm2-135m, qwen2.5-coder-1.5b)")
    text = target.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                 {"role": "user", "content": SENTINEL}],
                                                add_generation_prompt=False, tokenize=False)
    if text.count(SENTINEL) != 1:
        raise HyflashError(f"{target.name}'s chat template does not render a user turn as written, so self-instruct "
                           "cannot find where one begins")
    return target.encode_rendered(text.split(SENTINEL)[0])


def usable(text: str, config: SelfInstructConfig) -> bool:
    """A request worth answering: a few words at least, not a role label or template debris."""
    return len(text.split()) >= config.min_words and not re.search(r"<\|[a-z_]+\|>|^(user|assistant|system)\b",
                                                                  text, re.IGNORECASE)


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def _read_existing(out: Path) -> tuple[list[Prompt], int]:
    """The prompts a file holds and the next attempt number (0 for a new file)."""
    if not out.exists():
        return [], 0
    kept, next_attempt = [], 0
    for n, line in enumerate(out.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            system, user = row["messages"][0]["content"], row["messages"][-1]["content"]
            attempt = int(str(row["source"]).rsplit(":", 1)[1])
        except (ValueError, KeyError, IndexError, TypeError):
            raise HyflashError(f"{out}:{n} is not a self-instruct prompt written by hyflash: pass a new --out "
                               "(or delete the file to start again)") from None
        kept.append(Prompt("user", f"{SOURCE}:{attempt}", user, system=system))
        next_attempt = max(next_attempt, attempt + 1)
    return kept, next_attempt


def _system(attempt: int) -> str:
    return SYSTEMS[attempt % len(SYSTEMS)]


class _Writer:
    """Samples attempts: one `generate` each (the plain path, and transformers'), or on llama.cpp `batch_size`
    sequences per batch through `hyflash data`'s BatchedGenerator, whose per-sequence generators draw as
    `generate` does (tests hold the two equal on SmolLM2's Q4_1)."""

    def __init__(self, target, config: SelfInstructConfig, sampling):
        self.target, self.config, self.sampling = target, config, sampling
        self.prefixes = {system: user_turn_prefix(target, system) for system in SYSTEMS}
        self.batched = None
        if config.batch_size > 1 and hasattr(target, "open_streams"):  # llama.cpp
            longest = max(len(p) for p in self.prefixes.values()) + config.max_new_tokens
            self.batched = BatchedGenerator(target, config.batch_size, longest, False, torch.float32, sampling)

    def chunk(self, wanted: int) -> int:
        """Attempts to sample at once when `wanted` more prompts are needed: one at a time unbatched; batched,
        enough to fill the slots twice (a runaway then rarely holds a batch alone), but at most twice `wanted`
        (about half the attempts are kept: 57% on Qwen2.5-Coder-1.5B)."""
        return 1 if self.batched is None else max(1, min(2 * self.config.batch_size, 2 * wanted))

    def sample(self, attempts: range) -> list[list[int]]:
        """The tokens each attempt wrote (its end-of-generation token last, if it finished)."""
        if self.batched is None:
            from hyflash import decoding  # the decoding loop imports the targets; keep `hyflash prompts` light

            return [decoding.generate(self.target, self.prefixes[_system(a)], None,
                                      max_new_tokens=self.config.max_new_tokens, sampling=self.sampling,
                                      seed=prompt_seed(self.config, a)).tokens for a in attempts]
        requests = [Request(self.prefixes[_system(a)], self.config.max_new_tokens, prompt_generator(self.config, a))
                    for a in attempts]
        return [r.tokens for r in self.batched.generate(requests)]

    def close(self) -> None:
        if self.batched is not None:
            self.batched.close()


def self_instruct(target, out: str | Path, config: SelfInstructConfig, progress: bool = True) -> list[Prompt]:
    """Sample user requests from `target` until `out` holds config.num of them; returns them all."""
    out = Path(out)
    kept, attempt = _read_existing(out)
    seen = {_normal(p.text) for p in kept}
    writer = _Writer(target, config, SamplingConfig(temperature=config.temperature, top_p=config.top_p))
    limit = config.num * config.max_attempts_per_prompt
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.num, initial=min(len(kept), config.num), desc="self-instruct prompts", unit="prompt")
    try:
        while len(kept) < config.num:
            if attempt >= limit:
                raise HyflashError(f"{target.name} wrote only {len(kept)} usable prompts in {attempt} attempts "
                                   f"(they are in {out}); it may not follow its chat template: try another model")
            attempts = range(attempt, min(limit, attempt + writer.chunk(config.num - len(kept))))
            before = len(kept)
            for this, tokens in zip(attempts, writer.sample(attempts)):
                if len(kept) == config.num:
                    break  # the chunk's later attempts are discarded: the file ends at the last one kept
                attempt = this + 1
                finished = bool(tokens) and tokens[-1] in target.eos_token_ids
                text = target.decode([t for t in tokens if t not in target.eos_token_ids]).strip()
                if finished and usable(text, config) and _normal(text) not in seen:
                    seen.add(_normal(text))
                    kept.append(Prompt("user", f"{SOURCE}:{this}", text, system=_system(this)))
                    if bar is not None:
                        bar.update(1)
            if len(kept) > before and (len(attempts) > 1 or len(kept) % 10 == 0):
                write_prompt_file(out, kept)  # the checkpoint: after each batched chunk, every 10 prompts else
    finally:
        writer.close()
        if kept:
            write_prompt_file(out, kept)
        if bar is not None:
            bar.close()
    return kept
