"""Acceptance replay: the greedy tau of many drafters on one prompt for the price of one target decode.

Under greedy decoding every drafter's speculative text is the target's own greedy text, and whether a draft token
is accepted depends only on that text: slot i is accepted when it equals the greedy token at its position and
every slot before it was. So one plain greedy decode that records the target's features (`record_greedy`, through
the real decoding loop with a drafter that drafts nothing) is all the target work the tau of any number of chain
drafters needs. `ReplayTarget` then plays the target from the recording: the real loop (`decoding.generate`) runs
each drafter against it unchanged, and its passes cost nothing.

What a replay measures exactly: tau, acceptance by position, the drafter's own time (ingest and draft: real work)
and its memory. What it does not: speed (the target's passes are free) and sampling (the text would depend on
the drafts). The recorded features come from one-token passes; in a real speculative run the verified tokens'
features come from multi-token passes, equal to them to float rounding (on a float32 CPU target within ~5e-5,
docs/engine.md "Exactness"), so a drafter's argmax can differ only at a near tie. `tests/test_replay.py` holds
replayed tau equal to real speculative decoding's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyflash.decoding import generate
from hyflash.drafters.base import Draft, Drafter
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.targets.base import BaseTarget, TargetOutput
from hyflash.targets.hf import PREFILL_CHUNK


@dataclass
class Recording:
    """A prompt, the target's greedy continuation of it, and the target's features at every position the loop
    ran (the prompt and every committed token but the last, which no pass needed)."""

    prompt: list[int]
    tokens: list[int]  # the greedy continuation, as generate() returned it
    features: torch.Tensor  # [len(prompt) + len(tokens) - 1, n_feature_layers, hidden], the target's dtype

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.tokens


class _FeatureTape(Drafter):
    """Drafts nothing and keeps every verified token with its features: what the loop hands a drafter."""

    block_size = 1
    needs_features = True
    is_expensive = False  # never retired: the policy would stop computing features

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.features: list[torch.Tensor] = []

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        self.tokens += tokens.tolist()
        self.features.append(features.detach().clone())

    def draft(self, last_token, num_tokens, sampling, generator) -> Draft:
        return Draft(torch.empty(0, dtype=torch.long))

    def memory_bytes(self) -> int:
        return 0


def record_greedy(target: BaseTarget, prompt_ids: list[int], max_new_tokens: int):
    """Plain greedy decoding of the prompt through the real loop, keeping the features every pass computed.
    Returns (the Recording, the GenerationResult of that decode)."""
    tape = _FeatureTape()
    result = generate(target, prompt_ids, tape, max_new_tokens=max_new_tokens, sampling=SamplingConfig())
    recording = Recording(list(map(int, prompt_ids)), list(result.tokens), torch.cat(tape.features))
    if tape.tokens != recording.sequence[: len(tape.tokens)] or len(tape.tokens) != len(recording.features):
        raise AssertionError("the recorded features do not line up with the recorded tokens")
    return recording, result


class ReplayTarget(BaseTarget):
    """A target that answers from a Recording: a block's logits point at the recorded greedy tokens and its
    features are the recorded ones. Everything a drafter borrows (embeddings, LM head, tokenizer, shapes) is the
    real target's. Greedy chains only; a block that leaves the recording is an error, never a guess."""

    def __init__(self, target: BaseTarget, recording: Recording):
        self.real, self.recording = target, recording
        self.sequence = torch.tensor(recording.sequence, dtype=torch.long)
        for name in ("name", "tokenizer", "num_layers", "hidden_size", "vocab_size", "max_context",
                     "feature_layers", "eos_token_ids", "backend"):
            setattr(self, name, getattr(target, name))
        self._length = 0

    # ----- borrowed from the real target ----------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.real.dtype

    @property
    def device(self) -> torch.device:
        return self.real.device

    def identity(self) -> dict:
        return {**self.real.identity(), "replay": True}

    def load_sibling(self, name_or_path: str) -> BaseTarget:
        raise HyflashError("an acceptance replay cannot run a draft model: its drafts need a target of their own")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.real.embed(ids)

    def head_weight(self) -> torch.Tensor:
        return self.real.head_weight()

    # ----- the recording played back --------------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._length = 0

    def kv_bytes(self) -> int:  # the real cache holds the recorded sequence: what plain decoding would hold
        return self.real.kv_bytes()

    def rollback(self, length: int) -> None:
        self._length = length

    def prefill(self, ids, features: bool = True, feature_free: bool = False, on_features=None,
                resumable=None) -> TargetOutput:
        ids = torch.as_tensor(ids).view(-1).cpu()
        n = len(self.recording.prompt)
        if len(ids) != n or not torch.equal(ids, self.sequence[:n]):
            raise HyflashError("the replayed prompt is not the recorded one: record it with record_greedy first")
        self._length = n
        rows = self.recording.features[:n]
        if on_features is not None:  # in the real backend's pieces
            for i in range(0, n, PREFILL_CHUNK):
                on_features(ids[i : i + PREFILL_CHUNK].to(self.device), rows[i : i + PREFILL_CHUNK])
        return TargetOutput(greedy_logits(self.sequence, ids[-1:], n - 1, self.vocab_size).to(self.device),
                            rows if features and on_features is None else None)

    def score(self, ids, features: bool = True, tree=None) -> TargetOutput:
        if tree is not None:
            raise HyflashError("an acceptance replay verifies chains only: use --tree 0")
        ids = torch.as_tensor(ids).view(-1).cpu()
        start, recorded = self._length, len(self.recording.features)
        if start >= recorded or int(ids[0]) != int(self.sequence[start]):
            raise HyflashError(f"the replay left its recording at position {start}: a replay is greedy only, and "
                               f"needs --max-new-tokens no larger than the recording's")
        self._length = start + len(ids)
        rows = self.recording.features[start : start + len(ids)]
        if len(rows) < len(ids):  # rows past the recording: never kept (greedy_logits rejects the drafts there)
            rows = torch.cat([rows, rows[-1:].expand(len(ids) - len(rows), *rows.shape[1:])])
        logits = greedy_logits(self.sequence, ids, start, self.vocab_size).to(self.device)
        return TargetOutput(logits, rows if features else None)


def greedy_logits(sequence: torch.Tensor, block: torch.Tensor, start: int, vocab_size: int) -> torch.Tensor:
    """What a target whose greedy text is `sequence` answers to `block` scored at positions start, start + 1, ...:
    rows whose argmax is the sequence's next token. Rows past the sequence's end (drafts running on after an
    end-of-text it stopped at) reject the draft token they check: nothing is known there, so nothing counts."""
    known = sequence[start + 1 : start + 1 + len(block)]
    nxt = torch.cat([known, (torch.cat([block[1:], block[-1:]])[len(known) :] + 1) % vocab_size])
    rows = torch.zeros(len(block), vocab_size)
    rows[torch.arange(len(block)), nxt] = 1.0
    return rows
