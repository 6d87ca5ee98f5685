"""Losses for block drafters: position-weighted cross-entropy and KL to the target's distribution.

Slot k (1..B-1) of a block predicts the token k places after the anchor. Later slots only matter if every
earlier slot was accepted, so their loss is down-weighted, DFlash-style: w_k = exp(-(k-1)/gamma).

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
def slot_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Top-1 accuracy per slot over valid labels (NaN where a slot has none)."""
    labels = labels.flatten(0, -2)  # [N, S]
    valid = labels >= 0
    hit = (logits.flatten(0, -3).argmax(-1) == labels) & valid
    n = valid.sum(0)
    return [h / c if c else math.nan for h, c in zip(hit.sum(0).tolist(), n.tolist())]


@torch.no_grad()
def expected_acceptance(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Greedy acceptance length implied by per-slot hits: 1 + mean length of the all-correct prefix.

    A cheap training-time proxy for tau (it ignores that the drafter would see its own earlier slots).
    """
    valid = labels >= 0
    hit = ((logits.argmax(-1) == labels) & valid).float()
    prefix = torch.cumprod(hit, dim=-1).sum(-1)
    return 1.0 + float(prefix.mean()) if prefix.numel() else math.nan
