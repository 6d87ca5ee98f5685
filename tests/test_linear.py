"""The few-rows linear kernel of verify passes (hyflash/targets/linear.py) against torch's own nn.Linear."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from hyflash.decoding import generate
from hyflash.drafters.ngram import NgramDrafter
from hyflash.sampling import SamplingConfig
from hyflash.targets import HFTarget
from hyflash.targets import linear
from hyflash.targets.linear import FewRowsConfig, FewRowsLinear, reference_linear, use_for, verify_passes


def _linear(out_features: int, in_features: int, bias: bool) -> FewRowsLinear:
    torch.manual_seed(out_features + in_features)
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    layer.__class__ = FewRowsLinear
    return layer


@pytest.mark.parametrize("rows", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("shape", [(48, 48), (512, 32)])  # a square layer, an output head (ratio >= 8)
@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_kernel_equals_torch_linear_to_rounding(rows, shape, bias):
    layer = _linear(*shape, bias)
    x = torch.randn(1, rows, shape[1])
    with verify_passes():
        got = layer(x)
    torch.testing.assert_close(got, reference_linear(layer, x), atol=1e-5, rtol=1e-5)


def test_outside_verify_passes_and_for_one_row_or_batches_it_is_torch_linear_bit_for_bit(monkeypatch):
    """Plain decoding (one-token steps), prefills and batches never see the other kernel: their bits are torch's."""
    layer = _linear(512, 32, bias=False)
    taken = []
    monkeypatch.setattr(FewRowsLinear, "_max_rows", lambda self: taken.append(1) or 16)
    for x, inside in [(torch.randn(1, 1, 32), True), (torch.randn(2, 4, 32), True), (torch.randn(1, 4, 32), False),
                      (torch.randn(4, 32), True)]:
        if inside:
            with verify_passes():
                got = layer(x)
        else:
            got = layer(x)
        assert torch.equal(got, reference_linear(layer, x))
    assert taken == []  # (a 1-row step would short-circuit before asking; nothing else may ask either)


def test_which_rows_take_the_kernel_depends_on_the_layer_shape(monkeypatch):
    """Square layers take it up to layer_rows, output heads up to head_rows (measured where each is faster)."""
    calls = []
    original = torch.Tensor.t
    monkeypatch.setattr(torch.Tensor, "t", lambda self: calls.append(self.shape) or original(self))
    config = FewRowsConfig()
    square, head = _linear(48, 48, False), _linear(512, 32, False)
    with verify_passes():
        for layer, limit in ((square, config.layer_rows), (head, config.head_rows)):
            for rows in (limit, limit + 1):
                calls.clear()
                layer(torch.randn(1, rows, layer.in_features))
                assert bool(calls) == (rows <= limit), (layer.out_features, rows)


def test_swap_keeps_weights_tying_and_state_dict_and_skips_bf16():
    model = tiny_llama()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys, head = list(model.state_dict()), model.lm_head.weight
    assert use_for(model)
    assert type(model.lm_head) is FewRowsLinear and model.lm_head.weight is head
    assert list(model.state_dict()) == keys and model.lm_head.weight is model.get_input_embeddings().weight
    assert not use_for(tiny_llama().to(torch.bfloat16))


def test_greedy_speculative_text_on_a_float32_target_equals_plain_decoding(monkeypatch):
    """The verify passes take the kernel (counted), and greedy text is plain decoding's token for token."""
    target = HFTarget(tiny_llama(seed=3, vocab=61))
    assert type(target.model.lm_head) is FewRowsLinear
    prompt = [5, 9, 11, 5, 9, 11, 5, 9, 11, 5, 9] * 3
    plain = generate(target, prompt, None, max_new_tokens=40, sampling=SamplingConfig())
    used = []
    forward = FewRowsLinear.forward
    monkeypatch.setattr(FewRowsLinear, "forward", lambda self, x: used.append(x.shape[1]) or forward(self, x))
    speculative = generate(target, prompt, NgramDrafter(), max_new_tokens=40, sampling=SamplingConfig())
    assert speculative.tokens == plain.tokens
    assert max(used) > 1  # some passes verified drafts


class _FakeKernels:
    """Kernels that take no real time but advance a fake clock: torch's by `stock(rows)` a weight, the few-rows
    kernel by `fast(rows)`."""

    def __init__(self, monkeypatch, stock, fast):
        self.now = 0.0
        monkeypatch.setattr(linear, "F", type("F", (), {"linear": staticmethod(lambda x, w: self._tick(stock(x.shape[1])))}))
        monkeypatch.setattr(linear, "_kernel", lambda x, w: self._tick(fast(x.shape[1])))

    def _tick(self, dt):
        self.now += dt

    def clock(self):
        return self.now


@pytest.mark.parametrize("wins_up_to", [1, 5, 16])
def test_the_row_limit_is_where_the_kernel_stops_beating_torch_on_this_machine(monkeypatch, wins_up_to):
    """measure_rows keeps the kernel for every row count from 2 up to the first it loses at (as on the Zen 4,
    whose small layers lose from 12 rows; on the Intel Xeon the head lost at 2 rows already: 1, never)."""
    fake = _FakeKernels(monkeypatch, stock=lambda r: 1.0 + r, fast=lambda r: 1.5 + r if r > wins_up_to else 0.5 + r)
    assert linear.measure_rows([torch.zeros(8, 4)] * 3, clock=fake.clock) == wins_up_to


def test_use_for_applies_the_measured_limits_per_shape_and_measures_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(linear, "measure_rows", lambda weights: measured.append(tuple(weights[0].shape)) or (
        1 if weights[0].shape[0] == 97 else 6))  # the head (vocabulary 97) never faster
    model = tiny_llama()
    assert use_for(model)
    limits = {tuple(m.weight.shape): m.max_rows for m in model.modules() if type(m) is FewRowsLinear}
    assert limits[tuple(model.lm_head.weight.shape)] == 1 and set(limits.values()) == {1, 6}
    assert sorted(measured) == sorted(limits)  # each shape once
    with verify_passes():  # a head measured as never faster takes torch's kernel: bit for bit F.linear
        x = torch.randn(1, 2, model.lm_head.in_features)
        assert torch.equal(model.lm_head(x), reference_linear(model.lm_head, x))
    measured.clear()
    again = tiny_llama()
    use_for(again)
    assert measured == [] and {tuple(m.weight.shape): m.max_rows for m in again.modules()
                               if type(m) is FewRowsLinear} == limits  # from the cache
