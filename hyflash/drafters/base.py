"""The small interface the decoding loop needs from any drafter.

Life of a drafter during one generation:
  reset()                              new sequence
  ingest(tokens, features)             verified tokens (and the target's features at those positions), in order;
                                       only verified tokens ever arrive, so state never needs rolling back
  draft(last_token, k, sampling, rng)  propose up to k tokens that follow `last_token`, a verified token the
                                       target has not processed yet (it sits at position = tokens ingested)
  propose(..., expensive)              the drafts to choose from this step (one, or one per source for a
                                       hybrid); expensive=False asks a costly drafter to sit the step out
  memory_bytes()                       draft-side memory held right now (caches, states, histories)
  without_expensive()                  what keeps drafting once the costly part retires for the rest of the
                                       generation (a hybrid's n-gram lookup; None for a network alone)
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from hyflash.sampling import SamplingConfig


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] long, k may be smaller than asked (even 0)
    probs: torch.Tensor | None = None  # [k, V] distributions the tokens were drawn from; None = deterministic
    # Per-slot confidence in [0, 1] that the policy calibrates against observed acceptance. It must not
    # depend on which token was sampled (only on the distributions), or choosing by it would bias sampling.
    confidence: torch.Tensor | None = None
    source: str = "drafter"  # which drafter proposed it (statistics and calibration are per source)
    expensive: bool = False  # costly to produce: the policy backs off when its drafts do not pay
    # A block drafter's whole per-slot distributions [k, V'] (for draft trees) and, for a reduced draft
    # vocabulary, the target ids of its V' entries.
    slot_probs: torch.Tensor | None = None
    vocab_ids: torch.Tensor | None = None

    def confidence_or_default(self) -> torch.Tensor:
        return self.confidence if self.confidence is not None else torch.full((len(self.tokens),), 0.5)

    def truncated(self, k: int) -> "Draft":
        cut = lambda t: None if t is None else t[:k]  # noqa: E731
        return Draft(self.tokens[:k], cut(self.probs), cut(self.confidence), self.source, self.expensive,
                     cut(self.slot_probs), self.vocab_ids)


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

    # What ingest builds, by attribute name: `snapshot` copies it, `restore` puts a copy back. A backend that
    # keeps a prompt's cached passes for the next prefill (llama.cpp) restores the drafter to where the kept
    # part of the prompt left it instead of running that part again; () = this drafter cannot be resumed.
    ingest_state: tuple[str, ...] = ()

    def snapshot(self) -> dict | None:
        """A copy of what ingest has built so far (None if this drafter cannot be resumed)."""
        if not self.ingest_state:
            return None
        return copy.deepcopy({name: getattr(self, name) for name in self.ingest_state})

    def restore(self, snapshot: dict) -> None:
        """Back to the state `snapshot` copied (the snapshot stays as it is: later ingests change copies)."""
        for name, value in copy.deepcopy(snapshot).items():
            setattr(self, name, value)

    def propose(
        self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None,
        expensive: bool = True,
    ) -> list[Draft]:
        """Candidate drafts for the policy; a drafter that costs real time skips when expensive is False."""
        if not expensive and self.is_expensive:
            return []
        return [self.draft(last_token, num_tokens, sampling, generator)]

    is_expensive: bool = True  # runs a network per draft (the n-gram lookup does not)

    def without_expensive(self) -> "Drafter | None":
        """The part of this drafter that costs nothing per step, already up to date (None: nothing)."""
        return None if self.is_expensive else self
