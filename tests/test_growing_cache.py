"""The in-place key/value cache (hyflash/targets/growing_cache.py) against transformers' DynamicCache."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_gemma3, tiny_llama
from transformers import DynamicCache

from hyflash.targets import HFTarget
from hyflash.targets import growing_cache as growing
from hyflash.targets.growing_cache import GrowingLayer


class ReferenceTarget(HFTarget):
    """HFTarget on transformers' own DynamicCache (concatenation per pass)."""

    def reset(self) -> None:
        self.cache = DynamicCache()


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_equal_dynamic_cache_bit_for_bit_through_prefill_steps_rollbacks_and_trees(make, dtype, monkeypatch):
    monkeypatch.setattr(growing, "GROWTH", 3)  # buffers fill and grow many times over this short sequence
    reference, ours = ReferenceTarget(make().to(dtype)), HFTarget(make().to(dtype))
    ids = torch.randint(0, 90, (60,), generator=torch.Generator().manual_seed(4))

    def both(call):
        a, b = call(reference), call(ours)
        assert torch.equal(a.logits, b.logits)
        assert reference.cache_length == ours.cache_length

    both(lambda t: t.prefill(ids[:14], features=False, chunk=5))
    assert all(isinstance(layer, GrowingLayer) for layer in ours.cache.layers)
    for i in range(14, 20):
        both(lambda t: t.score(ids[i : i + 1], features=False))
    both(lambda t: t.score(ids[20:26], features=True))
    for t in (reference, ours):
        t.keep(20, [0, 1])  # a chain's accepted prefix: a rollback
    both(lambda t: t.score(ids[22:25], features=False))
    tree = (torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool),
            torch.tensor([0, 1, 1, 2]))
    start = reference.cache_length
    both(lambda t: t.score(ids[30:34], features=False, tree=tree))
    for t in (reference, ours):
        t.keep(start, [0, 2, 3])  # a root-to-node path of the tree, compacted
    for i in range(40, 52):
        both(lambda t: t.score(ids[i : i + 1], features=False))
    for t in (reference, ours):
        t.rollback(10)
    both(lambda t: t.score(ids[50:58], features=False))
    both(lambda t: t.prefill(ids[:9], features=False))  # a new sequence starts from an empty cache


def test_a_step_writes_in_place_and_a_rollback_copies_nothing():
    target = HFTarget(tiny_llama())
    target.prefill(torch.arange(10), features=False)
    layer = target.cache.layers[0]
    buffer = layer._key_buffer
    target.score(torch.tensor([3]), features=False)
    target.rollback(8)
    target.score(torch.tensor([4, 5]), features=False)
    assert layer._key_buffer is buffer and target.cache_length == 10
    assert layer.keys.data_ptr() == buffer.data_ptr() and layer.keys.shape[-2] == 10
