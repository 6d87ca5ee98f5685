"""The small interface the decoding loop needs from any drafter.

Life of a drafter during one generation:
  reset()                              new sequence
  ingest(tokens, features)             verified tokens (and the target's features at those positions), in order;
                                       only verified tokens ever arrive, so state never needs rolling back
  draft(last_token, k, sampling, rng)  propose up to k tokens that follow `last_token`, a verified token the
                                       target has not processed yet (it sits at position = tokens ingested)
  memory_bytes()                       draft-side memory held right now (caches, states, histories)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from hyflash.sampling import SamplingConfig


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long, k may be smaller than asked (even 0)
    probs: torch.Tensor | None = None  # [k, V] distributions the tokens were drawn from; None = deterministic


class Drafter(ABC):
    block_size: int = 16  # the last verified token plus block_size - 1 drafts
    needs_features: bool = True  # whether ingest() wants target features

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None: ...

    @abstractmethod
    def draft(
        self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft: ...

    @abstractmethod
    def memory_bytes(self) -> int: ...
