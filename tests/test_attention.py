"""The few-query CPU attention (hyflash/targets/attention.py) against transformers' SDPA path."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_gemma3, tiny_llama
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hyflash.targets import HFTarget
from hyflash.targets.attention import NAME, few_query_attention, reference_attention, shared_heads_sdpa, use_for


class _GQA(torch.nn.Module):
    num_key_value_groups = 3


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("q_len", [1, 3, 8])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "per-head"])
def test_reference_attention_equals_sdpa(dtype, tol, q_len, mask_kind):
    if mask_kind == "none" and q_len > 1:
        pytest.skip("several unmasked queries are SDPA's (causal) business: few_query_attention hands them over")
    g = torch.Generator().manual_seed(q_len)
    kv = 40
    q, k, v = (torch.randn(1, h, n, 16, generator=g).to(dtype) for h, n in ((9, q_len), (3, kv), (3, kv)))
    mask = None
    if mask_kind != "none":
        heads = 9 if mask_kind == "per-head" else 1
        mask = torch.rand(1, heads, q_len, kv, generator=g) > 0.4
        mask[..., 0] = True
        if mask_kind == "additive":
            mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    expected, _ = sdpa_attention_forward(_GQA(), q, k, v, mask, scaling=0.3)
    got, _ = reference_attention(q, k, v, mask, 0.3)
    assert got.shape == expected.shape == (1, q_len, 9, 16)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("q_len", [2, 3, 8])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "per-head"])
def test_shared_heads_sdpa_is_transformers_sdpa_bit_for_bit_in_float32(q_len, mask_kind):
    """float32 verify passes: the key/value heads shared inside SDPA give exactly what transformers computes
    after repeating them per query head (so speculative greedy text stays what it was)."""
    g = torch.Generator().manual_seed(q_len)
    kv = 300
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((9, q_len), (3, kv), (3, kv)))
    heads = 9 if mask_kind == "per-head" else 1
    mask = torch.rand(1, heads, q_len, kv, generator=g) > 0.3
    mask[..., 0] = True
    if mask_kind == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    expected, _ = sdpa_attention_forward(_GQA(), q, k, v, mask, scaling=0.3)
    got, _ = shared_heads_sdpa(q, k, v, mask, 0.3)
    assert torch.equal(got, expected)
    routed, _ = few_query_attention(_GQA(), q, k, v, mask, scaling=0.3)
    assert torch.equal(routed, expected)


def test_large_and_unmasked_passes_go_to_sdpa(monkeypatch):
    import hyflash.targets.attention as attention

    calls = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **k: calls.append(a[1].shape[2]) or (None, None))
    q = torch.zeros(1, 9, 40, 16)
    k = torch.zeros(1, 3, 40, 16)
    few_query_attention(_GQA(), q, k, k, torch.ones(1, 1, 40, 40, dtype=torch.bool))  # over MAX_QUERIES
    few_query_attention(_GQA(), q[:, :, :4], k, k, None)  # causal prefill convention
    assert calls == [40, 4]
    few_query_attention(_GQA(), q[:, :, :1].bfloat16(), k.bfloat16(), k.bfloat16(), None)  # a bf16 step: ours
    assert calls == [40, 4]
    few_query_attention(_GQA(), q[:, :, :1], k, k, None)  # a float32 step: transformers shares the heads already
    assert calls == [40, 4, 1]


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_bf16_cpu_targets_switch_and_keep_their_logits(make, monkeypatch):
    """A bf16 target switches to few_query_cpu; prefill, one-token steps, a block pass
    and a tree pass give SDPA's logits up to bf16 rounding, sliding-window layers (Gemma-3) included."""
    reference = make().to(torch.bfloat16)
    ours = HFTarget(make().to(torch.bfloat16))
    assert ours.model.config._attn_implementation == NAME and reference.config._attn_implementation == "sdpa"
    import hyflash.targets.attention as attention

    calls = []
    plain = attention.reference_attention
    monkeypatch.setattr(attention, "reference_attention", lambda *a: calls.append(a[0].shape[2]) or plain(*a))
    ids = torch.randint(0, 90, (1, 24), generator=torch.Generator().manual_seed(1))
    full = reference(ids).logits[0].float()
    out = ours.prefill(ids[0, :12], features=False)
    for t in range(12, 20):  # one token at a time: the few-query path
        step = ours.score(ids[0, t : t + 1], features=False)
        torch.testing.assert_close(step.logits[-1].float(), full[t], atol=0.05, rtol=0.05)
    block = ours.score(ids[0, 20:24], features=False)  # a verify pass: causal mask inside the block
    torch.testing.assert_close(block.logits.float(), full[20:24], atol=0.05, rtol=0.05)
    assert out.logits.shape[-1] == full.shape[-1]
    layers = ours.num_layers
    # Steps and the block took the few-query path (a 12-token prefill too where its layers get a mask: Gemma's
    # sliding ones; an unmasked causal prefill stays with SDPA).
    assert [c for c in calls if c != 12] == [1] * (8 * layers) + [4] * layers


def test_float32_cpu_targets_switch_and_keep_their_logits_exactly(monkeypatch):
    """float32: one-token steps stay on transformers' SDPA path, verify blocks and trees take the shared-heads
    SDPA, and every logit is what the SDPA model gives for the same passes, bit for bit."""
    import hyflash.targets.attention as attention

    reference, ours = HFTarget(tiny_llama()), HFTarget(tiny_llama())
    assert ours.model.config._attn_implementation == NAME
    reference.model.set_attn_implementation("sdpa")
    calls = []
    shared = attention.shared_heads_sdpa
    monkeypatch.setattr(attention, "shared_heads_sdpa", lambda *a: calls.append(a[0].shape[2]) or shared(*a))
    ids = torch.randint(0, 90, (30,), generator=torch.Generator().manual_seed(2))
    for target in (reference, ours):
        target.prefill(ids[:12], features=False)
    for t in range(12, 16):
        a, b = (target.score(ids[t : t + 1], features=False).logits for target in (reference, ours))
        assert torch.equal(a, b)
    a, b = (target.score(ids[16:21], features=False).logits for target in (reference, ours))
    assert torch.equal(a, b)
    tree = (torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool), torch.tensor([0, 1, 1]))
    a, b = (target.score(ids[21:24], features=False, tree=tree).logits for target in (reference, ours))
    assert torch.equal(a, b)
    assert calls == [5] * ours.num_layers + [3] * ours.num_layers  # the block and the tree, not the steps
