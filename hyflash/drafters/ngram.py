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

# P(slot accepted | slot reached) of the lookup's drafts, the policy's prior for them (its calibrator corrects it
# online), by matched suffix length n (row n - 1; the last row: that many tokens or more) and draft slot (column;
# later slots read the last). Measured over 7,957 target-written greedy continuations of SmolLM2-135M and
# Qwen2.5-Coder-1.5B (experiments/never_slower/ngram_prior.md). The first slot is the weak one: a 2-token match
# continues correctly half the time, but once its first token is right the rest mostly follow. The earlier prior,
# 1 - 0.6^n for every slot, over-stated the first slot by 0.15-0.3 for n = 2-7: on llama.cpp, where a rejected
# 2-token pass costs 0.6 of a step, those drafts were verified at a loss until the calibrator learned otherwise.
ACCEPTANCE_PRIOR = (
    (0.24, 0.59, 0.70, 0.79, 0.81, 0.83, 0.85),
    (0.49, 0.71, 0.78, 0.80, 0.83, 0.86, 0.88),
    (0.73, 0.78, 0.88, 0.90, 0.92, 0.93, 0.95),
    (0.70, 0.78, 0.83, 0.84, 0.86, 0.87, 0.89),
    (0.76, 0.78, 0.88, 0.85, 0.89, 0.91, 0.91),
    (0.67, 0.85, 0.88, 0.84, 0.88, 0.92, 0.91),
    (0.80, 0.85, 0.92, 0.82, 0.93, 0.94, 0.93),
    (0.79, 0.86, 0.88, 0.89, 0.92, 0.89, 0.93),
    (0.87, 0.86, 0.88, 0.89, 0.89, 0.92, 0.93),
    (0.88, 0.90, 0.91, 0.92, 0.92, 0.93, 0.94),
    (0.93, 0.92, 0.92, 0.92, 0.93, 0.93, 0.94),
    (0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 0.98),
)


# ACCEPTANCE_PRIOR with each row's last column repeated out to 32 slots (longer drafts build theirs).
_PRIOR_TABLE = torch.tensor([row + (row[-1],) * (32 - len(row)) for row in ACCEPTANCE_PRIOR])
_NO_TOKENS = torch.empty(0, dtype=torch.long)


def confidence_reference(n: int, length: int) -> torch.Tensor:
    """The plain definition `NgramDrafter.confidence` reads from its table (tests hold the two equal)."""
    row = ACCEPTANCE_PRIOR[min(n, len(ACCEPTANCE_PRIOR)) - 1]
    return torch.tensor([row[min(j, len(row) - 1)] for j in range(length)])


class NgramDrafter(Drafter):
    needs_features = False
    is_expensive = False
    ingest_state = ("_history",)

    def __init__(self, block_size: int = 8, max_ngram: int = len(ACCEPTANCE_PRIOR), min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.block_size = block_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.reset()

    def reset(self) -> None:
        self._history = TokenHistory()

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        self._history.extend(tokens)  # queued until a lookup reads it: idle steps cost next to nothing

    @property
    def history(self) -> torch.Tensor:
        """Every ingested token, in order."""
        return torch.from_numpy(self._history.tokens.astype(np.int64))

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator=None) -> Draft:
        start, n = self._history.match(last_token, self.max_ngram, self.min_ngram)
        if n:
            # The most recent match is usually the most relevant.
            tokens = torch.tensor(self._history.continuation(start, last_token, num_tokens), dtype=torch.long)
            return Draft(tokens=tokens, confidence=self.confidence(n, len(tokens)), source="ngram")
        return Draft(tokens=_NO_TOKENS, source="ngram")

    @staticmethod
    def confidence(n: int, length: int) -> torch.Tensor:
        """The prior acceptance of each slot of a `length`-token draft from an n-token match (ACCEPTANCE_PRIOR).
        Read from a table made once: the loop asks every step, right after a pass, when building a tensor from a
        list costs ~10x its warm time."""
        if length <= _PRIOR_TABLE.shape[1]:
            return _PRIOR_TABLE[min(n, len(ACCEPTANCE_PRIOR)) - 1, :length]  # a view: nothing writes to it
        return confidence_reference(n, length)

    def memory_bytes(self) -> int:
        return self._history.nbytes()
