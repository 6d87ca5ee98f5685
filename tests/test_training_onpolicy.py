"""On-policy drafter training: one-pass block scoring equals scoring each block alone; credit and survival."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hyflash.credit import CreditConfig
from hyflash.training import onpolicy
from hyflash.training.onpolicy import (
    OnPolicyConfig,
    exact_acceptance,
    onpolicy_loss,
    reference_draft_logprobs,
    sample_drafts,
    survival_weights,
    target_draft_logprobs,
    target_slot_probs,
)


@pytest.mark.parametrize("family", ["llama_target", "gemma_target"])
def test_one_pass_scoring_equals_per_block_scoring(request, family):
    target = request.getfixturevalue(family)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 90, (2, 30), generator=g)
    anchors = torch.tensor([[3, 11, 20, 27], [0, 9, 10, 25]])  # gemma's sliding window is 8: spans it
    drafts = torch.randint(0, 90, (2, 4, 5), generator=g)
    for temperature in (1.0, 0.7):
        fast = target_draft_logprobs(target, tokens, anchors, drafts, temperature)
        slow = reference_draft_logprobs(target, tokens, anchors, drafts, temperature)
        torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_gemma3"])
def test_onpolicy_tensors_stay_on_the_target_device(family):
    """Batches are built on the CPU while the target, the drafter's logits and its samples live on the
    accelerator. The meta device stands in for that accelerator: it refuses to be mixed with the CPU, so this
    CPU test fails wherever a device move is missing (as a CUDA run would)."""
    import conftest

    from hyflash.targets import HFTarget

    target = HFTarget(getattr(conftest, family)().to("meta"), name="meta")
    logits = torch.randn(2, 3, 4, target.vocab_size, device="meta")
    picks, log_q, entropy = sample_drafts(logits, 1.0, None)
    tokens, anchors = torch.randint(0, 90, (2, 30)), torch.tensor([[3, 11, 20], [0, 9, 25]])  # on the CPU
    log_p = target_draft_logprobs(target, tokens, anchors, picks, 1.0)
    p = target_slot_probs(target, tokens, anchors, picks, 1.0, torch.arange(target.vocab_size, device="meta"))
    assert {t.device.type for t in (picks, log_q, entropy, log_p, p)} == {"meta"}
    assert log_p.shape == (2, 3, 4) and p.shape == (2, 3, 4, target.vocab_size)
    # A generator elsewhere than the logits is refused (torch itself does not check every device pair).
    with pytest.raises(ValueError, match="generator"):
        sample_drafts(logits, 1.0, torch.Generator())


def test_exact_acceptance_weights_slots_by_the_sampled_prefix_reach(monkeypatch):
    """Hand-computed block of 3 slots over 2 tokens: slot k is weighted by prod_{j<k} min(1, p_j(d_j)/q_j(d_j))
    of the drafts d_j actually sampled, not by prod_{j<k} alpha_j (an average over drafts not taken)."""
    q = torch.tensor([[0.8, 0.2], [0.5, 0.5], [0.3, 0.7]], dtype=torch.float64)
    p = torch.tensor([[0.4, 0.6], [0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    picks = torch.tensor([[[0, 1, 0]]])
    logits = q.log()[None, None].clone().requires_grad_()
    monkeypatch.setattr(onpolicy, "sample_drafts", lambda lg, t, g: (
        picks, F.log_softmax(lg, -1).gather(-1, picks[..., None]).squeeze(-1), torch.zeros(1, 1, 3)))
    monkeypatch.setattr(onpolicy, "target_slot_probs", lambda *args: p[None, None])
    config = OnPolicyConfig(weight=1.0, objective="acceptance")
    loss, stats = onpolicy_loss(logits, torch.ones(1, 1, 3, dtype=torch.bool), torch.zeros(1, 8, dtype=torch.long),
                                torch.tensor([[2]]), lambda ids: ids, None, 0, config)
    alpha = [0.6, 0.6, 0.8]  # sum_v min(p, q) per slot
    reach = [1.0, 0.4 / 0.8, 0.4 / 0.8 * (0.1 / 0.5)]  # d_1 = 0: p/q = 0.5; d_2 = 1: p/q = 0.2
    expected_accepted = sum(r * a for r, a in zip(reach, alpha))  # the old weights 1, 0.6, 0.36 give 1.248
    assert float(loss.detach()) == pytest.approx(-expected_accepted / 3, abs=1e-6)  # q is float32 inside
    assert stats["exact_expected_tau"] == pytest.approx(1 + expected_accepted, abs=1e-6)
    # The weights are constants: the gradient is that of -sum_k reach_k * alpha_k / 3.
    (grad,) = torch.autograd.grad(loss, logits)
    soft = logits.detach().clone().requires_grad_()
    expected = -(torch.tensor(reach, dtype=torch.float64) * exact_acceptance(soft.softmax(-1), p)).sum() / 3
    torch.testing.assert_close(grad, torch.autograd.grad(expected, soft)[0], atol=1e-6, rtol=1e-6)


def test_survival_weights():
    reward = torch.tensor([[0.5, -torch.inf, -0.7, 0.0]])
    w = survival_weights(reward)
    assert w[0, 0] == 1 and w[0, 1] == 1  # slot 1 always reached; slot 2 after a sure acceptance
    assert w[0, 2] == 0 and w[0, 3] == 0  # slot 2 is never accepted, so nothing after it counts


@pytest.mark.parametrize("objective", ["reopold", "acceptance"])
def test_loss_raises_exact_acceptance(llama_target, objective):
    """On-policy steps on a free logit table raise the exact slot-1 acceptance sum_v min(p(v), q(v))."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 90, (1, 24))
    anchors = torch.tensor([[4, 9, 15]])
    with torch.no_grad():
        p1 = llama_target.model(input_ids=tokens).logits[0, anchors[0]].softmax(-1)  # slot 1 needs no drafts
    table = (torch.randn(1, 3, 4, llama_target.vocab_size) * 3).requires_grad_()
    valid = torch.ones(8, 3, 4, dtype=torch.bool)
    opt = torch.optim.Adam([table], lr=0.2)
    config = OnPolicyConfig(weight=1.0, credit=CreditConfig(floor=-2.0), objective=objective)

    def slot1_acceptance() -> float:
        return float(torch.minimum(table[0, :, 0].detach().softmax(-1), p1).sum(-1).mean())

    before = slot1_acceptance()
    for step in range(30):  # 8 sampled blocks per anchor and step
        loss, stats = onpolicy_loss(table.expand(8, -1, -1, -1), valid, tokens.expand(8, -1), anchors.expand(8, -1),
                                    lambda ids: ids, llama_target, step, config, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert slot1_acceptance() > before + 0.2, (before, slot1_acceptance())
    if objective == "reopold":
        assert 0 < stats["kept_fraction"] <= 1 and len(stats["sampled_accept_by_slot"]) == 4
    else:
        assert len(stats["exact_accept_by_slot"]) == 4 and 1 <= stats["exact_expected_tau"] <= 5


def test_exact_acceptance_is_total_variation_and_its_gradient_is_the_indicator_policy_gradient():
    """alpha = sum min(p, q) = 1 - TV(p, q), and d alpha = E_q[1(q < p) d log q] (the sampled reward 1[R > 0])."""
    g = torch.Generator().manual_seed(3)
    p = torch.randn(7, generator=g, dtype=torch.float64).softmax(-1)
    logits = torch.randn(7, generator=g, dtype=torch.float64).requires_grad_()
    q = logits.softmax(-1)
    alpha = exact_acceptance(q, p)
    assert float(alpha.detach()) == pytest.approx(1 - 0.5 * float((p - q.detach()).abs().sum()), abs=1e-12)
    (grad,) = torch.autograd.grad(alpha, logits)
    # E_q[1(q<p) d log q(v)] with d log q(v)/d logits = onehot(v) - q
    indicator = (q < p).double().detach()
    qd = q.detach()
    expected = sum(qd[v] * indicator[v] * (torch.eye(7, dtype=torch.float64)[v] - qd) for v in range(7))
    torch.testing.assert_close(grad, expected)


def test_training_run_with_onpolicy_term(tmp_path, monkeypatch):
    """`hyflash train` with --onpolicy-weight logs per-slot sampled acceptance and kept/clipped fractions."""
    import dataclasses
    import json

    from test_training_runs import _config, _tiny_target, _write_data

    from hyflash.training.train import train

    from hyflash.training import train as train_module

    _write_data(tmp_path / "data")
    config = dataclasses.replace(
        _config(tmp_path / "data", tmp_path / "run"), steps=4, onpolicy_weight=0.5, reward_floor=-2.0,
        entropy_top_fraction=0.5, switch_step=2,
    )
    devices = []

    def checked(logits, *args):  # the loop's sampling generator lives where the logits it samples do
        devices.append((args[-1].device, logits.device))
        return onpolicy_loss(logits, *args)

    monkeypatch.setattr(train_module, "onpolicy_loss", checked)
    train(config, progress=False, target=_tiny_target())
    assert len(devices) == 4 and all(g == d for g, d in devices)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    stats = [r["onpolicy"] for r in records if "onpolicy" in r]
    assert len(stats) == 4
    assert [s["phase"] for s in stats] == [1.0, 1.0, 2.0, 2.0]
    assert len(stats[0]["sampled_accept_by_slot"]) == config.block_size - 1
    assert all(0 <= a <= 1 for s in stats for a in s["sampled_accept_by_slot"])
    assert stats[-1]["kept_fraction"] == pytest.approx(0.5, abs=0.05)
    assert (tmp_path / "run" / "drafter" / "model.safetensors").exists()


def test_training_run_with_exact_acceptance_objective(tmp_path):
    import dataclasses
    import json

    from test_training_runs import _config, _tiny_target, _write_data

    from hyflash.errors import HyflashError
    from hyflash.training.train import train

    with pytest.raises(HyflashError, match="onpolicy_objective"):
        dataclasses.replace(_config(tmp_path / "data", tmp_path / "run"), onpolicy_objective="tv")
    _write_data(tmp_path / "data")
    config = dataclasses.replace(_config(tmp_path / "data", tmp_path / "run"), steps=3, onpolicy_weight=1.0,
                                 onpolicy_objective="acceptance")
    train(config, progress=False, target=_tiny_target())
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    stats = [r["onpolicy"] for r in records if "onpolicy" in r]
    assert len(stats) == 3
    assert all(0 <= a <= 1 for s in stats for a in s["exact_accept_by_slot"])
