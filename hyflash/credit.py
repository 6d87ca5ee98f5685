"""REOPOLD credit rules as pure tensor functions (shared with drafter training).

On-policy distillation written as policy optimisation: every sampled token t gets the reward
    R_t = log pi_T(o_t | .) - log pi_S(o_t | .)            (stop-gradient)
and the loss is  -sum_t M_t * Rhat_t * rho_t * log pi_S(o_t) / sum_t M_t.
Plain sampled-token OPD uses M = 1 and Rhat = R. REOPOLD relaxes that uniform credit:
  how strongly: Rhat = max(R, floor)             (mixture-based reward clipping)
  where:        M keeps the top-beta fraction of tokens by *student* entropy
  when:         before `switch_step` keep only tokens with R >= floor (exploration, no strong negative
                updates); from `switch_step` on, the entropy mask with clipped rewards (refinement).

GRPO, the reinforcement-learning baseline, credits every token of a sample with its group-relative advantage
(reward - group mean) / (group std + eps) over the G samples drawn for the same prompt (no teacher).

For a drafter the same reward is the log acceptance ratio: a sampled draft token is accepted with
probability min(1, exp(R)) with R = log p_target - log q_drafter.

Everything here works on flat or batched float tensors plus a boolean `valid` mask (padding is False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hyflash.errors import HyflashError

FLOOR_FORMS = ("logit", "ratio")


def floor_from_lambda(lam: float, form: str = "logit") -> float:
    """Reward floor from the skew-mixture weight lambda, in either published form.

    The floor comes from scoring against a skew mixture of student and teacher (weight lam), which bounds
    how negative a token's reward can get. Public re-implementations write it in two ways:
      "logit": log(lam / (1 - lam))      (lam = 0.2 -> -1.386)
      "ratio": log(lam) / (1 - lam)      (lam = 0.2 -> -2.012)
    Both are exposed because they disagree; pass the floor directly to avoid choosing.
    """
    if not 0.0 < lam < 1.0:
        raise HyflashError(f"the mixture weight lambda must be in (0, 1), got {lam}")
    if form == "logit":
        return math.log(lam / (1.0 - lam))
    if form == "ratio":
        return math.log(lam) / (1.0 - lam)
    raise HyflashError(f"unknown floor form {form!r}: use one of {', '.join(FLOOR_FORMS)}")


@dataclass(frozen=True)
class CreditConfig:
    """REOPOLD's three relaxations. The defaults of each switch turn it off (plain sampled-token OPD)."""

    floor: float | None = None  # reward floor; None = no clipping (set directly or via floor_from_lambda)
    entropy_top_fraction: float = 1.0  # beta: keep this fraction of tokens by student entropy; 1 = all
    switch_step: int = 0  # steps of phase I (exploration); 0 = refinement rule from the start

    def __post_init__(self) -> None:
        if not 0.0 < self.entropy_top_fraction <= 1.0:
            raise HyflashError(f"entropy top fraction (beta) must be in (0, 1], got {self.entropy_top_fraction}")
        if self.switch_step < 0:
            raise HyflashError(f"switch step must be >= 0, got {self.switch_step}")
        if self.switch_step > 0 and self.floor is None:
            raise HyflashError("phase I keeps tokens above the reward floor: give a floor or a lambda")


def token_reward(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """R = log pi_T - log pi_S on the sampled tokens, detached (the reward is not differentiated)."""
    return (teacher_logp - student_logp).detach().float()


def entropy_top_mask(entropy: torch.Tensor, valid: torch.Tensor, fraction: float) -> torch.Tensor:
    """Keep exactly ceil(fraction * N) valid tokens with the highest entropy (N = number of valid tokens).

    Ties are broken by position (stable sort), so the count is exact and the choice deterministic.
    """
    flat_valid = valid.reshape(-1).bool()
    n = int(flat_valid.sum())
    keep = math.ceil(fraction * n - 1e-9)  # the epsilon keeps 0.2 * 10 from rounding up to 3
    scores = entropy.reshape(-1).float().masked_fill(~flat_valid, float("-inf"))
    order = torch.sort(scores, descending=True, stable=True).indices[:keep]
    mask = torch.zeros_like(flat_valid)
    mask[order] = True
    return mask.reshape(valid.shape)


def importance_weight(
    logp: torch.Tensor, sampling_logp: torch.Tensor, clip: float | None = None
) -> torch.Tensor:
    """rho = pi_S / pi_sampling on the sampled tokens (detached), optionally truncated at `clip`.

    Exactly 1 when the rollout is fresh; when a rollout batch is reused for several updates the ratio
    corrects for the drift, and the clip bounds the variance of that correction.
    """
    rho = torch.exp((logp - sampling_logp).detach().float())
    return rho.clamp(max=clip) if clip is not None else rho


@dataclass
class Credit:
    advantage: torch.Tensor  # Rhat, same shape as the tokens
    mask: torch.Tensor  # M, bool
    stats: dict[str, float]


def reopold_credit(
    reward: torch.Tensor, entropy: torch.Tensor, valid: torch.Tensor, step: int, config: CreditConfig
) -> Credit:
    """Apply the REOPOLD rule for training step `step` (0-based). Returns Rhat, M and logging stats."""
    valid = valid.bool()
    floor = config.floor
    below = (reward < floor) & valid if floor is not None else torch.zeros_like(valid)
    advantage = reward.clamp(min=floor) if floor is not None else reward.clone()
    if step < config.switch_step:
        # Phase I: tokens the teacher strongly rejects carry no update at all, so plausible paths survive.
        mask = valid & ~below
        phase = 1
    else:
        mask = entropy_top_mask(entropy, valid, config.entropy_top_fraction) if config.entropy_top_fraction < 1 else valid
        phase = 2
    n_valid = max(int(valid.sum()), 1)
    stats = {
        "phase": float(phase),
        "kept_fraction": float(mask.sum()) / n_valid,
        "clipped_fraction": float(below.sum()) / n_valid,
    }
    return Credit(advantage=advantage, mask=mask, stats=stats)


def group_relative_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage per sample: (r - mean) / (std + eps) within each group of `group_size` consecutive
    samples (the G samples of one prompt; std with Bessel's correction). A group whose samples all score the
    same gets advantage 0: nothing to prefer."""
    if group_size < 2 or rewards.numel() % group_size:
        raise HyflashError(f"GRPO needs groups of >= 2 samples that divide the batch: {rewards.numel()} samples, "
                           f"group size {group_size}")
    groups = rewards.float().reshape(-1, group_size)
    mean, std = groups.mean(1, keepdim=True), groups.std(1, keepdim=True)
    return ((groups - mean) / (std + eps)).reshape(rewards.shape)


def k3_kl(logp: torch.Tensor, reference_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi (Schulman's k3): exp(d) - d - 1 with
    d = log pi_ref - log pi. Non-negative, 0 where the two agree; differentiable through `logp`."""
    d = reference_logp.detach() - logp
    return torch.exp(d) - d - 1


def reward_quantiles(reward: torch.Tensor, valid: torch.Tensor, qs=(0.05, 0.5, 0.95)) -> dict[str, float]:
    values = reward[valid.bool()].float()
    if values.numel() == 0:
        return {f"reward_q{int(q * 100):02d}": float("nan") for q in qs}
    got = torch.quantile(values, torch.tensor(qs, device=values.device))  # quantile wants one device
    return {f"reward_q{int(q * 100):02d}": float(v) for q, v in zip(qs, got)}
