"""Losses for block drafters: position-weighted cross-entropy and KL to the target's distribution.

Slot k (1..B-1) of a block predicts the token k places after the anchor. Later slots only matter if every
earlier slot was accepted, so their loss is down-weighted, DFlash-style: w_k = exp(-(k-1)/gamma), or
(`SlotWeights("survival")`) by a running estimate of the probability that a block survives up to slot k.

Both losses return a (weighted sum, weight sum) pair instead of a mean: the trainer divides by the weight sum
of the *global* batch, so that N data-parallel processes compute exactly the loss of one process that sees
the whole batch (a mean of per-process means would weight processes, not tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[block_size - 1] weights of slots 1..B-1; gamma <= 0 means uniform."""
    k = torch.arange(block_size - 1, dtype=torch.float32)
    return torch.ones_like(k) if gamma <= 0 else torch.exp(-k / gamma)


SURVIVAL_DECAY = 0.9  # EMA decay of the per-slot accuracy (about the last 10 steps)
SURVIVAL_FLOOR = 0.02  # least weight of a slot, so that late slots keep learning while they are rarely reached


def survival_weights(acceptance: torch.Tensor, floor: float = SURVIVAL_FLOOR) -> torch.Tensor:
    """[S] weights from per-slot acceptance estimates a_1..a_S: w_k = max(floor, prod_{j<k} a_j), so w_1 = 1.
    Like the exp weights they are not normalised here: the trainer divides by the global weight sum."""
    survive = torch.cumprod(torch.cat([acceptance.new_ones(1), acceptance[:-1].clamp(0, 1)]), 0)
    return survive.clamp_min(floor).float()


class SlotWeights:
    """The slot weights of a run. "exp": the fixed exp(-(k-1)/gamma). "survival": w_k = prod_{j<k} of an EMA
    (detached, float64) of the per-slot top-1 training accuracy of the *global* batch, floored.

    The EMA starts at exp(-1/gamma) per slot, so the first step uses exactly the exp weights' shape and the
    weights then follow what the drafter actually gets right. `update` takes the global batch's summed hits
    and label counts (all-reduced: integers, identical in every process, so N processes keep the same EMA
    as one); `state`/`load_state` carry the EMA through checkpoints (JSON floats round-trip exactly)."""

    def __init__(self, mode: str, block_size: int, gamma: float, decay: float = SURVIVAL_DECAY,
                 floor: float = SURVIVAL_FLOOR):
        self.mode, self.decay, self.floor = mode, decay, floor
        self.fixed = position_weights(block_size, gamma)
        start = math.exp(-1.0 / gamma) if gamma > 0 else 1.0
        self.acceptance = torch.full((block_size - 1,), start, dtype=torch.float64)

    @property
    def adaptive(self) -> bool:
        return self.mode == "survival"

    def weights(self) -> torch.Tensor:
        return survival_weights(self.acceptance, self.floor) if self.adaptive else self.fixed

    def update(self, hits: torch.Tensor, counts: torch.Tensor) -> None:
        """hits, counts [S]: per-slot correct top-1 predictions and valid labels of the step's global batch
        (slots without labels keep their estimate)."""
        if not self.adaptive:
            return
        hits, counts = hits.detach().double().cpu(), counts.detach().double().cpu()
        seen = counts > 0
        accuracy = torch.where(seen, hits / counts.clamp_min(1), self.acceptance)
        self.acceptance = torch.where(seen, self.decay * self.acceptance + (1 - self.decay) * accuracy,
                                      self.acceptance)

    def state(self) -> list[float]:
        return self.acceptance.tolist()

    def load_state(self, values) -> None:
        values = torch.tensor(values, dtype=torch.float64)
        if values.shape != self.acceptance.shape:
            raise ValueError(f"slot acceptance state has {values.numel()} slots, expected {self.acceptance.numel()}")
        self.acceptance = values


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., S, Vd], labels [..., S] in draft-vocabulary ids (-1 = ignore), weights [S]."""
    valid = labels >= 0
    nll = F.cross_entropy(logits.flatten(0, -2).float(), labels.clamp_min(0).flatten(), reduction="none")
    w = weights.to(logits.device) * valid
    return (nll.view_as(labels) * w).sum(), w.sum()


def weighted_kl(
    logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(p_target || q_draft) per slot, both over the draft vocabulary (the target's distribution
    renormalised onto it). target_logits [..., S, Vd]; labels only mark which slots count (-1 = ignore)."""
    valid = labels >= 0
    log_q = F.log_softmax(logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    w = weights.to(logits.device) * valid
    return (kl * w).sum(), w.sum()


@torch.no_grad()
def slot_hits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot: correct top-1 predictions and valid labels, as float tensors [S] (to all-reduce)."""
    labels = labels.flatten(0, -2)  # [N, S]
    valid = labels >= 0
    hit = (logits.flatten(0, -3).argmax(-1) == labels) & valid
    return hit.sum(0).float(), valid.sum(0).float()


@torch.no_grad()
def slot_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Top-1 accuracy per slot over valid labels (NaN where a slot has none)."""
    hits, counts = slot_hits(logits, labels)
    return [h / c if c else math.nan for h, c in zip(hits.long().tolist(), counts.long().tolist())]


@torch.no_grad()
def expected_acceptance(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Greedy acceptance length implied by per-slot hits: 1 + mean length of the all-correct prefix.

    A cheap training-time proxy for tau (it ignores that the drafter would see its own earlier slots).
    """
    valid = labels >= 0
    hit = ((logits.argmax(-1) == labels) & valid).float()
    prefix = torch.cumprod(hit, dim=-1).sum(-1)
    return 1.0 + float(prefix.mean()) if prefix.numel() else math.nan
