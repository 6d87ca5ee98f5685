"""The many-anchor training pass equals the one-anchor oracle and the inference state, for every kind."""

from __future__ import annotations

import pytest
import torch

from hyflash.drafters import reference
from hyflash.drafters.config import KINDS, DrafterConfig
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState
from hyflash.sampling import SamplingConfig
from hyflash.targets import Target

# Small sizes that still cross every boundary: window 8, chunks of 4, blocks of 5, two layers.
SMALL = dict(window=8, chunk_size=4, block_size=5, num_heads=2, head_dim=8, num_layers=2)
CASES = [("full", "gated_delta"), ("local", "gated_delta")] + [
    (kind, rule) for kind in ("memory", "hyflash") for rule in ("linear", "gated", "delta", "gated_delta")
]


@pytest.fixture(scope="module")
def llama3_target(llama_target):
    """The tiny Llama read at three feature layers (the default for 4 layers is just one)."""
    return Target(llama_target.model, feature_layers=(1, 2, 4), name="tiny-llama-3-features")


def make(target, dtype=torch.float64, seed=0, **overrides):
    torch.manual_seed(seed)
    config = DrafterConfig.for_target(target, **{**SMALL, **overrides})
    model = DrafterModel(config, target).to(dtype)
    with torch.no_grad():  # make the memory matter: open the read gates and use varied decays
        for layer in model.layers:
            if layer.memory_out_gate is not None:
                layer.memory_out_gate.bias.fill_(2.0)
            if layer.memory_gates is not None:
                layer.memory_gates.bias.normal_(0.0, 1.5)
    return model


def sequence(target, T, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(1, T, len(target.feature_layers), target.hidden_size, generator=g, dtype=dtype)
    features[:, :, -1] *= 20  # target layers differ in scale
    tokens = torch.randint(0, target.vocab_size, (1, T), generator=g)
    return features, tokens


@pytest.mark.parametrize("kind,rule", CASES)
def test_train_forward_equals_one_anchor_reference(llama3_target, kind, rule):
    model = make(llama3_target, kind=kind, memory_rule=rule)
    features, tokens = sequence(llama3_target, 48)
    anchors = torch.tensor([[1, 3, 4, 8, 11, 12, 13, 20, 29, 40, 43]])
    hidden = model.train_forward(features, tokens, anchors)
    assert hidden.shape == (1, anchors.shape[1], 4, llama3_target.hidden_size)
    for j, a in enumerate(anchors[0].tolist()):
        torch.testing.assert_close(hidden[0, j], reference.anchor_forward(model, features[0], tokens[0], a),
                                   atol=1e-10, rtol=1e-10)


def _ingest_in_pieces(state, features, tokens, n, g):
    """Feed positions [0, n) like the decoding loop: a prompt, then 1..block_size tokens at a time."""
    i = 0
    while i < n:
        most = state.block_size if i else 9  # a prompt of 1..9 tokens, then 1..block_size per verification
        step = min(int(torch.randint(1, most + 1, (), generator=g)), n - i)
        state.ingest(tokens[i : i + step], features[i : i + step])
        i += step


@pytest.mark.parametrize("family", ["llama3_target", "gemma_target"])
@pytest.mark.parametrize("kind,rule", CASES)
def test_train_forward_equals_inference_state(request, family, kind, rule):
    target = request.getfixturevalue(family)
    model = make(target, dtype=torch.float32, kind=kind, memory_rule=rule)
    features, tokens = sequence(target, 64, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    anchors = torch.cat([torch.tensor([1, 8, 9, 12, 16, 17, 35, 59]), torch.randint(1, 64, (6,), generator=g)])[None]
    logits = model.logits(model.train_forward(features, tokens, anchors))  # [1, A, S-1, V]
    for j, a in enumerate(anchors[0].tolist()):
        state = DrafterState(model)
        _ingest_in_pieces(state, features[0], tokens[0], a, g)
        assert state.length == a
        inferred = model.logits(state.block_hidden(int(tokens[0, a])))
        torch.testing.assert_close(inferred, logits[0, j], atol=2e-4, rtol=2e-4)
        draft = state.draft(int(tokens[0, a]), 4, SamplingConfig(), None)
        assert draft.probs is None and draft.tokens.tolist() == logits[0, j].argmax(-1).tolist()


def test_batch_rows_are_independent(llama3_target):
    model = make(llama3_target, kind="hyflash", memory_rule="delta")
    f1, t1 = sequence(llama3_target, 40, seed=1)
    f2, t2 = sequence(llama3_target, 40, seed=2)
    a1, a2 = torch.tensor([[5, 33, 20]]), torch.tensor([[38, 9, 27]])
    both = model.train_forward(torch.cat([f1, f2]), torch.cat([t1, t2]), torch.cat([a1, a2]))
    torch.testing.assert_close(both[:1], model.train_forward(f1, t1, a1))
    torch.testing.assert_close(both[1:], model.train_forward(f2, t2, a2))


def test_many_anchors_do_not_see_each_other_or_the_future(llama_target):
    """Changing tokens/features at or after an anchor leaves that anchor's hidden states unchanged
    (except its own anchor token), whatever the other anchors are."""
    model = make(llama_target, kind="hyflash")
    features, tokens = sequence(llama_target, 40)
    anchors = torch.tensor([[10, 11, 30]])
    before = model.train_forward(features, tokens, anchors)
    features2, tokens2 = features.clone(), tokens.clone()
    features2[:, 10:] += 1.0
    tokens2[:, 12:] = (tokens2[:, 12:] + 1) % llama_target.vocab_size
    after = model.train_forward(features2, tokens2, anchors)
    torch.testing.assert_close(after[:, 0], before[:, 0])  # anchor 10 reads features < 10 and token 10 only
    assert not torch.allclose(after[:, 2], before[:, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_memory_bytes_constant_or_linear(llama_target, kind):
    model = make(llama_target, dtype=torch.float32, kind=kind, num_layers=1)
    state = DrafterState(model)
    sizes = {}
    features, tokens = sequence(llama_target, 400, dtype=torch.float32)
    for n in (100, 200, 300, 400):
        state.reset()
        state.ingest(tokens[0, :n], features[0, :n])
        state.draft(int(tokens[0, n - 1]), 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
        sizes[n] = state.memory_bytes()
    if kind == "full":
        per_token = 2 * 2 * 8 * 4  # keys + values, 2 heads x 8 dims, fp32
        assert sizes[200] - sizes[100] == sizes[400] - sizes[300] == 100 * per_token
    else:
        assert len(set(sizes.values())) == 1, sizes
        assert sizes[100] < 60 * 2 * 2 * 8 * 4  # far below a full cache of 100 tokens


def test_sampled_drafts_use_full_vocabulary_probs(llama_target):
    model = make(llama_target, dtype=torch.float32, draft_vocab_size=40)
    ids = torch.randperm(llama_target.vocab_size, generator=torch.Generator().manual_seed(0))[:40]
    model.set_draft_vocab(ids)
    features, tokens = sequence(llama_target, 30, dtype=torch.float32)
    state = DrafterState(model)
    state.ingest(tokens[0, :20], features[0, :20])
    sampling = SamplingConfig(temperature=0.8, top_k=10, top_p=0.9)
    draft = state.draft(int(tokens[0, 20]), 4, sampling, torch.Generator().manual_seed(0))
    assert draft.probs.shape == (4, llama_target.vocab_size)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
    assert set(draft.tokens.tolist()) <= set(ids.tolist())
    assert (draft.probs[torch.arange(4), draft.tokens] > 0).all()
    outside = torch.ones(llama_target.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert (draft.probs[:, outside] == 0).all()
    assert model.logits(torch.zeros(3, llama_target.hidden_size)).shape == (3, 40)


def test_param_counts_nearly_equal_across_kinds(llama_target):
    counts = {kind: make(llama_target, kind=kind).param_count() for kind in KINDS}
    assert counts["full"] == counts["local"]
    assert 0 < counts["hyflash"] - counts["local"] < 0.05 * counts["local"]
    assert counts["memory"] == counts["hyflash"]
    # The borrowed target embedding / LM head are not parameters of the drafter.
    assert all(p.shape[0] != llama_target.vocab_size for p in make(llama_target).parameters())


def test_train_forward_backward_runs_in_bf16_autocast(llama_target):
    model = make(llama_target, dtype=torch.float32, kind="hyflash")
    features, tokens = sequence(llama_target, 64, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.train_forward(features, tokens, torch.tensor([[5, 30, 50]]))
        loss = model.logits(hidden).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
