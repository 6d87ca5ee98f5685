"""Prompt-lookup / n-gram drafter: copy what followed the latest earlier occurrence of the current suffix.

A real, training-free baseline (the idea behind Hugging Face's prompt-lookup decoding). Deterministic, so
its draft distribution is one-hot and the rejection rule stays exact at any temperature.
"""

from __future__ import annotations

import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.drafters.copy import suffix_match
from hyflash.sampling import SamplingConfig


class NgramDrafter(Drafter):
    needs_features = False
    is_expensive = False

    def __init__(self, block_size: int = 8, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.block_size = block_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.reset()

    def reset(self) -> None:
        self._history = torch.empty(0, dtype=torch.long)
        self._pending: list[torch.Tensor] = []

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        # Kept aside until a draft reads them: while the policy has speculation sit out, ingesting costs a list
        # append, not a copy of the whole history per step.
        self._pending.append(tokens.detach().to("cpu", torch.long).view(-1))

    @property
    def history(self) -> torch.Tensor:
        """Every ingested token, in order."""
        if self._pending:
            self._history = torch.cat([self._history, *self._pending])
            self._pending = []
        return self._history

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator=None) -> Draft:
        seq = torch.cat([self.history, torch.tensor([last_token])])
        start, n = suffix_match(seq, self.max_ngram, self.min_ngram)
        if n:
            tokens = seq[start : start + num_tokens].clone()  # the most recent match is usually the most relevant
            # A longer matched suffix is a better bet; the policy calibrates what it is worth.
            confidence = torch.full((len(tokens),), 1 - 0.6**n)
            return Draft(tokens=tokens, confidence=confidence, source="ngram")
        return Draft(tokens=torch.empty(0, dtype=torch.long), source="ngram")

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [self._history, *self._pending])
