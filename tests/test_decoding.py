"""Greedy speculative decoding must reproduce plain greedy decoding token for token (fp32)."""

from __future__ import annotations

import pytest
import torch
from drafters_for_tests import RandomDrafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyflash.decoding import generate
from hyflash.drafters.ngram import NgramDrafter
from hyflash.drafters.oracle import TargetGreedyDrafter

FAST = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _drafters(target, block_size: int):
    return [
        NgramDrafter(block_size=block_size),
        RandomDrafter(target.vocab_size, block_size=block_size),
        TargetGreedyDrafter(target.model, block_size=block_size),
    ]


@pytest.mark.parametrize("family", ["llama_target", "gemma_target"])
@FAST
@given(
    prompt=st.lists(st.integers(0, 89), min_size=1, max_size=30),
    block_size=st.integers(2, 9),
    max_new=st.integers(1, 30),
)
def test_greedy_speculative_equals_plain(request, family, prompt, block_size, max_new):
    target = request.getfixturevalue(family)
    plain = generate(target, prompt, None, max_new_tokens=max_new)
    assert len(plain.tokens) == max_new
    for drafter in _drafters(target, block_size):
        spec = generate(target, prompt, drafter, max_new_tokens=max_new)
        assert spec.tokens == plain.tokens, type(drafter).__name__
        assert sum(spec.committed_per_pass) + 1 == len(spec.tokens)


def test_oracle_drafter_reaches_full_acceptance(llama_target):
    block = 6
    result = generate(llama_target, list(range(10)), TargetGreedyDrafter(llama_target.model, block), max_new_tokens=61)
    # The first token comes from the prefill; then every pass commits 5 drafts + 1 bonus = block size.
    assert result.committed_per_pass == [block] * 10
    assert result.tau == block
    assert result.acceptance_by_position == [1.0] * (block - 1)


def test_metrics_are_consistent(llama_target):
    drafter = RandomDrafter(llama_target.vocab_size, block_size=5)
    r = generate(llama_target, [1, 2, 3], drafter, max_new_tokens=30)
    assert r.target_passes == len(r.committed_per_pass)
    assert r.tau == pytest.approx((len(r.tokens) - 1) / r.target_passes)
    assert all(0 <= a <= d for a, d in zip(r.accepted_by_position, r.drafted_by_position))
    # Acceptance can only fall along the block: slot k is accepted only if slot k-1 was.
    assert r.accepted_by_position == sorted(r.accepted_by_position, reverse=True)
    assert r.draft_time > 0 and r.verify_time > 0 and r.total_time >= r.verify_time
    d = r.to_dict()
    assert {"tau", "acceptance_by_position", "tokens_per_second", "draft_memory_bytes"} <= d.keys()


def test_draft_time_is_the_drafters_share_and_zero_without_one(llama_target, monkeypatch):
    """Each draft sleeps 2 ms: draft_time holds at least those, and draft and verify time together fit in the
    time after the prefill (disjoint shares); plain decoding has no draft time at all."""
    import time

    drafter = RandomDrafter(llama_target.vocab_size, block_size=5)
    draft, drafts = drafter.draft, []

    def slow_draft(*args, **kwargs):
        drafts.append(1)
        time.sleep(0.002)
        return draft(*args, **kwargs)

    monkeypatch.setattr(drafter, "draft", slow_draft)
    r = generate(llama_target, [1, 2, 3], drafter, max_new_tokens=30)
    assert len(drafts) >= 5 and r.draft_time >= 0.002 * len(drafts)
    assert r.draft_time + r.verify_time <= r.total_time - r.prefill_time
    plain = generate(llama_target, [1, 2, 3], None, max_new_tokens=30)
    assert plain.draft_time == 0 and plain.verify_time > 0


def test_stops_at_eos_and_streams(llama_target):
    plain = generate(llama_target, [5, 6, 7], None, max_new_tokens=30)
    eos = plain.tokens[7]
    first = plain.tokens.index(eos)
    llama_target.eos_token_ids = frozenset({eos})
    try:
        streamed: list[int] = []
        spec = generate(
            llama_target, [5, 6, 7], NgramDrafter(4), max_new_tokens=30, on_tokens=streamed.extend
        )
    finally:
        llama_target.eos_token_ids = frozenset()
    assert spec.tokens == plain.tokens[: first + 1]
    assert streamed == spec.tokens


def test_respects_model_context(llama_target):
    prompt = [3] * (llama_target.max_context - 5)
    r = generate(llama_target, prompt, NgramDrafter(8), max_new_tokens=50)
    assert len(r.tokens) == 5
    assert llama_target.cache_length <= llama_target.max_context


def test_rollback_is_exact(llama_target, gemma_target):
    for target in (llama_target, gemma_target):
        torch.manual_seed(0)
        prompt = torch.randint(0, 90, (21,))  # longer than the Gemma sliding window (8)
        block = torch.randint(0, 90, (6,))
        tail = torch.randint(0, 90, (4,))
        target.prefill(prompt)
        target.score(block)
        target.rollback(len(prompt) + 2)
        assert target.cache_length == len(prompt) + 2
        after = target.score(tail)
        fresh = target.prefill(torch.cat([prompt, block[:2], tail]))
        torch.testing.assert_close(after.logits[-1:], fresh.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(after.features, fresh.features[-4:], atol=1e-5, rtol=1e-5)


def test_prefill_keeps_one_logits_row_and_chunks_exactly(llama_target, gemma_target):
    """Long prompts: only the last position's logits are materialised, and a prompt run in chunks (across
    Gemma's sliding window of 8) gives the same logits, features and cache as one pass."""
    for target in (llama_target, gemma_target):
        prompt = torch.randint(0, 90, (23,), generator=torch.Generator().manual_seed(1))
        whole = target.prefill(prompt, chunk=1000)
        assert whole.logits.shape == (1, target.vocab_size)
        next_whole = target.score(torch.tensor([5, 6]))
        chunked = target.prefill(prompt, chunk=5)
        next_chunked = target.score(torch.tensor([5, 6]))
        torch.testing.assert_close(chunked.logits, whole.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chunked.features, whole.features, atol=1e-5, rtol=1e-5)
        assert chunked.features.shape[0] == len(prompt)
        torch.testing.assert_close(next_chunked.logits, next_whole.logits, atol=1e-5, rtol=1e-5)


def test_a_transformers_prefill_keeps_the_last_prompts_whole_chunks_bit_for_bit(llama_target, gemma_target,
                                                                               monkeypatch):
    """The transformers target keeps the whole chunks a prompt shares with its last prefill: a longer prompt runs
    only its new chunks, as the very passes a fresh prefill would run, with a fresh prefill's logits, next pass
    and drafter state (the drafter restored to its snapshot), bit for bit; the same prompt again runs nothing.
    Gemma-3's sliding-window layers keep only their window: it reuses nothing."""
    from drafters_for_tests import same_state
    from hyflash.drafters.hybrid import HybridDrafter
    from hyflash.drafters.state import DrafterState
    from test_drafter_model import make

    target = llama_target
    passes: list[tuple[int, int]] = []
    real_forward = target._forward

    def spy(ids, features, last_logits_only=False, **tree):
        passes.append((target.cache_length, len(ids)))
        return real_forward(ids, features, last_logits_only, **tree)

    monkeypatch.setattr(target, "_forward", spy)
    prompt = torch.randint(0, 90, (30,), generator=torch.Generator().manual_seed(3))
    first, longer, nxt = prompt[:20], prompt[:27], prompt[27:30]
    model = make(target, dtype=torch.float32, copy_ngram=2)
    fresh = HybridDrafter(DrafterState(model))
    target.reset()
    want = target.prefill(longer, on_features=fresh.ingest, chunk=8).logits
    fresh_passes, want_state = list(passes), fresh.snapshot()
    want_next = target.score(nxt, features=False).logits
    assert fresh_passes == [(0, 8), (8, 8), (16, 8), (24, 3)]

    drafter = HybridDrafter(DrafterState(model))
    target.prefill(first, on_features=drafter.ingest, resumable=drafter, chunk=8)
    target.score(torch.tensor([5, 6, 7]), features=True)  # a generation's passes after the prompt
    target.rollback(21)
    passes.clear()
    drafter.reset()
    got = target.prefill(longer, on_features=drafter.ingest, resumable=drafter, chunk=8).logits
    assert target.reused_tokens == 16 and passes == fresh_passes[2:]
    assert torch.equal(got, want) and same_state(drafter.snapshot(), want_state)
    assert torch.equal(target.score(nxt, features=False).logits, want_next)

    passes.clear()
    drafter.reset()
    again = target.prefill(longer, on_features=drafter.ingest, resumable=drafter, chunk=8).logits
    assert target.reused_tokens == len(longer) and passes == [] and target.cache_length == len(longer)
    assert torch.equal(again, want) and same_state(drafter.snapshot(), want_state)
    assert torch.equal(target.prefill(longer, features=False, chunk=8).logits, want) and passes == []
    target.prefill(longer, features=False, chunk=5)  # another chunking: nothing kept
    assert target.reused_tokens == 0

    gemma_target.prefill(longer, features=False, chunk=8)
    gemma_target.prefill(longer, features=False, chunk=8)
    assert gemma_target.reused_tokens == 0
