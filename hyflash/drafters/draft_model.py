"""Draft-model speculation: a smaller LM with the target's tokenizer drafts k tokens, one pass per token.

The baseline every runtime offers (llama.cpp's draft models, transformers' assisted generation). The draft
model is a target of its own (same backend as the target: a GGUF on llama.cpp, a Hugging Face model on
transformers) with its own key/value cache. That cache holds the verified text plus the last draft; drafts
the target rejected are rolled back at the next ingest, and what was verified but not yet run (the last
accepted draft, the correction or bonus token) runs in one pass at the next draft.

Lossless under sampling. Each draft token is sampled from q, the draft model's distribution warped by the
same temperature / top-k / top-p as the target's, and q is reported with it. The adaptive policy then cuts
the draft to k tokens from the drafts' confidences; for the rejection rule to stay exact, whether slot j is
verified may depend only on what was known before draft j was sampled. An autoregressive drafter's later
distributions depend on the tokens sampled before them, so under sampling every slot's confidence is one
number read before the first token is sampled (the top probability of q for slot 1); and the draft is never
cut short by what was sampled. Under greedy decoding nothing is random: each slot reports its own top
probability, and drafting stops early at a slot the draft model is unsure of (`greedy_stop_below`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyflash.drafters.base import Draft, Drafter
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig, argmax, logits_to_probs, sample
from hyflash.targets import BaseTarget

SOURCE = "draft-model"


@dataclass(frozen=True)
class DraftModelConfig:
    max_draft: int = 4  # tokens drafted per step at most (each costs one draft-model pass)
    # Greedy only: stop drafting at a slot whose top probability is below this (it would likely be rejected).
    greedy_stop_below: float = 0.5

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise HyflashError(f"a draft model must draft at least 1 token per step, got {self.max_draft}")
        if not 0 <= self.greedy_stop_below < 1:
            raise HyflashError(f"greedy_stop_below must be in [0, 1), got {self.greedy_stop_below}")


def _token_texts(model: BaseTarget) -> list[str] | None:
    """Every token's text, by id (None for a model without a tokenizer: only the sizes can be compared)."""
    tok = model.tokenizer
    if tok is None:
        return None
    if hasattr(tok, "convert_ids_to_tokens"):  # Hugging Face
        return tok.convert_ids_to_tokens(list(range(len(tok))))
    return [tok.piece(i) for i in range(model.vocab_size)]  # llama.cpp's own tokenizer (a .gguf path)


def check_same_vocabulary(draft: BaseTarget, target: BaseTarget) -> None:
    """One clear error unless the draft model's token ids mean what the target's do."""
    problem = None
    if draft.vocab_size != target.vocab_size:
        problem = f"{draft.vocab_size:,} logits per token against the target's {target.vocab_size:,}"
    else:
        mine, theirs = _token_texts(draft), _token_texts(target)
        if mine is not None and theirs is not None and mine != theirs:
            if len(mine) != len(theirs):
                problem = f"{len(mine):,} tokens against the target's {len(theirs):,}"
            else:
                i = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
                problem = f"token {i} is {mine[i]!r} there and {theirs[i]!r} in the target"
    if problem:
        raise HyflashError(f"draft model {draft.name} does not share {target.name}'s vocabulary ({problem}): "
                           f"use a draft model with the target's tokenizer (e.g. a smaller model of its family)")


class DraftModelDrafter(Drafter):
    """Drafts with `model`, a smaller LM (a BaseTarget on the target's backend) of the target's vocabulary."""

    needs_features = False
    is_expensive = True

    def __init__(self, model: BaseTarget, target: BaseTarget, config: DraftModelConfig = DraftModelConfig()):
        check_same_vocabulary(model, target)
        self.model, self.config = model, config
        self.block_size = config.max_draft + 1
        self.reset()

    def reset(self) -> None:
        self.verified: list[int] = []  # every token ingested, in order
        self.cached: list[int] = []  # the tokens in the draft model's cache, in order
        self.agreed = 0  # a prefix length known to be equal in both (never past the verified text)
        self.model.reset()

    def _agreement(self, tokens: list[int]) -> int:
        """Length of the common prefix of the cache and `tokens` (scanned from the known agreement on)."""
        n, limit = self.agreed, min(len(self.cached), len(tokens))
        while n < limit and self.cached[n] == tokens[n]:
            n += 1
        return n

    def _roll_back(self, length: int) -> None:
        if length < len(self.cached):
            self.model.rollback(length)
            del self.cached[length:]

    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        self.verified.extend(int(t) for t in tokens.view(-1).tolist())
        self.agreed = self._agreement(self.verified)
        self._roll_back(self.agreed)  # drafts the target rejected

    @torch.inference_mode()
    def _run(self, ids: list[int]) -> torch.Tensor:
        """Run `ids` on top of the cache; the last position's logits [V]."""
        block = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        if not self.cached:
            out = self.model.prefill(block, features=False, feature_free=True)
        else:
            out = self.model.score(block, features=False)
        self.cached.extend(ids)
        return out.logits[-1].float()

    def draft(self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator) -> Draft:
        context = self.verified + [int(last_token)]
        # The cache ends at the context's last token once the context has run, then holds drafts 1..k-1.
        count = min(num_tokens, self.config.max_draft, self.model.max_context - len(context) + 1)
        if count <= 0:
            return Draft(torch.empty(0, dtype=torch.long), source=SOURCE, expensive=True)
        start = min(self._agreement(context), len(context) - 1)  # the last token runs again for its logits
        self._roll_back(start)
        logits = self._run(context[start:])
        self.agreed = len(self.verified)
        tokens: list[int] = []
        probs, confidence = [], []
        for slot in range(count):
            if slot:
                logits = self._run(tokens[-1:])
            if sampling.greedy:
                top = float(logits.softmax(-1).max())
                if slot and top < self.config.greedy_stop_below:
                    break  # an unsure slot: no more drafting (greedy only: nothing sampled decides it)
                tokens.append(int(argmax(logits)))
                confidence.append(top)
            else:
                q = logits_to_probs(logits, sampling)
                if not slot:  # read before anything is sampled: the same for every slot (see the module doc)
                    confidence = [float(q.max())] * count
                tokens.append(int(sample(q, generator)))
                probs.append(q)
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long),
            probs=torch.stack(probs) if probs else None,
            confidence=torch.tensor(confidence[: len(tokens)]),
            source=SOURCE,
            expensive=True,
        )

    def memory_bytes(self) -> int:
        """The draft model's key/value cache (its weights are not counted, as no drafter's are)."""
        return self.model.kv_bytes()


def load_draft_model(spec: str, target: BaseTarget, config: DraftModelConfig = DraftModelConfig()) -> DraftModelDrafter:
    """A draft-model drafter for `target` from `spec`, a built-in model name or a path (a .gguf file on the
    llama.cpp backend, a Hugging Face folder on transformers), run on the target's backend."""
    return DraftModelDrafter(target.load_sibling(spec), target, config)
