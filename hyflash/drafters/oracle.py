"""A test drafter that proposes the target's own greedy continuation.

It exercises the engine at full acceptance: with a block of B slots (last verified token + B-1 drafts)
every greedy verification pass commits B tokens, so tau = B except where generation ends. It recomputes
from scratch each time (no cache of its own), so it is only meant for tiny models in tests and debugging.
"""

from __future__ import annotations

import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.sampling import SamplingConfig


class TargetGreedyDrafter(Drafter):
    needs_features = False

    def __init__(self, model, block_size: int = 8):
        self.model = model
        self.block_size = block_size
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []

    def ingest(self, tokens: torch.Tensor, features=None) -> None:
        self.history.extend(int(t) for t in tokens.view(-1))

    @torch.inference_mode()
    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator=None) -> Draft:
        seq = self.history + [last_token]
        out: list[int] = []
        device = self.model.get_input_embeddings().weight.device
        for _ in range(num_tokens):
            logits = self.model(input_ids=torch.tensor([seq + out], device=device), use_cache=False).logits
            out.append(int(logits[0, -1].argmax()))
        return Draft(tokens=torch.tensor(out, dtype=torch.long))

    def memory_bytes(self) -> int:
        return 8 * len(self.history)
