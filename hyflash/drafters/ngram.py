"""Prompt-lookup / n-gram drafter: copy what followed the latest earlier occurrence of the current suffix.

A real, training-free baseline (the idea behind Hugging Face's prompt-lookup decoding). Deterministic, so
its draft distribution is one-hot and the rejection rule stays exact at any temperature.
"""

from __future__ import annotations

import numpy as np
import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.drafters.copy import TokenHistory
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
        self._history = TokenHistory()

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        self._history.extend(tokens)  # amortised O(1) a token: idle steps cost next to nothing

    @property
    def history(self) -> torch.Tensor:
        """Every ingested token, in order."""
        return torch.from_numpy(self._history.tokens.astype(np.int64))

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator=None) -> Draft:
        start, n = self._history.match(last_token, self.max_ngram, self.min_ngram)
        if n:
            # The most recent match is usually the most relevant.
            tokens = torch.tensor(self._history.continuation(start, last_token, num_tokens), dtype=torch.long)
            # A longer matched suffix is a better bet; the policy calibrates what it is worth.
            confidence = torch.full((len(tokens),), 1 - 0.6**n)
            return Draft(tokens=tokens, confidence=confidence, source="ngram")
        return Draft(tokens=torch.empty(0, dtype=torch.long), source="ngram")

    def memory_bytes(self) -> int:
        return self._history.nbytes()
