"""Sampling is lossless: the speculative output distribution equals the target's, checked statistically."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import tiny_llama
from drafters_for_tests import RandomDrafter

from hyflash import sampling as sampling_module
from hyflash.decoding import generate
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig, argmax, logits_to_probs, verify_block
from hyflash.targets import HFTarget


def test_config_rejects_bad_values():
    for kwargs in ({"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}):
        with pytest.raises(HyflashError):
            SamplingConfig(**kwargs)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 300), ties=st.booleans(), nan=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_argmax_is_torchs_first_maximum(rows, vocab, ties, nan, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g).to(dtype)
    if ties:  # few distinct values: several maxima per row, the first one wins
        x = x.round()
    if nan:
        x[0, vocab // 2] = float("nan")
    for view in (x, x.t().contiguous().t(), x[0]):  # non-contiguous and one-dimensional inputs too
        assert torch.equal(argmax(view), view.argmax(-1))
        assert argmax(view).dtype == torch.long


def test_warping():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    assert logits_to_probs(logits, SamplingConfig()).tolist() == [1.0, 0.0, 0.0, 0.0]
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and p.sum().item() == pytest.approx(1.0)
    full = logits.softmax(-1)
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    # The smallest prefix of the sorted distribution whose mass reaches 0.7: here the top two tokens.
    assert full[0] < 0.7 <= full[:2].sum()
    torch.testing.assert_close(p, torch.cat([full[:2] / full[:2].sum(), torch.zeros(2)]))
    hot = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    torch.testing.assert_close(hot, (logits / 0.5).softmax(-1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), vocab=st.sampled_from([1, 7, 300, 5_000]), rows=st.integers(1, 3),
       scale=st.sampled_from([0.05, 1.0, 8.0]), top_p=st.sampled_from([0.05, 0.5, 0.9, 0.95, 0.999]),
       top_k=st.sampled_from([0, 3, 1_000]))
def test_top_p_without_a_full_sort_drops_what_the_sort_drops(seed, vocab, rows, scale, top_p, top_k):
    """top_p_drop (the nucleus among the largest logits, widened until it holds top_p) against the full sort, on
    flat rows (scale 0.05: a nucleus of thousands, found after widening), peaked ones, and after top-k's -inf:
    the same ids, but where the mass before an id is within rounding of top_p (the two sum in other orders; seed
    0, 5,000 ids, top-p 0.999: 0.99899995 by the sort, 0.99900019 by the log-sum-exp)."""
    from hyflash.sampling import top_p_drop, top_p_drop_reference

    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    if top_k and top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    reference = top_p_drop_reference(logits, top_p)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    before_sorted = sorted_probs.cumsum(-1) - sorted_probs
    before = before_sorted.scatter(-1, order, before_sorted)
    for first in (4, 256):
        differ = top_p_drop(logits, top_p, first=first) != reference
        assert (differ.sum(-1) <= 1).all() and ((before - top_p).abs()[differ] < 1e-5).all()


def test_top_p_widens_past_its_first_guess():
    """A flat row whose nucleus (~900 ids) is far wider than the first 4 ids looked at: found whole, as the sort
    finds it, in one row and beside a peaked row that the first 4 settle."""
    from hyflash.sampling import top_p_drop, top_p_drop_reference

    flat = torch.linspace(0.0, 0.01, 1_000)
    peaked = torch.zeros(1_000)
    peaked[3] = 20.0
    for logits in (flat[None], torch.stack([peaked, flat])):
        reference = top_p_drop_reference(logits, 0.9)
        assert (~reference[-1]).sum() > 800
        assert torch.equal(top_p_drop(logits, 0.9, first=4), reference)


def _chi_square_critical(df: int, alpha_z: float = 3.09) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty); z = 3.09 is alpha = 0.001."""
    return df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3


def _chi_square(counts: dict, expected: dict, n: int) -> tuple[float, int]:
    """Chi-square statistic with low-expectation outcomes pooled into one bin."""
    stat, pooled_obs, pooled_exp, bins = 0.0, 0, 0.0, 0
    for outcome, p in expected.items():
        e = p * n
        if e < 5:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += e
            continue
        stat += (counts.get(outcome, 0) - e) ** 2 / e
        bins += 1
    unseen = sum(c for o, c in counts.items() if o not in expected)
    pooled_obs += unseen
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    elif pooled_obs:
        stat = math.inf
    return stat, bins - 1


def _exact_sequence_probs(target: HFTarget, prompt: list[int], length: int, sampling: SamplingConfig) -> dict:
    """Probability of every continuation of `length` tokens under the warped target (small vocab)."""
    seqs = list(itertools.product(range(target.vocab_size), repeat=length))
    ids = torch.tensor([prompt + list(s) for s in seqs])
    with torch.no_grad():
        logits = target.model(input_ids=ids).logits[:, len(prompt) - 1 : -1]
    probs = logits_to_probs(logits, sampling)
    step = probs.gather(-1, ids[:, len(prompt) :, None]).squeeze(-1)
    return {s: float(p) for s, p in zip(seqs, step.prod(-1)) if p > 0}


@pytest.fixture(scope="module")
def small_vocab_target():
    return HFTarget(tiny_llama(seed=3, vocab=6, hidden=16, layers=2), name="tiny-vocab6")


def _sample_counts(target, prompt, length, sampling, runs, policy=None, events=None, drafter=None):
    """Counts of whole outputs; `events` (a Counter) collects (drafted, accepted) of every verification."""
    drafter = drafter or RandomDrafter(target.vocab_size, block_size=4, seed=7)
    counts: dict = {}
    for seed in range(runs):
        out = generate(target, prompt, drafter, max_new_tokens=length, sampling=sampling, seed=seed, policy=policy)
        key = tuple(out.tokens)
        counts[key] = counts.get(key, 0) + 1
        if events is not None:
            drafted, accepted = out.drafted_by_position, out.accepted_by_position
            for k in range(len(drafted)):
                events["slot", k + 1, "accepted" if accepted[k] else "rejected"] += accepted[k] or drafted[k]
            for k, n in out.policy.get("draft_lengths", {}).items():
                events["k", k] += n
    return counts


def _steep_curve():
    """A cost curve on which verifying 1, 2 or 3 drafts each pays only at some acceptance levels, so an
    adaptive policy that learns as it goes verifies different lengths from run to run."""
    from hyflash.costs import CostCurve

    return CostCurve("tiny", "float32", [0], [[10.0, 14.0, 15.0, 16.0, 17.0]])


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)],
    ids=["t1", "t0.7-topk-topp"],
)
@pytest.mark.parametrize("adaptive", [False, True], ids=["chain", "adaptive-k"])
def test_speculative_sampling_matches_target_distribution(small_vocab_target, sampling, adaptive):
    """Four tokens: the prefill's, then one pass verifying up to 2 drafts, so rejection at slot 2, the
    residual after an accepted draft and the bonus token after k = 2 all occur (asserted below)."""
    from collections import Counter

    from hyflash.policy import PolicyConfig, SpeculationPolicy

    prompt, length, runs = [1, 4, 2], 4, 3000
    # A slow-learning calibrator: it starts trusting the drafter (k = 2) and learns to stop (k = 0) mid-test.
    # The guard off: its wall-clock fall-backs would make how many drafts are verified (the test's power) depend
    # on machine load (a wrong rule passed once under load).
    policy = SpeculationPolicy(_steep_curve(), PolicyConfig(prior_strength=300, guard=False)) if adaptive else None
    events: Counter = Counter()
    expected = _exact_sequence_probs(small_vocab_target, prompt, length, sampling)
    counts = _sample_counts(small_vocab_target, prompt, length, sampling, runs, policy, events)
    stat, df = _chi_square(counts, expected, runs)
    assert stat < _chi_square_critical(df), f"chi2 {stat:.1f} on {df} df"
    assert events["slot", 2, "rejected"] > 50  # rejection at slot 2, after slot 1 was accepted
    if sampling.top_k == 0:  # (top-k 4 cuts most of the drafter's q: its slot-2 drafts are then rejected)
        assert events["slot", 2, "accepted"] > 20  # ... and the bonus token after k = 2
        assert events["slot", 1, "accepted"] > 50 and events["slot", 1, "rejected"] > 50
    if adaptive:  # the policy really chose: plain steps (k = 0) although drafts were there, and k = 2
        assert events["k", 0] > 50 and events["k", 2] > 50, events


@pytest.mark.parametrize("gate", [False, True], ids=["copy", "copy+gate"])
def test_sampling_with_a_copy_pointer_drafter_matches_target_distribution(small_vocab_target, gate):
    """A trained-drafter path with a copy input and a pointer out of a 3-id draft vocabulary: its reported q
    (draft vocabulary + the candidates the pointer reaches, each candidate's column raised by the gate) must
    keep the output exactly the target's."""
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel
    from hyflash.drafters.state import DrafterState

    torch.manual_seed(0)
    config = DrafterConfig.for_target(small_vocab_target, block_size=4, window=8, chunk_size=4, num_heads=2,
                                      head_dim=8, copy_ngram=2, copy_gate=gate, draft_vocab_size=3)
    model = DrafterModel(config, small_vocab_target).float()
    target = small_vocab_target
    with torch.no_grad():  # the copy input pushes each slot towards its candidate: the pointer gets real mass
        head, emb = target.head_weight().float(), target.embed(torch.arange(target.vocab_size)).float()
        model.copy_proj.weight.copy_(3 * torch.linalg.lstsq(emb, head).solution.T)
        if gate:
            model.copy_gate.bias.fill_(1.5)
    # Ids 0-2 form the draft vocabulary; the prompt repeats 4, 5, which only the pointer can draft.
    sampling, prompt, length, runs = SamplingConfig(temperature=1.0), [4, 5, 3, 4, 5], 4, 2000
    drafter = DrafterState(model)
    state = DrafterState(model)
    state.ingest(torch.tensor(prompt[:-1]), torch.randn(3, len(small_vocab_target.feature_layers),
                                                        small_vocab_target.hidden_size))
    draft = state.draft(prompt[-1], 3, sampling, torch.Generator().manual_seed(0))
    assert len(draft.vocab_ids) > 3  # the pointer reaches outside the draft vocabulary here
    expected = _exact_sequence_probs(small_vocab_target, prompt, length, sampling)
    counts = _sample_counts(small_vocab_target, prompt, length, sampling, runs, drafter=drafter)
    stat, df = _chi_square(counts, expected, runs)
    assert stat < _chi_square_critical(df), f"chi2 {stat:.1f} on {df} df"


def test_the_test_catches_a_wrong_rule(small_vocab_target, monkeypatch):
    """Accepting every draft with q > 0 (a classic bug) must fail the same check."""
    sampling = SamplingConfig(temperature=1.0)
    prompt, length, runs = [1, 4, 2], 4, 1000
    expected = _exact_sequence_probs(small_vocab_target, prompt, length, sampling)

    def accept_whenever_q_positive(target_probs, draft_tokens, draft_probs, sampling, generator):
        k = draft_tokens.shape[0]
        return k, int(sampling_module.sample(target_probs[k], generator))

    monkeypatch.setattr("hyflash.decoding.verify_block", accept_whenever_q_positive)
    counts = _sample_counts(small_vocab_target, prompt, length, sampling, runs)
    stat, df = _chi_square(counts, expected, runs)
    assert stat > _chi_square_critical(df)


def test_verify_block_single_position_distribution():
    """One draft slot, fixed p and q: the first output token must follow p exactly."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.05, 0.15, 0.3, 0.5])
    target_probs = torch.stack([p, p])
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        d = torch.multinomial(q, 1, generator=g)
        accepted, nxt = verify_block(target_probs, d, q[None], SamplingConfig(temperature=1.0), g)
        counts[int(d) if accepted else nxt] += 1
    torch.testing.assert_close(counts / n, p, atol=0.015, rtol=0)


def test_greedy_verification_reads_raw_logits_as_its_one_hot_distributions():
    """The decode loop hands greedy verification the target's raw logits (no one-hot warping): accepted
    count and next token must be those of the warped distributions, for every prefix of agreement."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(-1)
    greedy = SamplingConfig()
    for agree in range(6):
        draft = best[:5].clone()
        if agree < 5:
            draft[agree] = (draft[agree] + 1) % 50
        expected = verify_block(logits_to_probs(logits, greedy), draft, None, greedy, None)
        assert verify_block(logits, draft, None, greedy, None) == expected == (agree, int(best[agree]))


def test_the_fast_sampler_draws_the_reference_samplers_distribution_and_never_a_zero_probability_id():
    """sampling.sample (inverse CDF) against torch.multinomial (sample_reference), by chi-square on 40,000
    draws of a warped distribution with zeros in it; a sampler that is off by one id (each draw moved to the next
    id) fails the same test, which shows it has the power."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 200, generator=generator) * 2
    probs = logits_to_probs(logits, SamplingConfig(temperature=0.7, top_k=40))  # 160 ids at exactly 0
    expected = {i: float(p) for i, p in enumerate(probs[0]) if p > 0}
    n = 40_000
    rows = probs.expand(n, -1)

    def check(draws) -> bool:
        counts = dict(zip(*[t.tolist() for t in torch.unique(draws, return_counts=True)]))
        stat, df = _chi_square(counts, expected, n)
        return stat < _chi_square_critical(df)

    fast = sampling_module.sample(rows, torch.Generator().manual_seed(0))
    assert set(fast.tolist()) <= set(expected) and check(fast)
    assert check(sampling_module.sample_reference(rows, torch.Generator().manual_seed(0)))

    def off_by_one(p, gen):
        cdf = p.double().cumsum(-1)
        u = torch.rand(p.shape[0], 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
        return (torch.searchsorted(cdf, u, right=True).squeeze(-1) + 1).clamp_max(p.shape[-1] - 1)

    assert not check(off_by_one(rows, torch.Generator().manual_seed(0)))
    one_hot = torch.zeros(4, 7)
    one_hot[torch.arange(4), torch.tensor([0, 6, 3, 3])] = 1.0
    assert sampling_module.sample(one_hot, None).tolist() == [0, 6, 3, 3]
