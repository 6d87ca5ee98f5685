"""Drafters used only by tests: random proposals that exercise every rejection path."""

from __future__ import annotations

import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.sampling import SamplingConfig, logits_to_probs, sample


class RandomDrafter(Drafter):
    """Proposes tokens from a fixed, context-free distribution q (sharp, unlike the target's).

    With greedy settings it proposes argmax-free random tokens deterministically from the generator; under
    sampling it samples from q warped by the same settings and reports q, as a real drafter must.
    """

    needs_features = True

    def __init__(self, vocab_size: int, block_size: int = 4, seed: int = 123, hit_token: int | None = None):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(vocab_size, generator=g) * 3
        self.block_size = block_size
        self.reset()

    def reset(self) -> None:
        self.seen = 0

    def ingest(self, tokens, features) -> None:
        assert features is not None and features.shape[0] == tokens.shape[0]
        self.seen += tokens.shape[0]

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator) -> Draft:
        if sampling.greedy:
            tokens = torch.randint(0, self.logits.shape[0], (num_tokens,), generator=generator)
            return Draft(tokens=tokens)
        q = logits_to_probs(self.logits, sampling).expand(num_tokens, -1).contiguous()
        return Draft(tokens=sample(q, generator), probs=q)

    def memory_bytes(self) -> int:
        return 0


class RandomBlockDrafter(Drafter):
    """A block drafter with fresh random per-slot distributions each step (drawn from its own generator, not
    the decoding loop's): exercises draft trees. Greedy drafts are each slot's argmax; sampled drafts are
    drawn from the slot distributions, which it reports."""

    needs_features = True

    def __init__(self, vocab_size: int, block_size: int = 5, seed: int = 5, sharpness: float = 3.0):
        self.vocab_size, self.block_size, self.sharpness = vocab_size, block_size, sharpness
        self.rng = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        pass

    def ingest(self, tokens, features) -> None:
        assert features is not None and features.shape[0] == tokens.shape[0]

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator) -> Draft:
        logits = torch.randn(num_tokens, self.vocab_size, generator=self.rng) * self.sharpness
        probs = logits.softmax(-1) if sampling.greedy else logits_to_probs(logits, sampling)
        tokens = probs.argmax(-1) if sampling.greedy else sample(probs, generator)
        return Draft(tokens=tokens, probs=None if sampling.greedy else probs, confidence=probs.amax(-1),
                     expensive=True, slot_probs=probs)

    def memory_bytes(self) -> int:
        return 0


def tiny_drafter_folder(target, path, seed: int = 0):
    """A small untrained drafter for `target`, saved to `path` (a real drafter folder; seed: its weights)."""
    from test_drafter_model import make

    return make(target, dtype=torch.float32, seed=seed).save_pretrained(path)


def same_state(a, b) -> bool:
    """Two drafter snapshots hold equal values, tensors bit for bit (a token history by its tokens)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if hasattr(a, "tokens"):
        return list(a.tokens) == list(b.tokens)
    return a == b
