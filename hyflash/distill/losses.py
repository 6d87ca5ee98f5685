"""Distillation losses on student rollouts: REOPOLD, sampled-token OPD, GKD (generalised JSD), DistiLLM's
skew reverse KL, supervised KD on teacher samples, and the reinforcement-learning baseline GRPO.

Shapes: logits [B, T, V] at the response positions, tokens/valid [B, T]. Full-distribution losses run in
chunks of positions so the extra [chunk, V] temporaries stay small whatever the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hyflash.credit import (
    CreditConfig,
    group_relative_advantages,
    importance_weight,
    k3_kl,
    reopold_credit,
    reward_quantiles,
    token_reward,
)
from hyflash.errors import HyflashError

CHUNK_POSITIONS = 256
# What a sampled-token loss divides by: "kept" = the tokens that get credit (REOPOLD's published form; for
# OPD every valid token is kept), "valid" = every response token of the batch, whatever the mask. Only
# "valid" makes REOPOLD's update exactly OPD's with some terms clipped or dropped: under "kept" its phase-II
# update is rescaled by 1/beta (5x at beta = 0.2) and the scale jumps at the switch step, which confounds the
# credit rule with the step size.
NORMALIZATIONS = ("kept", "valid")


def token_logp_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token) (differentiable) and the distribution's entropy (detached), both float32 [B, T]."""
    logp_all = F.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logp: torch.Tensor, advantage: torch.Tensor, mask: torch.Tensor, rho: torch.Tensor | None = None,
    normalizer: torch.Tensor | None = None,
) -> torch.Tensor:
    """-sum M * Rhat * rho * log pi_S / sum N: the score-function surrogate whose gradient is the update.
    N = M unless `normalizer` gives another token mask (e.g. every valid token, see NORMALIZATIONS)."""
    weight = advantage.detach() if rho is None else advantage.detach() * rho.detach()
    if normalizer is None:
        return -_masked_mean(weight * logp, mask)
    total = (weight * logp * mask.to(logp.dtype)).sum()
    return -total / normalizer.to(logp.dtype).sum().clamp(min=1)


def opd_loss(logp: torch.Tensor, teacher_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sampled-token reverse-KL OPD. Per sampled token the reverse-KL integrand is log pi_S - log pi_T; its
    gradient under sampling from pi_S is (log pi_S - log pi_T) * grad log pi_S (score function)."""
    integrand = (logp - teacher_logp).detach()
    return _masked_mean(integrand * logp, valid)


@dataclass
class LossOutput:
    loss: torch.Tensor
    stats: dict[str, float]


def reopold_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    teacher_logp: torch.Tensor,
    valid: torch.Tensor,
    step: int,
    config: CreditConfig,
    sampling_logp: torch.Tensor | None = None,
    ratio_clip: float | None = None,
    normalize: str = "kept",
) -> LossOutput:
    """REOPOLD on sampled tokens. `sampling_logp` (log-probs under the policy that drew the tokens) turns on
    the importance ratio; without it the rollout is taken as fresh (rho = 1). `normalize`: NORMALIZATIONS."""
    if normalize not in NORMALIZATIONS:
        raise HyflashError(f"unknown loss normalization {normalize!r}: use one of {', '.join(NORMALIZATIONS)}")
    reward = token_reward(teacher_logp, logp)
    credit = reopold_credit(reward, entropy, valid, step, config)
    rho = None if sampling_logp is None else importance_weight(logp, sampling_logp, ratio_clip)
    loss = policy_loss(logp, credit.advantage, credit.mask, rho, normalizer=valid if normalize == "valid" else None)
    stats = dict(credit.stats, **reward_quantiles(reward, valid))
    if rho is not None:
        stats["ratio_mean"] = float(_masked_mean(rho, valid))
    return LossOutput(loss, stats)


def grpo_loss(
    logp: torch.Tensor,
    rewards: torch.Tensor,
    valid: torch.Tensor,
    group_size: int,
    reference_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    sampling_logp: torch.Tensor | None = None,
    ratio_clip: float | None = None,
) -> LossOutput:
    """GRPO: every token of sample i carries the group-relative advantage A_i of its reward (the task's exact
    checker), through the same surrogate and importance ratio as REOPOLD, plus kl_coef times the k3 estimate
    of KL(pi || pi_ref) to the starting policy. Both terms divide by the batch's response tokens (the
    "valid" normalisation every method of the experiment uses), not per sequence."""
    advantage = group_relative_advantages(rewards, group_size)
    rho = None if sampling_logp is None else importance_weight(logp, sampling_logp, ratio_clip)
    loss = policy_loss(logp, advantage[:, None].expand_as(logp), valid, rho, normalizer=valid)
    groups = rewards.reshape(-1, group_size)
    stats = {"reward_mean": float(rewards.float().mean()),
             # groups whose samples disagree: the only ones that give a gradient
             "informative_groups": float((groups.max(1).values > groups.min(1).values).float().mean())}
    if reference_logp is not None:
        kl = k3_kl(logp, reference_logp)
        stats["kl"] = float(_masked_mean(kl.detach(), valid))
        if kl_coef:
            loss = loss + kl_coef * _masked_mean(kl, valid)
    if rho is not None:
        stats["ratio_mean"] = float(_masked_mean(rho, valid))
    return LossOutput(loss, stats)


# ----- full-distribution divergences ----------------------------------------------------------------------
def _kl_rows(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row from log-probabilities [N, V]."""
    return (logp.exp() * (logp - logq)).sum(-1)


def _jsd_rows(s: torch.Tensor, t: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's generalised JSD per row with mixture M = beta * T + (1 - beta) * S:
    beta * KL(T || M) + (1 - beta) * KL(S || M). Both KL terms vanish at the ends, so the ends are taken
    as their limits, forward KL(T || S) at beta = 0 and reverse KL(S || T) at beta = 1 (GKD's convention)."""
    if beta == 0.0:
        return _kl_rows(t, s)
    if beta == 1.0:
        return _kl_rows(s, t)
    mix = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
    return beta * _kl_rows(t, mix) + (1 - beta) * _kl_rows(s, mix)


def _skew_rkl_rows(s: torch.Tensor, t: torch.Tensor, alpha: float) -> torch.Tensor:
    """DistiLLM's skew reverse KL: KL(S || alpha * T + (1 - alpha) * S); alpha = 1 is plain reverse KL."""
    mix = torch.logsumexp(torch.stack([t + math.log(alpha), s + math.log1p(-alpha)]), dim=0) if alpha < 1 else t
    return _kl_rows(s, mix)


def _chunked_divergence(student_logits, teacher_logits, valid, rows_fn) -> torch.Tensor:
    """Mean over valid positions of rows_fn(log S, log T), evaluated CHUNK_POSITIONS rows at a time."""
    v = student_logits.shape[-1]
    s_flat = student_logits.reshape(-1, v)
    t_flat = teacher_logits.reshape(-1, teacher_logits.shape[-1])[:, :v]  # a padded teacher vocab is cut
    idx = valid.reshape(-1).nonzero().squeeze(-1)
    total = student_logits.new_zeros((), dtype=torch.float32)
    for start in range(0, idx.numel(), CHUNK_POSITIONS):
        rows = idx[start : start + CHUNK_POSITIONS]
        s = F.log_softmax(s_flat[rows].float(), -1)
        t = F.log_softmax(t_flat[rows].float(), -1).detach()
        total = total + rows_fn(s, t).sum()
    return total / max(idx.numel(), 1)


def generalized_jsd(student_logits, teacher_logits, valid, beta: float = 0.5) -> torch.Tensor:
    return _chunked_divergence(student_logits, teacher_logits, valid, lambda s, t: _jsd_rows(s, t, beta))


def skew_reverse_kl(student_logits, teacher_logits, valid, alpha: float = 0.1) -> torch.Tensor:
    return _chunked_divergence(student_logits, teacher_logits, valid, lambda s, t: _skew_rkl_rows(s, t, alpha))


def reverse_kl(student_logits, teacher_logits, valid) -> torch.Tensor:
    return _chunked_divergence(student_logits, teacher_logits, valid, lambda s, t: _kl_rows(s, t))


def sft_loss(logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Supervised KD on teacher samples: negative log-likelihood of the teacher's tokens."""
    return -_masked_mean(logp, valid)
