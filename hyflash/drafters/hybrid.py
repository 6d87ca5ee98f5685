"""A trained drafter and the n-gram lookup side by side: both propose every step, the policy takes the draft
with the better expected accepted length (per-source calibrated acceptance), so neither is an either-or.

The n-gram lookup wins where text repeats (code that reuses names, long context); the trained drafter where it
does not. Both see every verified token, so either can be chosen at any step.
"""

from __future__ import annotations

import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.drafters.ngram import NgramDrafter
from hyflash.sampling import SamplingConfig


class HybridDrafter(Drafter):
    def __init__(self, trained: Drafter, ngram: NgramDrafter | None = None):
        self.trained = trained
        self.ngram = ngram or NgramDrafter(block_size=trained.block_size)
        self.block_size = trained.block_size
        self.needs_features = trained.needs_features

    def reset(self) -> None:
        self.trained.reset()
        self.ngram.reset()

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        self.trained.ingest(tokens, features)
        self.ngram.ingest(tokens, features)

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator) -> Draft:
        """The trained drafter's draft (propose() is what the decoding loop uses)."""
        return self.trained.draft(last_token, num_tokens, sampling, generator)

    def propose(self, last_token, num_tokens, sampling, generator, expensive: bool = True) -> list[Draft]:
        ngram = self.ngram.draft(last_token, num_tokens, sampling, generator)
        return self.trained.propose(last_token, num_tokens, sampling, generator, expensive) + [ngram]

    def without_expensive(self) -> NgramDrafter:
        return self.ngram  # it has seen every verified token

    def memory_bytes(self) -> int:
        return self.trained.memory_bytes() + self.ngram.memory_bytes()

    def snapshot(self) -> dict | None:
        parts = {"trained": self.trained.snapshot(), "ngram": self.ngram.snapshot()}
        return None if None in parts.values() else parts

    def restore(self, snapshot: dict) -> None:
        self.trained.restore(snapshot["trained"])
        self.ngram.restore(snapshot["ngram"])
