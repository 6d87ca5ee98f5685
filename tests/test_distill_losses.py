"""REOPOLD credit rules and the distillation losses, on random tensors (no models)."""

from __future__ import annotations

import math

import pytest
import torch

from hyflash import credit
from hyflash.distill import losses
from hyflash.errors import HyflashError


def _batch(seed=0, b=3, t=7, v=11):
    g = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(b, t, v, generator=g, requires_grad=True)
    teacher_logits = torch.randn(b, t, v, generator=g) * 2
    tokens = torch.randint(0, v, (b, t), generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[0, 5:] = False  # a short response
    valid[2, 3:] = False
    return student_logits, teacher_logits, tokens, valid


def _teacher_logp(teacher_logits, tokens):
    return torch.log_softmax(teacher_logits, -1).gather(-1, tokens[..., None]).squeeze(-1)


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    return g


def test_reopold_without_relaxations_is_sampled_token_opd():
    s, t, tokens, valid = _batch()
    logp, entropy = losses.token_logp_entropy(s, tokens)
    t_logp = _teacher_logp(t, tokens)
    plain = credit.CreditConfig(floor=None, entropy_top_fraction=1.0, switch_step=0)
    reo = losses.reopold_loss(logp, entropy, t_logp, valid, step=5, config=plain).loss
    opd = losses.opd_loss(logp, t_logp, valid)
    torch.testing.assert_close(_grad(reo, s), _grad(opd, s), rtol=0, atol=1e-7)


def test_opd_gradient_is_unbiased_for_reverse_kl():
    """Averaging the sampled-token OPD gradient over every token o ~ pi_S (by enumeration) gives the exact
    gradient of KL(pi_S || pi_T): the estimator OPD (and REOPOLD without relaxations) is built on."""
    g = torch.Generator().manual_seed(1)
    v = 6
    s = torch.randn(1, 1, v, generator=g, requires_grad=True)
    t = torch.randn(1, 1, v, generator=g)
    valid = torch.ones(1, 1, dtype=torch.bool)
    expected = _grad(losses.reverse_kl(s, t, valid), s)
    probs = torch.softmax(s.detach(), -1)[0, 0]
    total = torch.zeros_like(s)
    for o in range(v):
        tok = torch.tensor([[o]])
        logp, _ = losses.token_logp_entropy(s, tok)
        total += probs[o] * _grad(losses.opd_loss(logp, _teacher_logp(t, tok), valid), s)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)


def test_phase_one_drops_every_token_below_the_floor():
    s, t, tokens, valid = _batch(2)
    logp, entropy = losses.token_logp_entropy(s, tokens)
    t_logp = _teacher_logp(t, tokens)
    reward = credit.token_reward(t_logp, logp)
    floor = float(reward[valid].median())
    config = credit.CreditConfig(floor=floor, entropy_top_fraction=0.2, switch_step=10)
    got = credit.reopold_credit(reward, entropy, valid, step=3, config=config)
    below = (reward < floor) & valid
    assert below.any() and not (got.mask & below).any()
    assert torch.equal(got.mask, valid & ~below)  # phase I ignores the entropy mask
    # ... and the gradient confirms it: below-floor tokens get exactly zero gradient on their logits.
    loss = losses.reopold_loss(logp, entropy, t_logp, valid, step=3, config=config).loss
    grad = _grad(loss, s)
    assert torch.all(grad[below] == 0) and torch.any(grad[got.mask] != 0)


def test_phase_two_uses_entropy_mask_and_clipped_rewards():
    s, t, tokens, valid = _batch(3)
    logp, entropy = losses.token_logp_entropy(s, tokens)
    reward = credit.token_reward(_teacher_logp(t, tokens), logp)
    config = credit.CreditConfig(floor=-0.5, entropy_top_fraction=0.3, switch_step=10)
    got = credit.reopold_credit(reward, entropy, valid, step=10, config=config)
    assert torch.equal(got.mask, credit.entropy_top_mask(entropy, valid, 0.3))
    assert float(got.advantage.min()) >= -0.5
    torch.testing.assert_close(got.advantage, reward.clamp(min=-0.5))


@pytest.mark.parametrize("beta", [0.2, 0.25, 0.5, 0.999, 1.0, 0.01])
def test_entropy_mask_keeps_exactly_ceil_beta_n(beta):
    g = torch.Generator().manual_seed(4)
    entropy = torch.rand(4, 9, generator=g)
    entropy[1, 2] = entropy[1, 3]  # a tie must not change the count
    valid = torch.rand(4, 9, generator=g) > 0.3
    n = int(valid.sum())
    mask = credit.entropy_top_mask(entropy, valid, beta)
    assert int(mask.sum()) == math.ceil(beta * n - 1e-9)
    assert not (mask & ~valid).any()
    kept, dropped = entropy[mask], entropy[valid & ~mask]
    if dropped.numel():
        assert float(kept.min()) >= float(dropped.max())


def test_floor_forms():
    assert credit.floor_from_lambda(0.2, "logit") == pytest.approx(math.log(0.25))
    assert credit.floor_from_lambda(0.2, "ratio") == pytest.approx(math.log(0.2) / 0.8)
    assert credit.floor_from_lambda(0.5, "logit") == pytest.approx(0.0)
    with pytest.raises(HyflashError):
        credit.floor_from_lambda(1.0)
    with pytest.raises(HyflashError):
        credit.floor_from_lambda(0.2, "other")
    with pytest.raises(HyflashError):  # phase I needs a floor
        credit.CreditConfig(floor=None, switch_step=3)


def test_importance_ratio_and_clip():
    logp = torch.tensor([-1.0, -2.0, -0.1], requires_grad=True)
    old = torch.tensor([-1.0, -1.0, -2.0])
    rho = credit.importance_weight(logp, old)
    torch.testing.assert_close(rho, torch.exp(logp.detach() - old))
    assert not rho.requires_grad
    clipped = credit.importance_weight(logp, old, clip=2.0)
    torch.testing.assert_close(clipped, torch.tensor([1.0, math.exp(-1.0), 2.0]))
    # Fresh rollout: the ratio is 1 and the loss equals the one without it.
    s, t, tokens, valid = _batch(5)
    logp_b, entropy = losses.token_logp_entropy(s, tokens)
    cfg = credit.CreditConfig(floor=-1.0, entropy_top_fraction=0.5)
    args = (logp_b, entropy, _teacher_logp(t, tokens), valid, 0, cfg)
    with_ratio = losses.reopold_loss(*args, sampling_logp=logp_b.detach(), ratio_clip=2.0)
    torch.testing.assert_close(with_ratio.loss, losses.reopold_loss(*args).loss)
    assert with_ratio.stats["ratio_mean"] == pytest.approx(1.0)


def _kl(p_logits, q_logits):
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return (p.exp() * (p - q)).sum(-1)


def test_generalized_jsd_ends_are_forward_and_reverse_kl():
    s, t, _, valid = _batch(6)
    fwd = _kl(t, s.detach())[valid].mean()
    rev = _kl(s.detach(), t)[valid].mean()
    torch.testing.assert_close(losses.generalized_jsd(s, t, valid, 0.0), fwd)
    torch.testing.assert_close(losses.generalized_jsd(s, t, valid, 1.0), rev)
    # The general mixture formula approaches the same ends: JSD(beta)/beta -> forward KL as beta -> 0.
    eps = 1e-4
    torch.testing.assert_close(losses.generalized_jsd(s, t, valid, eps) / eps, fwd, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(losses.generalized_jsd(s, t, valid, 1 - eps) / eps, rev, rtol=2e-3, atol=1e-4)
    mid = losses.generalized_jsd(s, t, valid, 0.5)
    assert 0 < float(mid.detach()) < math.log(2) + 1e-6  # JSD(0.5) is bounded by log 2


def test_skew_reverse_kl_limits_and_chunking(monkeypatch):
    s, t, _, valid = _batch(7)
    torch.testing.assert_close(losses.skew_reverse_kl(s, t, valid, 1.0), losses.reverse_kl(s, t, valid))
    assert float(losses.skew_reverse_kl(s, t, valid, 0.1).detach()) < float(losses.reverse_kl(s, t, valid).detach())
    full = losses.generalized_jsd(s, t, valid, 0.5)
    monkeypatch.setattr(losses, "CHUNK_POSITIONS", 2)  # many chunks, same value
    torch.testing.assert_close(losses.generalized_jsd(s, t, valid, 0.5), full)


def test_sft_loss_is_masked_nll():
    s, _, tokens, valid = _batch(8)
    logp, _ = losses.token_logp_entropy(s, tokens)
    torch.testing.assert_close(losses.sft_loss(logp, valid), -logp[valid].mean())


# ----- GRPO -----------------------------------------------------------------------------------------------
def test_group_relative_advantages_normalise_within_each_group():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1])
    adv = credit.group_relative_advantages(rewards, 4)
    # group 1: mean 1/4, sample std 1/2; group 2: all the same, no preference; group 3: mean 1/2, std 0.577
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0, -0.866, 0.866, -0.866, 0.866])
    assert torch.allclose(adv, expected, atol=1e-3)
    assert torch.allclose(credit.group_relative_advantages(rewards * 10 + 3, 4), adv, atol=1e-4)  # scale-free
    for g in range(3):
        assert abs(float(adv[4 * g : 4 * g + 4].sum())) < 1e-5  # zero mean per group
    with pytest.raises(HyflashError, match="group"):
        credit.group_relative_advantages(rewards, 5)
    with pytest.raises(HyflashError, match="group"):
        credit.group_relative_advantages(rewards, 1)


def test_grpo_gradient_raises_rewarded_samples_and_lowers_the_others():
    """Descent on the loss must raise log pi of every token of a rewarded sample and lower it for the rest of
    its group, by A_i / (response tokens of the batch); a group that all scored the same gets no gradient."""
    logp = (-torch.rand(8, 5)).requires_grad_()
    valid = torch.ones(8, 5, dtype=torch.bool)
    valid[1, 3:] = False
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])
    out = losses.grpo_loss(logp, rewards, valid, group_size=4)
    grad = _grad(out.loss, logp)
    n = int(valid.sum())
    adv = credit.group_relative_advantages(rewards, 4)
    assert torch.allclose(grad, -(adv[:, None] * valid) / n)
    assert (grad[0] < 0).all() and (grad[1, :3] > 0).all() and (grad[1, 3:] == 0).all()
    assert (grad[4:] == 0).all()
    assert out.stats["reward_mean"] == pytest.approx(1 / 8) and out.stats["informative_groups"] == 0.5


def test_kl_penalty_is_zero_at_the_start_and_pulls_back_afterwards():
    logp = (-torch.rand(4, 6)).requires_grad_()
    valid = torch.ones(4, 6, dtype=torch.bool)
    uninformative = torch.zeros(4)
    at_start = losses.grpo_loss(logp, uninformative, valid, 2, reference_logp=logp.detach().clone(), kl_coef=0.1)
    assert float(at_start.loss) == 0.0 and at_start.stats["kl"] == 0.0
    assert (_grad(at_start.loss, logp) == 0).all()
    # The policy moved above the reference on these tokens: k3 > 0 and its gradient lowers log pi again.
    reference = logp.detach() - 0.5
    moved = losses.grpo_loss(logp, uninformative, valid, 2, reference_logp=reference, kl_coef=0.1)
    assert moved.stats["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1, rel=1e-5)
    assert (_grad(moved.loss, logp) > 0).all()
    assert (credit.k3_kl(logp.detach(), logp.detach() + torch.randn(4, 6)) >= 0).all()
