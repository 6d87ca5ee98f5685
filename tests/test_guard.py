"""Never slower than plain decoding: the cost curve corrected online, and the guard that falls back to plain
steps when speculation stops paying. Deterministic: the loop runs on a fake clock (fake_clock.CurveClock)."""

from __future__ import annotations

import pytest
import torch
from drafters_for_tests import RandomDrafter
from fake_clock import CurveClock

from hyflash.costs import CostCurve, LiveCosts, StepTimes
from hyflash.decoding import generate
from hyflash.drafters.base import Draft
from hyflash.drafters.oracle import TargetGreedyDrafter
from hyflash.policy import AcceptanceCalibrator, Guard, PolicyConfig, SpeculationPolicy, shadow_acceptance
from hyflash.sampling import SamplingConfig


def curve(costs, plain=None, contexts=(0,), draft_ms=None) -> CostCurve:
    return CostCurve("m", "float32", list(contexts), [list(costs)], draft_ms, 0.0, {"cpu": "test"}, None,
                     None if plain is None else [plain])


# ----- the curve, corrected online ---------------------------------------------------------------------------
def test_measured_passes_correct_their_own_bucket_and_plain_steps_are_never_inferred_from_longer_passes():
    live = LiveCosts(curve([10, 12, 14, 16, 18, 20, 22, 24, 26], plain=9))
    for _ in range(20):  # 4-token passes run at twice the calibrated cost (an EMA converges to it)
        live.record(4, 0, StepTimes(draft=1, verify=32, ingest=0.5, total=34), tokens=3, proposed=True)
    assert live.pass_ms(4, 0) == pytest.approx(32) and live.pass_ms(3, 0) == pytest.approx(28)  # its bucket
    assert live.pass_ms(8, 0) == 24 and live.pass_ms(1, 0) == 10  # others stay as calibrated until measured
    assert live.plain_ms(0) == 9  # a plain step is measured, not guessed from longer passes
    assert live.loop_ms() == pytest.approx(0.5) and live.ingest_ms() == pytest.approx(0.5 / 3)
    for _ in range(20):  # plain steps (the drafter did not run) measure plain decoding, and c(1) with it
        live.record(1, 0, StepTimes(verify=13.5, total=13.5), tokens=1, proposed=None)
    assert live.plain_ms(0) == pytest.approx(13.5) and live.pass_ms(1, 0) == pytest.approx(15)
    live.reset()  # a new generation (another context): from the calibration again
    assert live.pass_ms(4, 0) == 16 and live.plain_ms(0) == 9


def test_plain_steps_are_never_read_off_one_token_passes_that_record_features():
    """On llama.cpp at 6k tokens the eval callback made each one-token pass with features ~40% dearer than a plain
    step, where the curve said 4%: a plain step estimated from those passes hid every loss from the guard."""
    live = LiveCosts(curve([10, 12], plain=9.5))
    for _ in range(20):  # the drafter is in use: its features cost 4 ms a pass more than calibrated
        live.record(1, 0, StepTimes(draft=0.5, verify=14.0, total=14.5), tokens=1, proposed=False)
    assert live.pass_ms(1, 0) == pytest.approx(14.0) and live.plain_ms(0) == 9.5
    live.features = False  # the drafter retired: one-token passes are plain passes now
    for _ in range(20):
        live.record(1, 0, StepTimes(draft=0.2, verify=11.0, total=11.2), tokens=1, proposed=False)
    assert live.plain_ms(0) == pytest.approx(11.0)


def test_a_plain_step_is_never_priced_above_a_measured_one_token_pass_with_features():
    """A calibration far off at this context (taken while the machine was busy, or extrapolated beyond its last
    context) prices a plain step at 40 ms. Before any plain step is timed, the one-token passes with features
    measured at 12 ms bound it (a plain step is that pass without the features' work); a plain step timed
    later replaces the bound, and a new generation starts from the calibration again."""
    live = LiveCosts(curve([38, 44], plain=40))
    assert live.plain_ms(0) == 40 and not live.one_token_measured()
    for _ in range(20):
        live.record(1, 0, StepTimes(draft=0.5, verify=12.0, total=12.5), tokens=1, proposed=False)
    assert live.one_token_measured() and live.plain_ms(0) == pytest.approx(12.0)
    live.features = False
    for _ in range(20):
        live.record(1, 0, StepTimes(draft=0.2, verify=9.0, total=9.2), tokens=1, proposed=False)
    assert live.plain_ms(0) == pytest.approx(9.0)
    live.reset()
    assert live.plain_ms(0) == 40 and not live.one_token_measured()
    dear = LiveCosts(curve([38, 44], plain=40))  # passes that measure dearer than calibrated bound nothing
    dear.record(1, 0, StepTimes(verify=60.0, total=60.0), tokens=1, proposed=False)
    assert dear.plain_ms(0) == 40


def test_the_drafters_own_time_is_measured_per_source_and_a_clock_that_did_not_tick_measures_nothing():
    live = LiveCosts(curve([10, 12], plain=10, draft_ms=0.5))
    assert live.draft_ms() == 0.5  # calibrated until measured
    for _ in range(20):
        live.record(2, 0, StepTimes(draft=6.0, verify=12, total=18), tokens=1, proposed=True)  # with the network
        live.record(2, 0, StepTimes(draft=0.4, verify=12, total=12.4), tokens=1, proposed=False)  # n-gram only
    assert live.draft_ms() == pytest.approx(5.6)
    frozen = LiveCosts(curve([10, 12], plain=10, draft_ms=0.5))
    frozen.record(2, 0, StepTimes(), tokens=1, proposed=True)
    assert frozen.pass_ms(2, 0) == 12 and frozen.draft_ms() == 0.5 and frozen.ingest_ms() == 0.0


# ----- the guard -----------------------------------------------------------------------------------------------
def test_the_guard_falls_back_probes_after_doubling_gaps_and_resumes_when_a_probe_pays():
    guard = Guard(PolicyConfig(guard_after=3, probe_steps=2, max_probe_gap=8, guard_margin=0.0))
    plain_ms = 10.0  # one token per 10 ms
    assert [guard.judge(1, 12.0, plain_ms) for _ in range(3)] == [False, False, True]  # judged from the 3rd step

    def idle_steps() -> int:
        n = 0
        while not guard.drafting():
            n += 1
        return n

    assert idle_steps() == 4
    assert [guard.judge(1, 11.0, plain_ms) for _ in range(2)] == [False, True]  # a probe that does not pay
    assert idle_steps() == 8
    assert [guard.judge(1, 11.0, plain_ms) for _ in range(2)] == [False, True]
    assert idle_steps() == 8  # capped at max_probe_gap
    assert [guard.judge(3, 20.0, plain_ms) for _ in range(2)] == [False, False]  # it pays: speculation is back
    assert guard.drafting() and not guard.probing
    judged = 1
    while not guard.judge(1, 30.0, plain_ms):  # slow steps again...
        judged += 1
    assert judged <= 3 and idle_steps() == 4  # ...and the next fall-back starts short
    assert guard.stats()["fallbacks"] == 4 and guard.stats()["plain_steps"] == 24


def test_a_step_that_overdraws_the_loss_budget_pauses_or_falls_back_at_once_by_what_the_window_lost():
    plain_ms = 10.0
    guard = Guard(PolicyConfig(guard_after=6))  # margin: one plain step
    assert not guard.judge(1, 14.0, plain_ms, budget_ms=7.0)  # lost 4 of 7: not judged yet
    assert guard.judge(1, 14.0, plain_ms, budget_ms=7.0) and guard.lost_ms == pytest.approx(8.0)  # 8 > 7...
    assert guard.paused and guard.stats()["fallbacks"] == 0  # ...but the window lost 7.4 ms < 10: a pause
    assert not guard.drafting(budget_ms=7.9) and guard.idle_steps == 1  # plain steps until the budget
    assert guard.drafting(budget_ms=8.0)  # covers the loss
    assert not guard.judge(4, 16.0, plain_ms, budget_ms=8.0) and guard.lost_ms == pytest.approx(-16.0)  # a gain
    assert guard.stats()["budget_pauses"] == 1
    dear = Guard(PolicyConfig(guard_after=6))
    assert not dear.judge(1, 18.0, plain_ms, budget_ms=10.0)  # lost 8 of 10
    assert dear.judge(1, 18.0, plain_ms, budget_ms=10.0) and not dear.paused  # 16 > 10, window 14.8 > 10:
    assert dear.stats()["fallbacks"] == 1 and dear.idle_left == Guard.FIRST_GAP  # a fall-back at the 2nd step

    repriced = Guard(PolicyConfig(guard_after=6))
    assert not repriced.judge(2, 30.0, 40.0) and repriced.lost_ms == pytest.approx(-50.0)  # a "gain" at 40 ms...
    repriced.reprice(0.25)  # ...until a plain step is timed at 10 ms: it lost 10
    assert repriced.lost_ms == pytest.approx(10.0) and not repriced.drafting(budget_ms=5.0)


@pytest.mark.parametrize("ingest_ms, retires", [(0.5, True), (0.1, False)])
def test_a_budget_pause_retires_the_drafter_only_where_feeding_it_idle_is_dear(ingest_ms, retires):
    """Steps where the drafter proposes nothing worth verifying still pay for it (features, ingest): 1.5 ms of a
    10 ms step. They overdraw the loss budget before the window has lost a plain step: a pause. Fed through the
    pause, the drafter would go on losing as much a step (llama.cpp at T = 0.7), so where its ingest is dear (5%
    of a step) the pause retires it; where it is cheap (1%, transformers) it stays fed for when it may pay."""
    costs = curve([10, 16], plain=10)
    policy = SpeculationPolicy(costs)
    policy.start_run(reads_features=True, max_draft=3)
    assert not policy.retire_expensive
    for step in range(30):
        policy.proposed = True  # the drafter ran and nothing it proposed was worth verifying
        policy.observe(None, 0, 0, StepTimes(draft=0.5, verify=11.0 - ingest_ms, ingest=ingest_ms, total=11.5))
        if policy.retire_expensive or policy.guard.pauses:
            break
    assert policy.guard.pauses == 1 and policy.guard.fallbacks == 0 and policy.guard.paused
    assert policy.retire_expensive is retires and policy.retired_by_guard is retires


def test_a_pass_not_timed_yet_is_costed_for_what_it_could_lose_at_the_largest_correction_measured():
    """2-token passes ran 20% slower than the curve: a 4-token pass not timed yet is planned as calibrated, but what
    it could lose (the loss budget's bound on the draft's length) is costed 20% slower too: 3 drafts fit a budget
    of 12.8 ms as calibrated (c(4) - c(1) = 12), 2 at the cautious cost (26.4 - 10 > 12.8)."""
    costs = curve([10, 16, 19, 22, 25, 28, 31, 34], plain=10)
    live = LiveCosts(costs)
    live.record(2, 0, StepTimes(draft=0.1, verify=19.2, total=19.3), tokens=1, proposed=False)
    assert live.pass_ms(4, 0) == 22 and live.pass_ms(4, 0) * live.caution(4) == pytest.approx(26.4)
    assert live.pass_ms(2, 0) * live.caution(2) == pytest.approx(19.2)  # a timed q: as timed
    sure = Draft(torch.arange(7), confidence=torch.full((7,), 0.99), source="ngram")
    policy = SpeculationPolicy(costs, PolicyConfig())
    policy.start_run(reads_features=False)
    assert len(policy.plan([sure], 0).tokens) == 3
    policy.live.record(2, 0, StepTimes(draft=0.1, verify=19.2, total=19.3), tokens=1, proposed=False)
    assert len(policy.plan([sure], 0).tokens) == 2

def test_no_step_may_verify_more_drafts_than_the_loss_budget_left_could_pay_for_if_all_were_rejected():
    """llama.cpp-like costs: a 7-token draft the planner is sure of would lose 2.4 plain steps if all were
    rejected, the budget at the start is 1.28 (64 tokens' 2%): it is cut to the 3 drafts whose pass loses at most
    the budget (c(4) - c(1) = 12 ms <= 12.8 ms); once speculation has gained, the whole draft is verified; without
    the guard nothing is cut."""
    costs = curve([10, 16, 19, 22, 25, 28, 31, 34], plain=10)
    sure = Draft(torch.arange(7), confidence=torch.full((7,), 0.99), source="ngram")
    policy = SpeculationPolicy(costs, PolicyConfig())
    policy.start_run(reads_features=False)
    assert policy.loss_budget_ms() == pytest.approx(12.8)
    assert len(policy.plan([sure], 0).tokens) == 3
    policy.guard.spent_ms = 10.0  # lost 10: 2.8 ms left: not even one draft (c(2) - c(1) = 6)
    assert policy.plan([sure], 0) is None
    policy.guard.plain_equivalent_ms = 30.0  # speculation has gained 3 plain steps so far
    assert len(policy.plan([sure], 0).tokens) == 7
    unguarded = SpeculationPolicy(costs, PolicyConfig(guard=False))
    unguarded.start_run(reads_features=False)
    assert len(unguarded.plan([sure], 0).tokens) == 7


class CheapWrongDrafter(RandomDrafter):
    """Random drafts (nearly never accepted) at no drafting cost, from a source the policy is sure of."""

    needs_features = False
    is_expensive = False

    def ingest(self, tokens, features) -> None:
        self.seen += tokens.shape[0]

    def draft(self, last_token, num_tokens, sampling, generator) -> Draft:
        d = super().draft(last_token, num_tokens, sampling, generator)
        d.source = "ngram"
        return d


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_loss_budget_bounds_what_drafts_that_never_pay_cost_whatever_the_planner_believes(
        llama_target, monkeypatch, temperature):
    """llama.cpp-like costs on 2 cores (a 2-token pass is 1.6 plain steps) and drafts the planner wrongly
    believes (acceptance 0.9 a slot, never corrected): each one verified is a loss. The rate window alone loses
    to its judgement steps and its probes; the default loss budget (2% of plain time, plus 64 tokens' worth to
    start) keeps the generation within that share (of 200 tokens plus 64), since no step verifies more drafts
    than the budget left could lose, and an unbounded one lets it lose more."""
    costs = curve([10, 16, 19, 22], plain=10)
    clock = CurveClock(monkeypatch, llama_target, costs)
    monkeypatch.setattr(AcceptanceCalibrator, "estimate", lambda self, source, conf: [0.9] * len(conf.tolist()))
    sampling = SamplingConfig(temperature=temperature)
    n = 200
    plain, plain_ms = _timed(clock, llama_target, None, None, n=n, sampling=sampling)

    def slowdown(loss_budget: float) -> float:
        drafter = CheapWrongDrafter(llama_target.vocab_size)
        policy = SpeculationPolicy(costs, PolicyConfig(loss_budget=loss_budget))
        out, ms = _timed(clock, llama_target, drafter, policy, n=n, sampling=sampling)
        if temperature == 0:
            assert out.tokens == plain.tokens
        return ms / plain_ms - 1

    default = PolicyConfig()
    budgeted, unbounded = slowdown(default.loss_budget), slowdown(float("inf"))
    bound = default.loss_budget * (n + default.loss_budget_start_tokens) / n
    assert budgeted <= bound + 1e-9
    assert unbounded > 0.05 > budgeted


def test_beyond_the_calibrated_contexts_a_plain_step_is_timed_and_the_guard_reprices_what_it_credited(
        llama_target, monkeypatch):
    """The calibration ends below the prompt's context and puts a plain step at 4 times its cost (40 ms against
    10; llama.cpp at 6k tokens on a Zen 3: 69 against 37), and drafts the planner wrongly believes (0.9 a slot)
    are never accepted. Priced at 40 ms, each 16-22 ms step that commits one token looks like a gain: the guard
    credits it and the generation runs far slower than plain. The policy times a one-token pass at its second
    step (nothing else ever does here), reprices the credit, and the loss budget holds again."""
    truth = curve([10, 16, 19, 22], plain=10)
    stale = curve([40, 44, 50, 56], plain=40, contexts=(8,))  # calibrated up to 8 tokens; the prompt has 16
    clock = CurveClock(monkeypatch, llama_target, truth)
    monkeypatch.setattr(AcceptanceCalibrator, "estimate", lambda self, source, conf: [0.9] * len(conf.tolist()))
    n = 200
    plain, plain_ms = _timed(clock, llama_target, None, None, n=n)

    def slowdown(config: PolicyConfig) -> float:
        out, ms = _timed(clock, llama_target, CheapWrongDrafter(llama_target.vocab_size),
                         SpeculationPolicy(stale, config), n=n)
        assert out.tokens == plain.tokens
        return ms / plain_ms - 1

    default = PolicyConfig()
    bound = default.loss_budget * (n + default.loss_budget_start_tokens) / n
    timed = slowdown(default)
    assert timed <= bound + 1e-9
    assert slowdown(PolicyConfig(measure_one_token_step=0)) > 0.3  # never timed: the guard credits every loss
    monkeypatch.setattr(Guard, "reprice", lambda self, ratio: None)
    assert slowdown(default) > timed + 0.01  # timed, but the credit given at the wrong price kept: twice the loss


class SlowDrafter(RandomDrafter):
    """Random drafts (nearly never accepted) from a network that takes `ms` of the fake clock per draft."""

    def __init__(self, clock: CurveClock, ms: float, vocab_size: int):
        super().__init__(vocab_size, block_size=4)
        self.clock, self.ms = clock, ms

    def draft(self, last_token, num_tokens, sampling, generator) -> Draft:
        self.clock.advance(self.ms)
        d = super().draft(last_token, num_tokens, sampling, generator)
        d.expensive, d.confidence = True, torch.full((len(d.tokens),), 0.5)
        return d


def _timed(clock, target, drafter, policy, n=200, sampling=SamplingConfig()):
    start = clock.now_ms
    out = generate(target, list(range(3, 19)), drafter, max_new_tokens=n, policy=policy, sampling=sampling)
    return out, clock.now_ms - start


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_drafter_that_costs_more_than_it_saves_stays_near_plain_speed_with_the_guard(llama_target, monkeypatch,
                                                                                         temperature):
    """A drafter kept on (--keep-drafter: the policy never retires it) whose drafts cost 1.5 plain steps: the
    policy's back-off alone leaves it drafting every 9th step (16% slower than plain); the guard falls back."""
    costs = curve([10, 11, 12, 13], plain=10)
    costs.ingest_ms = 0.5  # feeding an idle drafter costs 5% of a step: a fall-back retires it
    clock = CurveClock(monkeypatch, llama_target, costs)
    sampling = SamplingConfig(temperature=temperature)
    plain, plain_ms = _timed(clock, llama_target, None, None, sampling=sampling)
    asked = []
    score = llama_target.score
    monkeypatch.setattr(llama_target, "score", lambda block, features=True, **kw: (
        asked.append(features), score(block, features=features, **kw))[1])
    drafter = SlowDrafter(clock, 15.0, llama_target.vocab_size)
    unguarded = SpeculationPolicy(costs, PolicyConfig(retire_after=0, guard=False))
    out, unguarded_ms = _timed(clock, llama_target, drafter, unguarded, sampling=sampling)
    assert unguarded_ms > 1.12 * plain_ms
    asked.clear()
    guarded = SpeculationPolicy(costs, PolicyConfig(retire_after=0))
    out, guarded_ms = _timed(clock, llama_target, drafter, guarded, sampling=sampling)
    assert guarded_ms < 1.05 * plain_ms
    assert out.policy["retired_by_guard"] and out.policy["guard"]["fallbacks"] == 1
    retired = out.policy["expensive_drafter_retired_at_step"]
    assert retired <= 8 and not any(asked[retired:])  # idle steps ask the target for no features...
    assert drafter.seen == 16 + retired  # ...and feed the drafter nothing (prompt + one token a step)
    if temperature == 0:
        assert out.tokens == plain.tokens


def test_a_stale_curve_is_corrected_within_a_few_steps(llama_target, monkeypatch):
    """The calibration says verifying 4 tokens costs one step; on this machine each extra token costs two more.
    Even a drafter that is always right then loses (4 tokens in 7 steps' time): the corrected curve stops
    verifying long drafts after a step or two, where the calibrated one verifies them all the way."""
    stale = curve([10, 10, 10, 10], plain=10)
    clock = CurveClock(monkeypatch, llama_target, stale, slowdown=lambda q: 1 + 2 * (q - 1))
    plain, plain_ms = _timed(clock, llama_target, None, None)
    oracle = TargetGreedyDrafter(llama_target.model, block_size=4)
    out, ms = _timed(clock, llama_target, oracle, SpeculationPolicy(stale))
    assert out.tokens == plain.tokens and ms < 1.05 * plain_ms
    assert sum(v for k, v in out.policy["draft_lengths"].items() if k > 0) <= 3
    frozen_ms = _timed(clock, llama_target, oracle, SpeculationPolicy(stale, PolicyConfig(guard=False)))[1]
    monkeypatch.setattr("hyflash.costs.LiveCosts.record", lambda *a, **k: None)  # no online correction
    uncorrected_ms = _timed(clock, llama_target, oracle, SpeculationPolicy(stale, PolicyConfig(guard=False)))[1]
    assert frozen_ms < 1.05 * plain_ms < 1.5 * plain_ms < uncorrected_ms


def test_the_ceiling_is_the_best_rate_the_measured_costs_allow():
    policy = SpeculationPolicy(curve([10, 12, 14, 30]))
    # Slots accepted 80%, 60%, 40% of the passes that drafted them: k = 2 commits 2.4 tokens in 1.4 steps.
    assert policy.ceiling([0.8, 0.6, 0.4]) == pytest.approx(2.4 / 1.4)
    assert policy.ceiling([0.0]) == 1.0 and SpeculationPolicy().ceiling([0.9]) is None


def test_once_the_feature_reading_drafter_retires_passes_are_costed_without_features():
    """A curve timed with features (c(1) 12 ms where a plain step is 10) costs the n-gram lookup's passes after
    the drafter retired at what features no longer add: 2 ms less each."""
    live = LiveCosts(curve([12, 16, 20], plain=10))
    assert live.pass_ms(3, 0) == 20
    live.features = False
    assert live.pass_ms(1, 0) == 10 and live.pass_ms(3, 0) == 18
    policy = SpeculationPolicy(curve([12, 16, 20], plain=10))
    policy.start_run(reads_features=True)
    assert policy.pass_cost(3, 0) == 20
    policy.retired_at = 5
    assert policy.pass_cost(3, 0) == 18
    policy.start_run(reads_features=False)  # an n-gram lookup alone on a curve timed with features
    assert policy.pass_cost(2, 0) == 14


def test_a_sequence_leaves_the_feature_machinery_only_where_the_steps_left_pay_for_the_move():
    policy = SpeculationPolicy(CostCurve("m", "Q4_1", [0], [[9.5, 15.0]], feature_ms=0.8, plain_ms=[8.2]))
    # Each step saves 9.5 - 0.8 - 8.2 = 0.5 ms without the eval callback: 90 steps pay a 20 ms move, not 300.
    assert policy.worth_dropping_features(90, 20.0, 0) and not policy.worth_dropping_features(90, 300.0, 0)
    assert policy.worth_dropping_features(1, 0.0, 0)  # nothing to move (transformers): always


def test_where_an_idle_drafter_costs_nothing_a_fall_back_keeps_it_fed_for_the_next_probe(llama_target, monkeypatch):
    costs = curve([10, 11, 12, 13], plain=10)  # ingest 0: idling is free (transformers: 0.5% of a step)
    clock = CurveClock(monkeypatch, llama_target, costs)
    drafter = SlowDrafter(clock, 15.0, llama_target.vocab_size)
    plain, plain_ms = _timed(clock, llama_target, None, None)
    out, ms = _timed(clock, llama_target, drafter, SpeculationPolicy(costs, PolicyConfig(retire_after=0)))
    # Its probes still draft (at 1.5 plain steps a draft here; 3% on transformers fp32), hence 15%, not 5%.
    assert out.tokens == plain.tokens and ms < 1.15 * plain_ms
    assert out.policy["expensive_drafter_retired_at_step"] is None and out.policy["guard"]["fallbacks"] >= 3
    assert drafter.seen == 16 + len(out.tokens) - 1  # it saw every verified token: it can draft at any probe


def test_a_drafter_that_could_pay_only_at_implausible_acceptance_sits_out_the_generation_from_its_start(
        llama_target, monkeypatch):
    """llama.cpp-like costs on 2 cores: a 2-token pass is 1.7 plain steps and a draft 0.3 more, so the drafter
    pays only if accepted at ~0.87+ a slot: the generation starts without it (no drafting, no features), and so
    runs at plain speed. Where it can pay (flat costs, free drafting) or --keep-drafter is given, it drafts."""
    steep = curve([10, 17, 22, 26], plain=9.5, draft_ms=3.0)
    assert 0.8 < SpeculationPolicy(steep).break_even_acceptance(0, 3) < 0.9
    clock = CurveClock(monkeypatch, llama_target, steep)
    drafted = []
    drafter = SlowDrafter(clock, 3.0, llama_target.vocab_size)
    monkeypatch.setattr(drafter, "draft", lambda *a, draft=drafter.draft: (drafted.append(1), draft(*a))[1])
    plain, plain_ms = _timed(clock, llama_target, None, None, n=40)
    out, ms = _timed(clock, llama_target, drafter, SpeculationPolicy(steep), n=40)
    assert out.policy["expensive_drafter_retired_at_step"] == 0 and not drafted and ms == pytest.approx(plain_ms)
    assert out.tokens == plain.tokens
    flat = curve([10, 11, 12, 13], plain=10)
    assert SpeculationPolicy(flat).break_even_acceptance(0, 3) < 0.2
    out, _ = _timed(clock, llama_target, drafter, SpeculationPolicy(flat), n=40)
    assert drafted and out.policy["expensive_drafter_retired_at_step"] != 0
    drafted.clear()
    out, _ = _timed(clock, llama_target, drafter, SpeculationPolicy(steep, PolicyConfig.for_run(keep_drafter=True)), n=40)
    assert drafted and out.policy["expensive_drafter_retired_at_step"] is None


def test_the_drafters_measured_times_carry_into_the_next_generations_start_decision():
    """The calibration times the drafter warm; a generation's steps pay about twice that (llama.cpp on 2 cores:
    ingest 0.57 ms calibrated, ~1.0 ms a step). The next generation's start decision reads what was measured, so
    a drafter that looked worth starting on the warm times sits out once its real times are known."""
    costs = curve([10, 16, 20, 24], plain=9.5, draft_ms=0.5)
    policy = SpeculationPolicy(costs)
    policy.start_run(context=0, max_draft=3)
    assert policy.break_even_acceptance(0, 3) < 0.75 and policy.retired_at is None  # warm times: it starts
    for _ in range(8):  # the generation measures 3 ms a draft and 1.5 ms of ingest a step
        policy.live.record(2, 0, StepTimes(draft=3.0, verify=16, ingest=1.5, total=20.5), tokens=1, proposed=True)
    policy.start_run(context=0, max_draft=3)
    assert policy.break_even_acceptance(0, 3) > 0.85 and policy.retired_at == 0  # measured times: it sits out
    assert SpeculationPolicy(costs).break_even_acceptance(0, 3) < 0.75  # a new process starts from the calibration


def test_a_retired_drafters_steps_do_not_count_as_its_ingest():
    """After the drafter retires, a step's ingest is the n-gram index's alone (~0.1 ms): counted as the drafter's,
    it would make feeding the drafter look cheap, to the guard (which retires it only where that is dear) and,
    now that the drafter's times carry over, to the next generations."""
    live = LiveCosts(curve([10, 12], plain=9.5))
    for _ in range(20):
        live.record(1, 0, StepTimes(ingest=1.0, verify=10, total=11), tokens=1, proposed=False)
    live.drafter_in_use = False
    for _ in range(20):
        live.record(1, 0, StepTimes(ingest=0.1, verify=10, total=10.1), tokens=1, proposed=None)
    live.reset()
    assert live.idle_ingest_ms() == pytest.approx(1.0) and live.ingest_ms() == pytest.approx(1.0)


# ----- drafts not verified still calibrate their first slot --------------------------------------------------
def test_shadow_acceptance_is_what_the_rejection_rule_would_have_done_with_the_first_token():
    logits = torch.tensor([0.1, 2.0, -1.0, 0.5])
    assert shadow_acceptance(Draft(torch.tensor([1, 0])), logits, greedy=True) == 1.0
    assert shadow_acceptance(Draft(torch.tensor([3])), logits, greedy=True) == 0.0
    p = torch.tensor([0.1, 0.6, 0.1, 0.2])
    assert shadow_acceptance(Draft(torch.tensor([3])), p, greedy=False) == pytest.approx(0.2)  # one-hot q: p(d)
    q = torch.tensor([[0.1, 0.3, 0.1, 0.5]])
    assert shadow_acceptance(Draft(torch.tensor([3]), probs=q), p, greedy=False) == pytest.approx(0.4)  # p/q
    assert shadow_acceptance(Draft(torch.tensor([1]), probs=q), p, greedy=False) == 1.0  # min(1, 2)


class UnderconfidentOracle(TargetGreedyDrafter):
    """The target's own greedy continuation (always accepted), under a confidence whose prior (0.35 a slot) says
    a 2-token pass at 1.6 steps cannot pay: a cheap lookup that is right where its prior says it is not."""

    is_expensive = False

    def draft(self, last_token, num_tokens, sampling, generator=None) -> Draft:
        d = super().draft(last_token, num_tokens, sampling, generator)
        d.confidence, d.source = torch.full((len(d.tokens),), 0.3), "ngram"
        return d


def test_drafts_never_verified_still_teach_the_calibration_their_first_slot(llama_target, monkeypatch):
    """Without the target's row, a bin whose prior says "do not verify" is never measured, so its prior decides
    the whole generation: plain speed however good the drafts are. Calibrated from the rows every pass computes
    (first slots of the drafts not verified), it learns they pay and verifies them; the text stays plain's."""
    costs = curve([10, 16, 18, 20], plain=10)
    clock = CurveClock(monkeypatch, llama_target, costs)
    plain, plain_ms = _timed(clock, llama_target, None, None, n=60)
    drafter = UnderconfidentOracle(llama_target.model, block_size=4)
    out, ms = _timed(clock, llama_target, drafter, SpeculationPolicy(costs), n=60)
    assert out.tokens == plain.tokens and sum(v for k, v in out.policy["draft_lengths"].items() if k > 0) >= 5
    assert ms < 0.8 * plain_ms
    monkeypatch.setattr(AcceptanceCalibrator, "update_first", lambda *a: None)  # no shadow calibration
    out, ms = _timed(clock, llama_target, drafter, SpeculationPolicy(costs), n=60)
    assert set(out.policy["draft_lengths"]) == {0} and ms == pytest.approx(plain_ms, rel=0.02)
