"""The copy input and pointer (hyflash.drafters.copy): the batched suffix match equals the plain one, training's
pass equals the one-anchor oracle and the inference state, a drafter gaining a copy input drafts as before,
the pointer can propose a token outside the draft vocabulary, and decoding with it stays lossless."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyflash.decoding import generate
from hyflash.drafters import reference
from hyflash.drafters.copy import batched_copy_candidates, copy_candidates, copy_labels, suffix_match
from hyflash.drafters.state import DrafterState, pointer_vocabulary
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from test_drafter_model import _ingest_in_pieces, _with_copy_weights, llama3_target, make, sequence  # noqa: F401


def _repetitive(T, vocab, seed):
    """Token ids from a small alphabet with copied stretches, so matches of every length occur."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (T,), generator=g)
    for _ in range(T // 8):
        src, dst, n = (int(x) for x in torch.randint(0, T - 6, (3,), generator=g))
        n = 2 + n % 5
        seq[dst : dst + n] = seq[src : src + n].clone()
    return seq


def test_suffix_match_by_hand():
    seq = torch.tensor([5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3])
    assert suffix_match(seq, 3) == (8, 3)  # the most recent earlier [1, 2, 3] is at 5..7, continued by 7
    assert suffix_match(seq, 1) == (8, 1)
    assert suffix_match(torch.tensor([4, 5, 6]), 3) == (-1, 0)
    candidates, n = copy_candidates(seq, 5, 3)
    assert n == 3 and candidates.tolist() == [7, 1, 2, 3, -1]  # runs out at the last known token


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 6), max_size=60), last=st.integers(0, 6), max_ngram=st.integers(1, 6),
       min_ngram=st.integers(1, 6), slots=st.integers(1, 7), pieces=st.integers(1, 9))
def test_the_incremental_history_matches_as_the_plain_suffix_match(tokens, last, max_ngram, min_ngram, slots, pieces):
    """TokenHistory (the decode loop's n-gram lookup and copy input, grown piece by piece) against suffix_match
    and copy_candidates over the whole sequence: the same match, the same candidates, the same n-gram draft."""
    from hyflash.drafters.copy import TokenHistory
    from hyflash.drafters.ngram import NgramDrafter

    min_ngram = min(min_ngram, max_ngram)
    history = TokenHistory()
    ngram = NgramDrafter(block_size=slots + 1, max_ngram=max_ngram, min_ngram=min_ngram)
    for i in range(0, len(tokens), pieces):
        history.extend(tokens[i : i + pieces])
        ngram.ingest(torch.tensor(tokens[i : i + pieces], dtype=torch.long))
        if i % (2 * pieces) == 0:  # reads between extends (extend queues; a read copies the queue in)
            assert history.match(last, max_ngram, min_ngram) == suffix_match(
                torch.tensor(tokens[: i + pieces] + [last]), max_ngram, min_ngram)
    seq = torch.tensor(tokens + [last])
    start, n = suffix_match(seq, max_ngram, min_ngram)
    assert history.match(last, max_ngram, min_ngram) == (start, n)
    want, want_n = copy_candidates(seq, slots, max_ngram)
    got, got_n = history.copy_candidates(last, slots, max_ngram)
    assert got_n == want_n and torch.equal(got, want)
    draft = ngram.draft(last, slots, SamplingConfig())
    assert draft.tokens.tolist() == (seq[start : start + slots].tolist() if n else [])
    assert ngram.history.tolist() == tokens


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), vocab=st.integers(2, 9), max_ngram=st.integers(1, 16), slots=st.integers(1, 7))
def test_batched_candidates_equal_the_plain_match(seed, vocab, max_ngram, slots):
    T = 40
    tokens = torch.stack([_repetitive(T, vocab, seed), _repetitive(T, vocab, seed + 1)])
    anchors = torch.stack([torch.arange(0, T, 3)[:12], torch.arange(T - 1, 0, -3)[:12]])
    candidates, lengths = batched_copy_candidates(tokens, anchors, slots, max_ngram)
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            expected, n = copy_candidates(tokens[b, : a + 1], slots, max_ngram)
            assert (candidates[b, j].tolist(), int(lengths[b, j])) == (expected.tolist(), n), (b, a)


def test_copy_labels_point_only_at_outside_labels_the_candidate_names():
    labels = torch.tensor([[7, 8, 9, -1]])  # target ids
    draft = torch.tensor([[2, -1, -1, -1]])  # 7 is in the draft vocabulary, 8 and 9 are not
    candidates = torch.tensor([[7, 8, 4, -1]])
    assert copy_labels(draft, labels, candidates, 10).tolist() == [[2, 10, -1, -1]]


@pytest.mark.parametrize("kind,rule", [("hyflash", "gated_delta"), ("local", "gated_delta"), ("full", "delta")])
def test_train_forward_with_copy_equals_one_anchor_reference(llama3_target, kind, rule):
    model = _with_copy_weights(make(llama3_target, kind=kind, memory_rule=rule, copy_ngram=3))
    features, _ = sequence(llama3_target, 48)
    tokens = _repetitive(48, 6, seed=4)[None]
    anchors = torch.tensor([[1, 3, 4, 8, 11, 12, 20, 29, 40, 43, 46]])
    hidden = model.train_forward(features, tokens, anchors)
    without = make(llama3_target, kind=kind, memory_rule=rule).train_forward(features, tokens, anchors)
    assert not torch.allclose(hidden, without)  # the copy input is really there
    for j, a in enumerate(anchors[0].tolist()):
        torch.testing.assert_close(hidden[0, j], reference.anchor_forward(model, features[0], tokens[0], a),
                                   atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_inference_state_with_copy_and_pointer_equals_train_forward(llama3_target, fast):
    model = _with_copy_weights(make(llama3_target, dtype=torch.float32, copy_ngram=2, draft_vocab_size=30))
    model.set_draft_vocab(torch.arange(30))  # ids 30.. are outside: the pointer reaches them
    with torch.no_grad():  # a copy input that says "this token" loudly, so that the pointer wins some slots
        head, emb = llama3_target.head_weight().float(), llama3_target.embed(torch.arange(llama3_target.vocab_size))
        model.copy_proj.weight.copy_(10 * torch.linalg.lstsq(emb.float(), head).solution.T)  # emb(c) -> head(c)
    features, _ = sequence(llama3_target, 64, dtype=torch.float32)
    tokens = _repetitive(64, 60, seed=2)[None]
    g = torch.Generator().manual_seed(1)
    anchors = torch.tensor([[2, 9, 17, 30, 41, 50, 58, 62]])
    copy = model.copy_inputs(tokens, anchors)
    logits = model.block_logits(model.train_forward(features, tokens, anchors, copy), copy[0])  # [1, A, S-1, 31]
    assert torch.isfinite(logits[..., -1]).any()  # some slots point outside the vocabulary
    pointed = 0
    for j, a in enumerate(anchors[0].tolist()):
        state = DrafterState(model, fast=fast)
        _ingest_in_pieces(state, features[0], tokens[0], a, g)
        last = int(tokens[0, a])
        with torch.inference_mode():
            inferred = model.block_logits(state.block_hidden(last, state.copy_candidates(last)), copy[0][0, j])
        torch.testing.assert_close(inferred, logits[0, j], atol=2e-4, rtol=2e-4)
        draft = state.draft(last, 4, SamplingConfig(), None)
        best = logits[0, j, :4].argmax(-1)
        expected = torch.where(best == 30, copy[0][0, j, :4], best)  # the pointer column names the candidate
        assert draft.tokens.tolist() == expected.tolist()
        pointed += int((best == 30).sum())
        # The tree's view: one distribution per slot over the draft vocabulary plus the reachable candidates.
        assert draft.slot_probs.shape == (4, len(draft.vocab_ids))
        torch.testing.assert_close(draft.slot_probs.sum(-1), torch.ones(4))
    assert pointed > 0  # the pointer won some slots


def test_pointer_vocabulary_gives_each_outside_candidate_a_column():
    logits = torch.tensor([[0.0, 1.0, 3.0], [0.0, 1.0, float("-inf")], [2.0, 0.0, 5.0]])  # Vd = 2, pointer last
    wide, vocab = pointer_vocabulary(logits, torch.tensor([9, 4, 7]), torch.tensor([10, 11]))
    assert vocab.tolist() == [10, 11, 7, 9]
    assert wide[0].tolist() == [0.0, 1.0, float("-inf"), 3.0]
    assert wide[1].tolist() == [0.0, 1.0, float("-inf"), float("-inf")]
    assert wide[2].tolist() == [2.0, 0.0, 5.0, float("-inf")]


def test_copy_gate_adds_its_bonus_to_each_candidates_column(llama_target):
    """block_logits with a gate, checked slot by slot: the candidate's own column (inside the draft vocabulary)
    or the pointer (outside it) gains copy_gate(hidden); every other column is the plain head's logit."""
    model = _with_copy_weights(make(llama_target, dtype=torch.float32, copy_ngram=3, copy_gate=True,
                                    draft_vocab_size=30), scale=1.0)
    hidden = torch.randn(2, 5, llama_target.hidden_size)
    candidates = torch.tensor([[3, 45, -1, 29, 30], [0, 0, 70, -1, 12]])  # ids 30.. are outside
    with torch.no_grad():
        logits = model.block_logits(hidden, candidates)
    head = llama_target.head_weight().float()
    for i in range(2):
        for k in range(5):
            h, c = hidden[i, k], int(candidates[i, k])
            expected = torch.cat([head[:30] @ h, torch.tensor([float("-inf")])])
            if c >= 30:
                expected[30] = head[c] @ h
            if c >= 0:
                expected[min(c, 30)] += model.copy_gate(h).item()
            torch.testing.assert_close(logits[i, k], expected)


@pytest.mark.parametrize("gate", [False, True], ids=["copy", "copy+gate"])
def test_a_drafter_given_a_copy_input_drafts_as_before(llama_target, tmp_path, gate):
    from hyflash.training.train import with_copy_input

    model = make(llama_target, dtype=torch.float32, draft_vocab_size=40)
    grown = with_copy_input(model, 3, gate)
    assert grown.config.copy_ngram == 3 and grown.config.has_pointer and grown.config.copy_gate == gate
    features, _ = sequence(llama_target, 40, dtype=torch.float32)
    tokens = _repetitive(40, 50, seed=3)[None]
    anchors = torch.tensor([[5, 20, 33]])
    copy = grown.copy_inputs(tokens, anchors)
    before = model.logits(model.train_forward(features, tokens, anchors))
    after = grown.block_logits(grown.train_forward(features, tokens, anchors, copy), copy[0])
    torch.testing.assert_close(after[..., :-1], before)
    # Saved and loaded, it keeps its copy input.
    from hyflash.drafters.model import DrafterModel

    path = _with_copy_weights(grown).save_pretrained(tmp_path / "copy")
    loaded = DrafterModel.from_pretrained(path, llama_target, dtype=torch.float32)
    torch.testing.assert_close(loaded.train_forward(features, tokens, anchors),
                               grown.train_forward(features, tokens, anchors))
    torch.testing.assert_close(loaded.block_logits(loaded.train_forward(features, tokens, anchors, copy), copy[0]),
                               grown.block_logits(grown.train_forward(features, tokens, anchors, copy), copy[0]))


def test_a_copy_input_grown_to_longer_matches_reads_them_as_its_longest(llama_target):
    """with_copy_input(D, 5) on a D with copy_ngram 2: with the new (longer-match) candidates, it computes what D
    computes when told those matches are 2 long; matches of 1-2 tokens, where the candidates are the same,
    therefore draft exactly as before."""
    from hyflash.training.train import with_copy_input

    model = _with_copy_weights(make(llama_target, dtype=torch.float32, copy_ngram=2, copy_gate=True,
                                    draft_vocab_size=40))
    grown = with_copy_input(model, 5, True)
    features, _ = sequence(llama_target, 60, dtype=torch.float32)
    tokens = _repetitive(60, 12, seed=4)[None]
    anchors = torch.arange(4, 52, 3)[None]
    candidates, lengths = grown.copy_inputs(tokens, anchors)
    assert (lengths > 2).any() and (lengths <= 2).any()
    as_grown = grown.block_logits(grown.train_forward(features, tokens, anchors, (candidates, lengths)), candidates)
    told = (candidates, lengths.clamp(max=2))
    torch.testing.assert_close(as_grown, model.block_logits(model.train_forward(features, tokens, anchors, told),
                                                            candidates))
    short = lengths <= 2
    before = model.copy_inputs(tokens, anchors)[0]
    torch.testing.assert_close(candidates[short], before[short])


def test_copy_input_refuses_objectives_that_cannot_train_the_pointer():
    from hyflash.training.config import TrainConfig

    with pytest.raises(HyflashError, match="--copy-ngram"):
        TrainConfig(data=["d"], copy_ngram=3, loss="kl")
    with pytest.raises(HyflashError, match="--copy-ngram"):
        TrainConfig(data=["d"], copy_ngram=3, onpolicy_weight=0.5)
    with pytest.raises(HyflashError, match="--copy-gate"):
        TrainConfig(data=["d"], copy_gate=True, init="d", loss="kl")


@pytest.mark.parametrize("gate", [False, True], ids=["copy", "copy+gate"])
def test_greedy_decoding_with_a_copy_drafter_equals_plain(llama_target, gate):
    """(The sampled distribution with a pointer drafter is checked in test_sampling.py.)"""
    model = _with_copy_weights(make(llama_target, dtype=torch.float32, copy_ngram=3, copy_gate=gate,
                                    draft_vocab_size=40, window=16), scale=2.0)
    prompt = _repetitive(30, 90, seed=5).tolist()
    plain = generate(llama_target, prompt, None, max_new_tokens=40)
    spec = generate(llama_target, prompt, DrafterState(model), max_new_tokens=40)
    assert spec.tokens == plain.tokens


def test_training_grows_a_copy_input_on_an_init_drafter_and_learns_to_copy(llama_target, tmp_path):
    """`hyflash train --init D --copy-ngram 3`: D gains a copy input, training moves its weights, and on data
    made of repeats the trained drafter drafts copies outside its draft vocabulary, which D never could."""
    import json

    from hyflash.drafters.registry import load_drafter
    from hyflash.training.config import TrainConfig
    from hyflash.training.data import write_dataset
    from hyflash.training.train import train

    # Sequences that repeat their first half: the second half is a copy, mostly of ids outside the vocabulary.
    g = torch.Generator().manual_seed(0)
    halves = torch.randint(0, llama_target.vocab_size, (16, 16), generator=g)
    seqs = torch.cat([halves, halves], 1).tolist()
    write_dataset(tmp_path / "d", seqs, [17] * 16, llama_target.signature(), name="repeats")
    base = make(llama_target, dtype=torch.float32, draft_vocab_size=8, block_size=4, window=8, chunk_size=4)
    base.save_pretrained(tmp_path / "base")
    settings = dict(data=[str(tmp_path / "d")], init=str(tmp_path / "base"), copy_ngram=3, steps=40, batch_size=4,
                    anchors=8, block_size=4, max_length=64, lr=3e-2, warmup_steps=2, save_every=40, log_every=10,
                    autocast=False, save_dtype="float32", plot=False, eval_prompts=0)
    drafter_dir = train(TrainConfig(out=str(tmp_path / "run"), **settings), progress=False, target=llama_target)
    trained = load_drafter(drafter_dir, llama_target)
    assert trained.model.config.copy_ngram == 3
    records = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert records[-1]["acc_by_slot"][0] > 0.8  # slot 1 copies (the base drafter's vocabulary has 8 of 97 ids)
    seq = torch.tensor(seqs[0])
    trained.ingest(seq[:20], torch.zeros(20, len(llama_target.feature_layers), llama_target.hidden_size))
    draft = trained.draft(int(seq[20]), 3, SamplingConfig(), None)
    assert draft.tokens.tolist()[:1] == seq[21:22].tolist()


def test_copy_gate_grows_on_a_copy_drafter_and_trains(llama_target, tmp_path):
    """`hyflash train --init D --copy-gate`: D (with a copy input) gains the gate at zero and training moves it;
    a D without a copy input is refused with the flag that fixes it."""
    from hyflash.drafters.model import DrafterModel
    from hyflash.training.config import TrainConfig
    from hyflash.training.data import write_dataset
    from hyflash.training.train import train

    g = torch.Generator().manual_seed(1)
    halves = torch.randint(0, llama_target.vocab_size, (8, 16), generator=g)
    write_dataset(tmp_path / "d", torch.cat([halves, halves], 1).tolist(), [17] * 8, llama_target.signature(),
                  name="repeats")
    small = dict(dtype=torch.float32, draft_vocab_size=8, block_size=4, window=8, chunk_size=4)
    make(llama_target, copy_ngram=3, **small).save_pretrained(tmp_path / "copy")
    make(llama_target, **small).save_pretrained(tmp_path / "plain")
    settings = dict(data=[str(tmp_path / "d")], copy_gate=True, steps=6, batch_size=4, anchors=8, block_size=4,
                    max_length=64, lr=3e-2, warmup_steps=1, save_every=6, log_every=3, autocast=False,
                    save_dtype="float32", plot=False, eval_prompts=0)
    with pytest.raises(HyflashError, match="--copy-ngram"):
        train(TrainConfig(out=str(tmp_path / "bad"), init=str(tmp_path / "plain"), **settings), progress=False,
              target=llama_target)
    with pytest.raises(HyflashError, match="grow but not shrink"):
        train(TrainConfig(out=str(tmp_path / "bad2"), init=str(tmp_path / "copy"), **{**settings, "copy_ngram": 2}),
              progress=False, target=llama_target)
    out = train(TrainConfig(out=str(tmp_path / "run"), init=str(tmp_path / "copy"), **settings), progress=False,
                target=llama_target)
    trained = DrafterModel.from_pretrained(out, llama_target, dtype=torch.float32)
    assert trained.config.copy_gate and trained.config.copy_ngram == 3
    assert trained.copy_gate.weight.abs().sum() > 0 and trained.copy_gate.bias.abs() > 0


def test_the_lookup_prior_read_from_its_table_equals_the_plain_definition():
    from hyflash.drafters.ngram import ACCEPTANCE_PRIOR, NgramDrafter, confidence_reference

    for n in range(1, len(ACCEPTANCE_PRIOR) + 3):
        for length in range(0, 40):
            assert torch.equal(NgramDrafter.confidence(n, length), confidence_reference(n, length)), (n, length)
