"""The chunkwise-parallel memory equals the token-by-token recurrence for every rule."""

from __future__ import annotations

import pytest
import torch

from hyflash.drafters import memory, reference
from hyflash.drafters.config import MEMORY_RULES


def _inputs(dtype, T=24, heads=3, d=8, gate_scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, heads, T, d, generator=g, dtype=dtype)
    v = torch.randn(2, heads, T, d, generator=g, dtype=dtype)
    # Strong, varied gates: decays down to ~0.05 and write strengths across (0, 1).
    gates = torch.randn(2, heads, T, 2, generator=g, dtype=dtype) * gate_scale
    return k, v, gates


@pytest.mark.parametrize("rule", MEMORY_RULES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("chunk", [1, 4, 8])
@pytest.mark.parametrize("mode", ["sequential", "blocked"])
def test_chunked_equals_token_by_token(rule, dtype, tol, chunk, mode):
    k, v, gates = _inputs(dtype)
    initial = torch.randn(2, 3, 8, memory.value_dim(8, rule), dtype=dtype)
    chunked = memory.chunk_scan(k, v, gates, rule, chunk, initial=initial, mode=mode)  # [2, 3, T/C + 1, dk, dv]
    steps = reference.recurrent_states(k, v, gates, rule, initial=initial)  # [2, 3, T + 1, dk, dv]
    assert chunked.shape[-3] == 24 // chunk + 1
    torch.testing.assert_close(chunked, steps[..., ::chunk, :, :], atol=tol, rtol=tol)
    # Reads agree too, including the linear rule's normaliser.
    q = torch.randn(2, 3, 5, 8, dtype=dtype)
    torch.testing.assert_close(
        memory.read(chunked[..., -1, :, :], q, rule),
        torch.stack([torch.stack([reference.read_memory(steps[b, :, -1], q[b, :, i], rule) for i in range(5)], 1)
                     for b in range(2)]),
        atol=tol, rtol=tol,
    )


@pytest.mark.parametrize("rule", MEMORY_RULES)
def test_folding_in_pieces_equals_one_scan(rule):
    """Inference folds chunk by chunk on top of the state; training scans once: same states."""
    k, v, gates = _inputs(torch.float64, T=32)
    once = memory.chunk_scan(k, v, gates, rule, 4)[..., -1, :, :]
    state = None
    for lo, hi in [(0, 4), (4, 16), (16, 20), (20, 32)]:
        piece = [x[..., lo:hi, :] for x in (k, v, gates)]
        state = memory.chunk_scan(*piece, rule, 4, state)[..., -1, :, :]
    torch.testing.assert_close(state, once, atol=1e-12, rtol=1e-12)


def test_delta_rule_state_stays_bounded_over_long_input():
    """L2-normalised keys and beta in (0, 1): the delta-rule state does not blow up over thousands of tokens."""
    k, v, gates = _inputs(torch.float32, T=4096, heads=2, d=16, gate_scale=1.0)
    states = memory.chunk_scan(k, v, gates, "delta", 64)
    assert torch.isfinite(states).all()
    assert states[..., -1, :, :].norm(dim=(-1, -2)).max() < 10 * v.norm(dim=-1).max()


def test_both_scans_give_the_same_gradients():
    grads = []
    for mode in ("sequential", "blocked"):
        k, v, gates = (x.requires_grad_() for x in _inputs(torch.float64, T=40))
        memory.chunk_scan(k, v, gates, "gated_delta", 4, mode=mode)[..., ::3, :, :].sum().backward()
        grads.append([k.grad, v.grad, gates.grad])
    for a, b in zip(*grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
