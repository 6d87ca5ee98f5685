"""The many-anchor training pass equals the one-anchor oracle and the inference state, for every kind."""

from __future__ import annotations

import pytest
import torch

from hyflash.drafters import reference
from drafters_for_tests import same_state
from hyflash.drafters.base import Drafter
from hyflash.drafters.config import KINDS, DrafterConfig
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState
from hyflash.sampling import SamplingConfig
from hyflash.targets import HFTarget

# Small sizes that still cross every boundary: window 8, chunks of 4, blocks of 5, two layers.
SMALL = dict(window=8, chunk_size=4, block_size=5, num_heads=2, head_dim=8, num_layers=2)
CASES = [("full", "gated_delta"), ("local", "gated_delta")] + [
    (kind, rule) for kind in ("memory", "hyflash") for rule in ("linear", "gated", "delta", "gated_delta")
]


@pytest.fixture(scope="module")
def llama3_target(llama_target):
    """The tiny Llama read at three feature layers (the default for 4 layers is just one)."""
    return HFTarget(llama_target.model, feature_layers=(1, 2, 4), name="tiny-llama-3-features")


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


def _with_copy_weights(model, seed=0, scale=0.5):
    """Random, large copy weights: the copy input must change the draft for the tests to see it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.copy_proj.weight.copy_(torch.randn(model.copy_proj.weight.shape, generator=g) * scale)
        model.copy_length.weight.copy_(torch.randn(model.copy_length.weight.shape, generator=g) * scale)
        if model.config.copy_gate:
            model.copy_gate.weight.copy_(torch.randn(model.copy_gate.weight.shape, generator=g) * scale)
            model.copy_gate.bias.fill_(4 * scale)
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


@pytest.mark.parametrize("kind", ["hyflash", "full"])
def test_a_narrow_drafter_computes_one_function_on_every_path(llama3_target, kind):
    """hidden_size H/2: the fusion, the embeddings' projections and the layers work at H/2 and out_proj maps
    the result to the head's width H. The one-anchor oracle, training's pass and the inference state (fast and
    general) agree, with a copy input, its gate and the pointer."""
    H = llama3_target.hidden_size
    model = _with_copy_weights(make(llama3_target, kind=kind, hidden_size=H // 2, copy_ngram=3, copy_gate=True,
                                    draft_vocab_size=30))
    model.set_draft_vocab(torch.arange(30))  # ids 30.. are outside: the pointer reaches them
    assert model.out_proj.weight.shape == (H, H // 2) and model.layers[0].q_proj.weight.shape[1] == H // 2
    features, tokens = sequence(llama3_target, 48)
    tokens = tokens % 6  # a small alphabet: suffix matches of every length, so the copy input is used
    anchors = torch.tensor([[1, 4, 9, 12, 13, 20, 29, 40, 46]])
    copy = model.copy_inputs(tokens, anchors)
    assert (copy[1] > 1).any()
    hidden = model.train_forward(features, tokens, anchors, copy)
    assert hidden.shape == (1, anchors.shape[1], 4, H)  # out_proj's output: what the head reads
    logits = model.block_logits(hidden, copy[0])
    g = torch.Generator().manual_seed(1)
    for j, a in enumerate(anchors[0].tolist()):
        torch.testing.assert_close(hidden[0, j], reference.anchor_forward(model, features[0], tokens[0], a),
                                   atol=1e-10, rtol=1e-10)
        for fast in (True, False):
            state = DrafterState(model, fast=fast)
            assert (state.fast is not None) == fast
            _ingest_in_pieces(state, features[0], tokens[0], a, g)
            last = int(tokens[0, a])
            inferred = state.block_hidden(last, state.copy_candidates(last))
            torch.testing.assert_close(inferred, hidden[0, j], atol=1e-10, rtol=1e-10)
            with torch.inference_mode():
                inferred_logits = model.block_logits(inferred, copy[0][0, j])
            torch.testing.assert_close(inferred_logits, logits[0, j])  # float32 logits


def test_a_narrow_drafter_has_the_parameters_its_width_gives(llama3_target):
    """Parameter count = the formula in docs/drafters.md ("Width"), at the target's width (no out_proj) and at
    half of it, where the default heads and MLP width follow the drafter's width, not the target's."""
    H, nF, n = llama3_target.hidden_size, len(llama3_target.feature_layers), 3

    def expected(cfg) -> int:
        N, h, d, inner = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
        # norms, q/k/v/o, q/k norms, SwiGLU MLP, memory gates (2 per head) and read gate (1 per head), with biases
        layer = 2 * N + 4 * N * h * d + 2 * d + 3 * N * inner + 3 * h * (N + 1)
        fusion = nF * H + nF * H * N + N
        slots = H * N + N * N + N  # anchor_proj, context_proj, mask vector
        copy = H * N + (n + 1) * N + H + 1  # copy_proj, match lengths, gate (it reads width H)
        out = N * H if N != H else 0
        return fusion + slots + copy + cfg.num_layers * layer + N + out

    overrides = dict(kind="hyflash", num_layers=1, num_heads=0, copy_ngram=n, copy_gate=True)
    wide, narrow = make(llama3_target, **overrides), make(llama3_target, hidden_size=H // 2, **overrides)
    assert (wide.config.hidden_size, wide.config.num_heads, wide.config.intermediate_size) == (H, 4, 128)
    assert (narrow.config.hidden_size, narrow.config.num_heads, narrow.config.intermediate_size) == (H // 2, 2, 64)
    assert wide.param_count() == expected(wide.config)
    assert narrow.param_count() == expected(narrow.config) < wide.param_count()


def test_a_narrow_drafter_refuses_what_needs_the_targets_width(llama_target):
    from hyflash.errors import HyflashError

    for overrides in (dict(slot_inputs=False), dict(mask_token_id=3)):
        with pytest.raises(HyflashError, match="hidden_size 16 differs"):
            make(llama_target, hidden_size=16, **overrides)
    with pytest.raises(HyflashError, match="width 16 is not the target's 32"):
        make(llama_target, hidden_size=16).init_from_target()


def test_train_forward_backward_runs_in_bf16_autocast(llama_target):
    model = make(llama_target, dtype=torch.float32, kind="hyflash")
    features, tokens = sequence(llama_target, 64, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.train_forward(features, tokens, torch.tensor([[5, 30, 50]]))
        loss = model.logits(hidden).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_head_of_sliced_slots_is_one_matrix_product(llama_target):
    """Training's slots 1.. are a non-contiguous slice: their logits must be the same numbers as row by row,
    computed as one matrix product (a batched product with the weight broadcast per anchor was 6x slower)."""
    from torch.profiler import profile

    model = make(llama_target, dtype=torch.float32)
    hidden = torch.randn(2, 3, model.config.block_size, llama_target.hidden_size, requires_grad=True)
    sliced = hidden[:, :, 1:]
    with profile() as prof:
        logits = model.logits(sliced)
        logits.sum().backward()
    ops = {e.key for e in prof.key_averages()}
    assert "aten::bmm" not in ops and "aten::mm" in ops
    rows = torch.stack([model.logits(r) for r in sliced.detach().reshape(-1, sliced.shape[-1])])
    torch.testing.assert_close(logits.detach(), rows.view_as(logits), rtol=1e-5, atol=1e-5)
    assert logits.shape[:-1] == sliced.shape[:-1] and hidden.grad is not None


@pytest.mark.parametrize("shared", [True, False])
def test_context_matmul_equals_broadcast_matmul_without_copying_the_context_per_block(shared):
    """The full kind's context is shared by every block ([B, 1, heads, L, d]): a product with it must give the
    numbers and gradients of the broadcast `a @ b`, without any op reading a per-block copy of it (on the
    grid's 4k context such copies were 4.8 GB each and ran depth 2 out of memory)."""
    from torch.profiler import profile

    from hyflash.drafters.layers import context_matmul

    g = torch.Generator().manual_seed(0)
    B, A, h, S, L, d = 2, 5, 3, 4, 40, 8
    a = torch.randn(B, A, h, S, d, generator=g, requires_grad=True)
    b = torch.randn(B, 1 if shared else A, h, d, L, generator=g, requires_grad=True)
    with profile(record_shapes=True) as prof:
        out = context_matmul(a, b)
        out.pow(2).sum().backward()
    grads = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    (a @ b).pow(2).sum().backward()
    torch.testing.assert_close(out.detach(), (a @ b).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1], b.grad, rtol=1e-5, atol=1e-5)
    if shared:
        per_block = {(B, A, h, d, L), (B * A * h, d, L), (B * A, h, d, L)}
        seen = {tuple(shape) for e in prof.events() if e.name != "aten::expand" for shape in e.input_shapes}
        assert not per_block & seen, "the shared context was copied per block"


@pytest.fixture(scope="module")
def varied_llama():
    """A tiny Llama (4 query heads, 2 key/value heads of 8) whose norms are not all ones and whose RoPE
    base is not the drafter's default: a copy that ignored them would be caught."""
    from conftest import tiny_llama

    model = tiny_llama(seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 50000.0}
    return HFTarget(model, name="tiny-llama-varied")


@pytest.mark.parametrize("width", [64, 128])
def test_init_from_target_copies_the_last_target_layers(varied_llama, width):
    from hyflash.errors import HyflashError

    target = varied_llama
    model = make(target, dtype=torch.float32, kind="hyflash", num_heads=4, head_dim=8, intermediate_size=width)
    notes = model.init_from_target()
    assert notes[0] == "drafter layers 0..1 <- target layers [2, 3]"
    layers = target.model.get_decoder().layers
    for mine, theirs in zip(model.layers, [layers[2], layers[3]]):
        attn = theirs.self_attn
        assert torch.equal(mine.q_proj.weight, attn.q_proj.weight)
        assert torch.equal(mine.o_proj.weight, attn.o_proj.weight)
        for ours, kv in ((mine.k_proj.weight, attn.k_proj.weight), (mine.v_proj.weight, attn.v_proj.weight)):
            # query head i reads key/value head i // 2, as in the target's grouped-query attention
            for head in range(4):
                assert torch.equal(ours[head * 8:(head + 1) * 8], kv[head // 2 * 8:(head // 2 + 1) * 8])
        assert torch.equal(mine.attn_norm.weight, theirs.input_layernorm.weight)
        assert torch.equal(mine.mlp_norm.weight, theirs.post_attention_layernorm.weight)
        assert torch.equal(mine.q_norm.weight, torch.ones(8)) and torch.equal(mine.k_norm.weight, torch.ones(8))
        assert torch.equal(mine.mlp.gate.weight[:64], theirs.mlp.gate_proj.weight)
        assert torch.equal(mine.mlp.up.weight[:64], theirs.mlp.up_proj.weight)
        assert torch.equal(mine.mlp.down.weight[:, :64], theirs.mlp.down_proj.weight)
        x = torch.randn(3, target.hidden_size)
        with torch.no_grad():  # extra units of a wider MLP start silent: it computes the target's MLP
            torch.testing.assert_close(mine.mlp(x), theirs.mlp(x))
    assert torch.equal(model.norm.weight, target.model.get_decoder().norm.weight)
    assert model.config.rope_theta == 50000.0
    assert any("repeated 2x" in n for n in notes)

    with pytest.raises(HyflashError, match="only 4"):
        make(target, dtype=torch.float32, num_heads=4, head_dim=8, num_layers=5).init_from_target()
    other_heads = make(target, dtype=torch.float32, num_heads=2, head_dim=16)
    before = other_heads.layers[0].q_proj.weight.clone()
    assert any("attention not copied" in n for n in other_heads.init_from_target())
    assert torch.equal(other_heads.layers[0].q_proj.weight, before)


def test_init_from_target_refuses_targets_without_llama_layers(llama_target, gemma_target):
    from hyflash.errors import HyflashError

    with pytest.raises(HyflashError, match="sandwich norms"):
        make(gemma_target, dtype=torch.float32).init_from_target()

    class Hidden:  # a target whose model is not reachable (another backend)
        name, backend = "opaque", "llama.cpp"

    model = make(llama_target, dtype=torch.float32)
    model.target = Hidden()
    with pytest.raises(HyflashError, match="get_decoder"):
        model.init_from_target()
    model.target = llama_target
    decoder = llama_target.model.get_decoder()
    mlp = decoder.layers[3].mlp
    del decoder.layers[3].mlp
    try:
        with pytest.raises(HyflashError, match="no mlp.gate_proj"):
            model.init_from_target()
    finally:
        decoder.layers[3].mlp = mlp


class _Unresumable(Drafter):
    """A drafter whose ingest state is not declared: it cannot be snapshotted."""

    block_size = 4

    def reset(self) -> None:
        pass

    def ingest(self, tokens, features) -> None:
        pass

    def draft(self, last_token, num_tokens, sampling, generator):
        raise NotImplementedError

    def memory_bytes(self) -> int:
        return 0


@pytest.mark.parametrize("kind, rule", CASES)
def test_a_restored_snapshot_drafts_and_ingests_as_the_state_it_copied(llama3_target, kind, rule):
    """Drafter.snapshot / restore (a backend keeping a prompt's passes resumes the drafter with them): a drafter
    restored to a snapshot, then fed the rest of the sequence, holds and drafts bit for bit what one fed the
    whole sequence does, every kind (window, memory, full, the copy input); the snapshot survives being restored
    from and fed past, so it can be restored again."""
    from hyflash.drafters.hybrid import HybridDrafter

    model = make(llama3_target, dtype=torch.float32, kind=kind, memory_rule=rule, copy_ngram=2)
    features, tokens = sequence(llama3_target, 90, dtype=torch.float32)
    straight, resumed = HybridDrafter(DrafterState(model)), HybridDrafter(DrafterState(model))
    straight.ingest(tokens[0, :90], features[0, :90])
    resumed.ingest(tokens[0, :50], features[0, :50])
    snapshot = resumed.snapshot()
    for _ in range(2):
        resumed.reset()
        resumed.restore(snapshot)
        resumed.ingest(tokens[0, 50:90], features[0, 50:90])
        mine, theirs = resumed.trained, straight.trained  # what ingest builds, read independently of ingest_state
        assert (mine.length, mine.start) == (theirs.length, theirs.start)
        assert same_state(mine.held_tensors(), theirs.held_tensors()) and same_state(mine.history, theirs.history)
        assert list(resumed.ngram.history) == list(straight.ngram.history)
        greedy = SamplingConfig()
        mine, theirs = (d.propose(int(tokens[0, 89]), 6, greedy, None) for d in (resumed, straight))
        assert [x.tokens.tolist() for x in mine] == [x.tokens.tolist() for x in theirs]
    assert snapshot["trained"]["length"] == 50
    assert HybridDrafter(_Unresumable()).snapshot() is None  # a part that cannot be resumed: neither can the whole
