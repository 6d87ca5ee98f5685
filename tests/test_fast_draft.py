"""FastDraft (the few-operation draft step) computes what the general DrafterModel path computes, for every kind,
memory rule and option, and its int8 form drafts what the int8 general path drafts."""

from __future__ import annotations

import pytest
import torch

from hyflash.drafters.layers import rope
from hyflash.drafters.state import DrafterState
from hyflash.sampling import SamplingConfig
from test_drafter_model import CASES, _ingest_in_pieces, llama3_target, make, sequence  # noqa: F401 (a fixture)


def _pair(model):
    return DrafterState(model, fast=True), DrafterState(model, fast=False)


@pytest.mark.parametrize("kind,rule", CASES)
def test_fast_hidden_equals_general_path_as_context_grows(llama3_target, kind, rule):
    model = make(llama3_target, kind=kind, memory_rule=rule)  # float64: differences are rounding only
    features, tokens = sequence(llama3_target, 70)
    fast, general = _pair(model)
    assert fast.fast is not None and general.fast is None
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for n in (1, 6, 13, 31, 70):  # inside the window, across chunk folds, far past it
        for state, g in ((fast, g1), (general, g2)):
            state.reset()
            _ingest_in_pieces(state, features[0], tokens[0], n, g)
        last = int(tokens[0, n - 1])
        torch.testing.assert_close(fast.block_hidden(last), general.block_hidden(last), atol=1e-10, rtol=1e-10)
        # Both states hold the same window and memory (a fast path must not disturb ingest).
        for held_fast, held_general in zip(_context(fast), _context(general), strict=True):
            torch.testing.assert_close(held_fast, held_general, atol=1e-10, rtol=1e-10)
        # The fast path's rotated window keys are the window keys after RoPE at their own positions.
        live = fast.length - fast.start
        assert len(fast.rotated_keys) == (len(fast.keys) if model.config.window_capacity else 0)
        positions = fast.start + torch.arange(live)
        for keys, rotated_keys in zip(fast.keys, fast.rotated_keys):
            torch.testing.assert_close(rotated_keys[:live], rope(keys[:live], positions, model.config.rope_theta),
                                       atol=1e-10, rtol=1e-10)


def _context(state):
    """What the general path holds: window keys before RoPE, values, gates, memory, the last feature."""
    return [*state.keys, *state.values, *state.gates, *state.states, state.last_feature]


@pytest.mark.parametrize("overrides", [dict(slot_inputs=False), dict(mask_token_id=3), dict(num_layers=1, block_size=8)])
def test_fast_hidden_equals_general_path_for_options(llama3_target, overrides):
    model = make(llama3_target, **overrides)
    features, tokens = sequence(llama3_target, 40)
    fast, general = _pair(model)
    for state in (fast, general):
        state.ingest(tokens[0, :29], features[0, :29])
    torch.testing.assert_close(fast.block_hidden(5), general.block_hidden(5), atol=1e-10, rtol=1e-10)


def test_fast_path_in_float32_and_int8_drafts_like_the_general_path(llama3_target):
    model = make(llama3_target, dtype=torch.float32, kind="hyflash", memory_rule="gated_delta")
    features, tokens = sequence(llama3_target, 50, dtype=torch.float32)
    fast, general = _pair(model)
    for state in (fast, general):
        state.ingest(tokens[0, :37], features[0, :37])
    torch.testing.assert_close(fast.block_hidden(7), general.block_hidden(7), atol=1e-5, rtol=1e-5)
    exact = model.logits(general.block_hidden(7))
    params = model.param_count()
    fast.quantize_int8()
    assert model.int8_head is not None  # the model's Linears (ingest, head) are int8 too
    assert model.param_count() == params  # the bench's parameter column counts the float model, int8 or not
    quantized = model.logits(fast.block_hidden(7))
    # int8 weights move the logits a little, not the draft: top-1 agrees where the reference is not a near-tie.
    top2 = exact.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * exact.abs().amax()
    assert clear.any()
    assert torch.equal(quantized.argmax(-1)[clear], exact.argmax(-1)[clear])
    draft = fast.draft(7, 4, SamplingConfig(), None)
    assert draft.tokens.tolist() == model.to_target_ids(quantized[:4].argmax(-1)).tolist()


def test_a_state_of_an_already_quantised_model_uses_the_general_path(llama3_target):
    model = make(llama3_target, dtype=torch.float32).quantize_int8()
    assert DrafterState(model).fast is None
