"""The speculation policy: which draft to verify and how much of it, decided from measured costs.

The decoding loop asks three things and stays the same whatever the answers:
  wants_draft()         run the (expensive) drafter this step at all? After steps where nothing was worth
                        verifying, drafting backs off for 1, 2, 4 ... max_skip steps, then probes again
  retire_expensive      has the expensive drafter gone unverified through retire_after probes at the longest
                        back-off, or has it cost more time than it saved over a generation's first
                        ledger_after passes? Then it sits out the rest of the generation (the loop keeps its
                        cheap part, e.g. a hybrid's n-gram lookup, and stops asking the target for
                        features), and the next 1, 2, 4 ... max_rest_runs generations from their start,
                        before one tries it again
  plan(candidates, n)   among the drafts proposed (a trained drafter's, the n-gram lookup's), the draft and
                        length k in 0..len that maximise expected committed tokens per millisecond:
                            (1 + sum_{j<=k} prod_{i<=j} a_i) / c(k + 1)
                        with a_i the calibrated probability that slot i is accepted once reached, and c(q)
                        the measured cost of a q-token target pass (costs.py). k = 0 is a plain step.
  observe(draft, n, context, times)
                        the target accepted n of the k verified drafts, at this context, in these measured
                        times (costs.StepTimes): update the acceptance calibration, correct the cost curve online
                        (costs.LiveCosts), and let the guard judge
  drafting()            run the drafter at all this step? The guard: the committed tokens per ms of the
                        generation's speculative steps (every cost included: drafting, features, ingest, the
                        loop's own Python) against the rate of plain decoding at this context (calibrated, and
                        corrected by the passes measured now). When speculation stops paying, plain steps
                        follow, for 4, 8, 16 ... max_probe_gap steps between short probes, so a generation is
                        never much slower than plain decoding, whatever the calibration said. Where feeding an
                        idle drafter costs (its ingest and the target's features: llama.cpp), a fall-back also
                        retires it for the generation (a feature-reading drafter that misses features cannot
                        resume), so idle steps cost no drafting, no ingest and no features; where that is
                        negligible (transformers) it stays fed and drafts again at the next probe

Lossless by construction: the choice depends only on the drafts' *distributions* (their per-slot maximum
probability, never the probability of the token that was sampled) and on the past (acceptance so far, and
measured times), so conditioned on the choice each draft token is still distributed as its q, and the
rejection rule stays exact.

`choose_dtype` picks the target dtype with the best expected throughput from the calibrated curves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from hyflash.costs import CostCurve, LiveCosts, StepTimes
from hyflash.drafters.base import Draft
from hyflash.tree import DraftTree, build_tree


@dataclass
class PolicyConfig:
    adaptive: bool = True  # False: verify every draft in full (a fixed chain of block_size - 1)
    bins: int = 10  # confidence bins per draft source
    prior_strength: float = 4.0  # pseudo-observations behind a bin's prior (its own confidence value)
    max_skip: int = 8  # longest back-off of an expensive drafter, in steps
    # Unpaid probes at the longest back-off before an expensive drafter sits out the rest of the generation
    # (0 = never). Its ingest and the target's features cost every step even while it backs off.
    retire_after: int = 2
    # ...but only where an idle drafter costs: the target's features and the drafter's ingest on a one-token
    # step, as measured in the generation, are at least this share of a one-token pass (idle_drafter_share).
    # Measured right after a pass (AMD EPYC Zen 4, 2 cores): llama.cpp Q4_1 10-15% (0.24 ms of features, ~0.75 ms
    # of ingest on 7 ms); transformers fp32 ~2% (~1 ms of ingest on 53 ms), where retiring a drafter that pays
    # later cost more than it saved (experiments/retire-transformers/; and a guard fall-back that retired it at
    # 1.5% made code 128 1.35x where it runs 1.9x: experiments/never_slower/README.md). The calibrated, warm
    # ingest (0.3-0.4 ms) is a third of what a step pays.
    retire_min_idle_share: float = 0.04
    # Passes after which a generation's ledger is read: the time its expensive drafts were expected to save over
    # the cheap drafts (or plain steps), less their drafting time and the features and ingest every pass pays
    # while the drafter is in use. Below zero, the drafter retires (with retire_after > 0; 0 here = never).
    ledger_after: int = 24
    max_rest_runs: int = 8  # longest run of generations a retired drafter sits out before it is tried again
    # A generation starts without the expensive drafter when, on the calibrated costs, it would pay only if
    # accepted at more than this per slot (its drafting, ingest and the target's features counted against plain
    # steps). The shipped SmolLM2 drafter averages ~0.72 a slot on chat (τ 3.29 over 7-slot chains) and ~0.9 on
    # repetitive code; on llama.cpp Q4_1 with 2 cores the bar is ~0.83 and it never paid in the never-slower suite,
    # while its first steps, before the guard judged it, cost 3-6% (experiments/never_slower/). 1.0: never.
    start_retired_above: float = 0.8
    prior_acceptance: float = 0.6  # per-slot acceptance assumed by choose_dtype before anything is observed
    tree: int = 0  # draft tree node budget: 0 = a chain; -1 = the best budget up to 15 from the cost curve
    # The guard (needs a cost curve): judged after guard_after speculative steps, over a window that decays by
    # guard_decay a step; probes of probe_steps speculative steps after 4, 8 ... max_probe_gap plain ones.
    guard: bool = True
    guard_after: int = 6
    guard_decay: float = 0.85
    # ...and falls back when the window has lost more than this many plain steps' time (0: as soon as its rate is
    # below plain's). A stretch of rejected drafts inside a paying generation (a new line of code) loses little
    # where a multi-token pass costs little more than a plain step (transformers fp32: ~0.1 step per rejected
    # draft) and should not cost a fall-back; where it costs much (llama.cpp on 2 cores: 0.6+ a draft), two or
    # three rejected steps cross it.
    guard_margin: float = 1.0
    probe_steps: int = 4
    max_probe_gap: int = 64
    # The guard's loss budget, which bounds what trying costs where speculation never pays (llama.cpp on 2 cores,
    # where a rejected 2-token pass costs 1.6 plain steps): speculative steps may lose, in all, at most this share of
    # the time plain decoding takes for the tokens so far plus loss_budget_start_tokens (so the first steps may
    # try: 64 tokens' 2% is ~1.3 plain steps, one or two rejected drafts on llama.cpp, four or more on
    # transformers). A step loses its time less what its committed tokens take at plain speed; a step that gains
    # counts negative, so a drafter that has paid may try again sooner. 3% let llama.cpp prompts where nothing
    # pays lose ~5% over 96 tokens; a start of 32 tokens (2/3 of a step) paused the n-gram lookup before its
    # first draft could pay (prose 128: 1.23x -> 0.99x, 18 pauses; experiments/never_slower/, 2026-12-05).
    loss_budget: float = 0.02
    loss_budget_start_tokens: int = 64
    # The n-gram lookup and the plan run right after a target pass has flushed the CPU's caches, where they take
    # ~10x their warm time: ~0.3 ms a step on llama.cpp with 2 cores, 3% of a one-token step, paid on every step
    # where nothing is worth verifying (all of them, where a 2-token pass costs 1.8 steps). Where the lookup's
    # measured time is at least lookup_min_share of a plain step, a lookup (with no expensive drafter drafting)
    # that verified nothing backs off for 1, 2 ... max_lookup_skip steps; one verified draft resets it. On
    # transformers fp32 it is ~0.6% of a step and the lookup runs every step.
    max_lookup_skip: int = 4
    lookup_min_share: float = 0.01
    # Beyond the calibrated contexts the curve is extrapolated (a calibration that ends at 4k tokens put a plain
    # step at 6k at 69 ms, 37 measured, on a Zen 3), and where every step drafts nothing times the plain step the
    # guard measures against: then this step (0: never) verifies nothing, once, to time a one-token pass.
    measure_one_token_step: int = 1

    @classmethod
    def for_run(cls, adaptive: bool = True, tree: int = 0, keep_drafter: bool = False) -> "PolicyConfig":
        """The command-line choices (--no-adaptive, --tree, --keep-drafter) as a config."""
        return cls(adaptive=adaptive, tree=tree,
                   **({"retire_after": 0, "start_retired_above": 1.0} if keep_drafter else {}))


class AcceptanceCalibrator:
    """P(slot accepted | slot reached) per (draft source, confidence bin): Beta counts whose prior mean is the
    bin's confidence, so an unseen drafter is trusted as much as it trusts itself until evidence arrives."""

    def __init__(self, bins: int = 10, prior_strength: float = 4.0):
        self.bins, self.prior = bins, prior_strength
        self.accepted: Counter = Counter()
        self.reached: Counter = Counter()

    def _bin(self, c: float) -> int:
        return min(self.bins - 1, max(0, int(c * self.bins)))

    def estimate(self, source: str, confidence: torch.Tensor) -> list[float]:
        out = []
        for c in confidence.tolist():
            b = self._bin(c)
            mean = (b + 0.5) / self.bins
            out.append((self.accepted[source, b] + self.prior * mean) / (self.reached[source, b] + self.prior))
        return out

    def update(self, source: str, confidence: torch.Tensor, n_accepted: int) -> None:
        """Slots 0..n_accepted were reached; the first n_accepted were accepted (the next, if any, rejected)."""
        for j, c in enumerate(confidence.tolist()[: n_accepted + 1]):
            b = self._bin(c)
            self.reached[source, b] += 1
            self.accepted[source, b] += int(j < n_accepted)

    def update_first(self, source: str, confidence: float, accepted: float) -> None:
        """A first slot that was reached but not verified, accepted with probability `accepted` (`shadow_acceptance`)."""
        b = self._bin(confidence)
        self.reached[source, b] += 1
        self.accepted[source, b] += accepted


def shadow_acceptance(draft: Draft, first_row: torch.Tensor, greedy: bool) -> float:
    """The probability that the rejection rule would have accepted the draft's first token, from the target's row
    at that slot (every pass computes it: it is the distribution after the verified token, whatever was drafted).
    first_row: raw logits for greedy (accepted iff the token is their argmax), else the warped probabilities p, where
    the token d drawn from q is accepted with probability min(1, p(d) / q(d)) (q one-hot for a deterministic draft)."""
    token = int(draft.tokens[0])
    if greedy:
        return float(int(first_row.argmax()) == token)
    q = 1.0 if draft.probs is None else float(draft.probs[0, token])
    return min(1.0, float(first_row[token]) / q) if q > 0 else 0.0


def expected_committed(acceptance: list[float]) -> list[float]:
    """E[tokens committed] when verifying the first k drafts, for k = 0..len: 1 + sum of survival products."""
    out, survive = [1.0], 1.0
    for a in acceptance:
        survive *= a
        out.append(out[-1] + survive)
    return out


@dataclass
class SpeculationPolicy:
    curve: CostCurve | None = None  # None: every pass costs the same, so longer is always better
    config: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        self.calibrator = AcceptanceCalibrator(self.config.bins, self.config.prior_strength)
        self.live = LiveCosts(self.curve)
        self.guard = Guard(self.config) if self.config.guard and self.config.adaptive and self.curve else None
        self.skip = self.skip_left = self.misses_at_max = 0
        self.lookup_skip = self.lookup_skip_left = 0  # the cheap lookup's back-off (lookup_min_share)
        self.max_draft = 0  # the expensive drafter's longest draft (start_run; 0: there is none)
        self.saved_ms, self.drafted = 0.0, False
        self.retired_at: int | None = None  # verification step at which the expensive drafter retired
        self.retired_by_guard = False  # ...in a fall-back to plain steps
        self.retired_dear = False  # ...where feeding it idle was dear then (`_idle_is_dear`): later runs rest
        self.proposed: bool | None = None  # this step: None, the drafter did not run; else whether its expensive part did
        self.unverified: list[Draft] = []  # this step's drafts that were not verified (their first slot: observe)
        self.context = 0  # the context of the last step observed
        self.temperature = 0.0  # the generation's sampling temperature, to 0.1 (start_run)
        self.start_context = 0  # the prompt's length (start_run)
        self.reads_features = True  # the drafter reads the target's features (start_run says)
        self.steps = 0
        self.rest_runs = self.retired_runs = 0  # generations left to sit out; trial runs in a row that retired
        self.sources: Counter = Counter()  # steps whose verified draft came from each source
        self.lengths: Counter = Counter()  # verified draft length k -> steps

    def start_run(self, reads_features: bool = True, context: int = 0, max_draft: int = 0,
                  temperature: float = 0.0) -> None:
        """A new generation: per-run statistics restart; what was learned about acceptance is kept, per
        temperature (`_calibrated_as`).
        reads_features: the drafter reads the target's features (until its expensive part retires).
        context, max_draft: the prompt's length and the expensive drafter's longest draft (0: no expensive
        drafter), for the start decision (`start_retired_above`)."""
        self.temperature = round(temperature, 1)
        self.reads_features = reads_features
        self.context = self.start_context = context
        self.max_draft = max_draft
        self.lookup_skip = self.lookup_skip_left = 0
        self.sources.clear()
        self.lengths.clear()
        if self.steps and self.retired_at != 0:
            # The last generation tried the drafter from its start: back off over generations if it retired
            # (by back-off, ledger or the guard) where an idle drafter costs, as on llama.cpp, where a generation
            # that starts without it also runs without the eval callback. Where it costs little (transformers),
            # the next generation tries it again: in the never-slower suite a ledger that read -10 ms (noise
            # around zero) on one prompt made the next, a chat prompt where the drafter runs 2.1x, sit out (1.6x).
            retired = self.retired_at is not None and self.retired_dear
            self.retired_runs = self.retired_runs + 1 if retired else 0
            self.rest_runs = min(2 ** (self.retired_runs - 1), self.config.max_rest_runs) if self.retired_runs else 0
        self.skip = self.skip_left = self.misses_at_max = self.steps = 0
        self.retired_at, self.retired_by_guard, self.retired_dear, self.proposed = None, False, False, None
        self.live.reset()
        if self.guard:
            self.guard.reset()
        self.saved_ms, self.drafted = 0.0, False  # the ledger: expected ms saved by the expensive drafter
        if self.rest_runs:  # this generation starts without the expensive drafter
            self.rest_runs -= 1
            self.retired_at = 0
        elif max_draft and self.break_even_acceptance(context, max_draft) > self.config.start_retired_above:
            self.retired_at = 0  # it cannot pay here at any acceptance it plausibly reaches: never slower

    def break_even_acceptance(self, context: int, max_draft: int) -> float:
        """The per-slot acceptance above which the expensive drafter's best draft length (up to max_draft)
        commits tokens faster than plain steps: c(k + 1) with features, as calibrated, and its drafting and its
        ingest per committed token, as earlier generations measured them (else calibrated), against a plain step
        (0.0 without a curve or an adaptive policy; 1.0: not even at full acceptance)."""
        curve = self.curve
        if curve is None or not self.config.adaptive:
            return 0.0
        plain_rate = 1.0 / curve.plain(context)

        def pays(a: float) -> bool:
            steps = drafting_steps(curve, a, min(max_draft, curve.max_q - 1), context, self.live.draft_ms(),
                                   self.live.ingest_ms())
            return any(gain / ms > plain_rate for _, gain, ms in steps)

        if not pays(1.0):
            return 1.0
        low, high = 0.0, 1.0
        for _ in range(20):  # bisection: paying is monotone in the acceptance
            low, high = (low, (low + high) / 2) if pays((low + high) / 2) else ((low + high) / 2, high)
        return high

    @property
    def retire_expensive(self) -> bool:
        return self.retired_at is not None

    def idle_ms(self, tokens: int = 1, ingest_ms: float | None = None) -> float:
        """What keeping the drafter in use costs on a pass that commits `tokens`, drafting or not: the target's
        features and the drafter's ingest: ingest_ms, as the step measured it, else estimated per token (0 if
        unmeasured). The measured one where there is one: the ingest is mostly a fixed cost a step (~1 ms on
        transformers fp32 for 1 token or 8), so the per-token estimate charged a step that committed 8 tokens
        ~5 ms, and the ledger retired drafters that paid."""
        if self.curve is None:
            return 0.0
        return (self.curve.feature_ms or 0.0) + (self.live.ingest_ms() * tokens if ingest_ms is None else ingest_ms)

    def idle_drafter_share(self) -> float:
        """What keeping a resting drafter costs a step (the target's features and the ingest of one token, as
        measured), as a share of a one-token pass at the shortest calibrated context (0 without a curve). Not at
        the generation's context: on llama.cpp what the eval callback adds grows with the context beyond the
        calibrated feature_ms, so the short-context share is the lower bound."""
        if self.curve is None:
            return 0.0
        return self.idle_ms(ingest_ms=self.live.idle_ingest_ms()) / self.live.pass_ms(1, self.curve.contexts[0])

    def _idle_is_dear(self) -> bool:
        """Whether feeding a resting drafter costs enough of a step to retire it (`retire_min_idle_share`)."""
        return self.idle_drafter_share() >= self.config.retire_min_idle_share

    def _sync_live(self) -> None:
        """Tell the live costs what the next measured step pays for (LiveCosts.features, drafter_in_use)."""
        self.live.drafter_in_use = self.retired_at is None
        self.live.features = self.reads_features and self.live.drafter_in_use

    def pass_cost(self, q: int, context: int) -> float:
        """c(q) at this context: calibrated, corrected by the passes this generation measured."""
        return self._costs_at(context)(q)

    def _costs_at(self, context: int):
        """pass_cost at this context as a function of q, each q computed once: a plan reads the same costs a dozen
        times, which was half the Python time of a step that only looks up the n-gram on llama.cpp."""
        self._sync_live()
        memo: dict[int, float] = {}

        def cost(q: int) -> float:
            if q not in memo:
                memo[q] = self.live.pass_ms(q, context)
            return memo[q]

        return cost

    def draft_ms(self) -> float:
        """The time of one expensive draft, in pass_cost's units: measured this generation, else calibrated."""
        return self.live.draft_ms()

    def drafting(self) -> bool:
        """Whether the drafter runs at all this step (False: the guard has fallen back to plain steps, or the
        cheap lookup backs off)."""
        if self.guard is not None and not self.guard.drafting(self.loss_budget_ms()):
            return False
        if self.lookup_skip_left > 0:
            self.lookup_skip_left -= 1
            return False
        return True

    def loss_budget_ms(self) -> float:
        """What the guard lets speculative steps lose in all by now: loss_budget of the time plain steps take for
        the tokens committed so far plus loss_budget_start_tokens."""
        tokens = self.context - self.start_context + self.config.loss_budget_start_tokens
        return self.config.loss_budget * tokens * self._plain_step_ms(self.context)

    def affordable_length(self, pass_cost, limit: int) -> int:
        """The most drafts a step may verify so that, were every one rejected, speculation's loss would stay within
        the guard's budget: the pass of k + 1 tokens that commits a single token loses c(k + 1) - c(1) against a
        plain step. Without this bound one rejected 7-token draft on llama.cpp (c(8) ~4.3 steps on 2 cores) lost
        3.3 steps at once, 2.5 times the budget at the start of a generation (experiments/never_slower/replay.py).
        At most `limit` (the longest draft proposed, and all of it without the guard); pass_cost: `_costs_at(context)`;
        a longer pass not timed yet is costed cautiously (`LiveCosts.caution`)."""
        if self.guard is None:
            return limit
        left = self.loss_budget_ms() - self.guard.lost_ms
        k = 0
        while k < limit and pass_cost(k + 2) * self.live.caution(k + 2) - pass_cost(1) <= left:
            k += 1
        return k

    def wants_draft(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        return True

    def plan(self, candidates: list[Draft], context: int):
        """The draft to verify, cut to its best length (or a DraftTree, in tree mode); None (a plain step)
        when nothing pays."""
        self.proposed = any(d.expensive for d in candidates)
        self.unverified = []
        if not any(len(d.tokens) for d in candidates):
            self._lookup_back_off(verified=False)
            return None  # nothing to verify, and nothing for the drafter's back-off or the ledger to count
        if self._times_one_token_pass(context):
            self.unverified = [d for d in candidates if len(d.tokens)]
            self.lengths[0] += 1
            return None
        if self.config.tree and any(d.slot_probs is not None and len(d.tokens) for d in candidates):
            return self.plan_tree(candidates, context)
        if not self.config.adaptive:
            draft = next((d for d in candidates if len(d.tokens)), None)
            return None if draft is None else self._take(draft, len(draft.tokens))
        pass_cost = self._costs_at(context)
        best, best_k, best_rate = None, 0, 1.0 / pass_cost(1)
        expensive_rate = 0.0  # the best rate an expensive draft gives once its drafting time is counted
        longest = self.affordable_length(pass_cost, max((len(d.tokens) for d in candidates), default=0))
        gains = [self._gains(draft) for draft in candidates]
        for draft, draft_gains in zip(candidates, gains):
            for k, gain in enumerate(draft_gains[1 : longest + 1], start=1):
                cost = pass_cost(k + 1)
                if gain / cost > best_rate:
                    best, best_k, best_rate = draft, k, gain / cost
                if draft.expensive:
                    expensive_rate = max(expensive_rate, gain / (cost + self.draft_ms()))
        # The draft is made, so the best one is verified; but it paid for itself only if it beats what the cheap
        # drafts offered by more than its own drafting time (else, on a steep curve, a hybrid's drafter keeps
        # drafting where the n-gram lookup alone would have been faster).
        without = self._rate_without_expensive(candidates, gains, pass_cost)
        self._back_off(candidates, paid=expensive_rate > without)
        if best is not None and best.expensive:
            cost = pass_cost(best_k + 1)
            self._account(candidates, best_rate * cost, cost, without)
        else:
            self._account(candidates, 0.0, 0.0, without)
        self._lookup_back_off(verified=best is not None)
        self.unverified = [d for d in candidates if len(d.tokens) and d is not best]
        if best is None:
            self.lengths[0] += 1  # a plain step by choice
            return None
        return self._take(best, best_k)

    def _times_one_token_pass(self, context: int) -> bool:
        """Whether this step verifies nothing so that the guard gets a one-token pass timed: once a generation,
        at its measure_one_token_step-th step, where the context is beyond the calibrated curve (extrapolated:
        at 6k tokens on a Zen 3, a plain step read 69 ms against 37 measured) and no step has timed one yet."""
        return (self.guard is not None and self.config.measure_one_token_step > 0
                and self.steps >= self.config.measure_one_token_step and context > self.curve.contexts[-1]
                and not self.live.one_token_measured())

    def plan_tree(self, candidates: list[Draft], context: int):
        """A best-first tree from the block drafter's slot distributions with the other drafts' chains merged
        in; cut to the node count that maximises expected committed tokens per ms (or to the fixed budget).
        A node's expected value is its path probability, each slot's drafter probability rescaled by that
        slot's calibrated acceptance over its confidence (so an over-confident drafter is discounted)."""
        block = next(d for d in candidates if d.slot_probs is not None and len(d.tokens))
        chains = [d for d in candidates if d.slot_probs is None and len(d.tokens)]
        budget = self.config.tree if self.config.tree > 0 else 15
        pass_cost = self._costs_at(context)
        tree = build_tree(block.slot_probs.float().cpu(), budget, None if block.vocab_ids is None else block.vocab_ids.cpu(),
                          chains=[c.tokens.tolist() for c in chains])
        conf = block.confidence_or_default()
        estimate = self.calibrator.estimate(self._calibrated_as(block.source), conf)
        scale = [a / max(c, 1e-6) for a, c in zip(estimate, conf.tolist())]
        chain_tokens = {}
        for c in chains:  # n-gram nodes: their calibrated acceptance, per depth
            est = self.calibrator.estimate(self._calibrated_as(c.source), c.confidence_or_default())
            for depth, (tok, a) in enumerate(zip(c.tokens.tolist(), est)):
                chain_tokens[depth, tok] = max(chain_tokens.get((depth, tok), 0.0), a)
        lookup = {} if block.vocab_ids is None else {int(t): i for i, t in enumerate(block.vocab_ids.tolist())}
        value, cum = [], [0.0]
        for i, (tok, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
            j = lookup.get(tok) if lookup else tok
            p = 0.0 if j is None else float(block.slot_probs[depth - 1, j]) * scale[depth - 1]
            p = min(1.0, max(p, chain_tokens.get((depth - 1, tok), 0.0)))
            value.append(p * (1.0 if parent == -1 else value[parent]))
            cum.append(cum[-1] + value[-1])
        longest = self.affordable_length(pass_cost, len(tree))  # a tree of m nodes is a pass of m + 1 tokens
        if self.config.tree > 0:
            n = longest
        else:
            n = max(range(longest + 1), key=lambda m: (1 + cum[m]) / pass_cost(m + 1))
        self.lengths[n] += 1
        without = self._rate_without_expensive(chains, [self._gains(c) for c in chains], pass_cost)
        cost = pass_cost(n + 1)
        self._back_off(candidates, paid=n > 0 and (1 + cum[n]) / (cost + self.draft_ms()) > without)
        self._account(candidates, 1 + cum[n] if n else 0.0, cost if n else 0.0, without)
        if n == 0:
            return None
        self.sources["tree"] += 1
        return DraftTree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], source=block.source,
                         confidence=conf)

    def _gains(self, draft: Draft) -> list[float]:
        """Expected tokens committed when verifying the first k of this draft, k = 0..len (calibrated)."""
        key = self._calibrated_as(draft.source)
        return expected_committed(self.calibrator.estimate(key, draft.confidence_or_default()))

    def _rate_without_expensive(self, candidates: list[Draft], gains: list[list[float]], pass_cost) -> float:
        """Expected committed tokens per ms of the best plan that no expensive draft is part of: a plain step,
        or a cheap draft (the n-gram lookup's) cut to its best length. gains: `_gains` of each candidate;
        pass_cost: `_costs_at(context)`."""
        rates = [1.0 / pass_cost(1)]
        for draft, draft_gains in zip(candidates, gains):
            if not draft.expensive:
                rates += [g / pass_cost(k + 1) for k, g in enumerate(draft_gains[1:], start=1)]
        return max(rates)

    def _account(self, candidates: list[Draft], gain: float, cost: float, without: float) -> None:
        """The ledger, on a step the expensive drafter drafted: its plan commits `gain` tokens (expected) in a
        pass of `cost` ms, which the best plan without it would take gain / without ms to commit; its drafting
        time is spent either way (gain 0: its draft was not verified)."""
        if any(len(d.tokens) and d.expensive for d in candidates):
            self.drafted = True
            self.saved_ms += (gain / without - cost if gain else 0.0) - self.draft_ms()

    def _back_off(self, candidates: list[Draft], paid: bool) -> None:
        """Drafted at a cost: skip drafting for 1, 2, 4, ... steps (up to max_skip) while nothing it proposed
        was worth verifying; one draft that pays resets it."""
        if any(len(d.tokens) and d.expensive for d in candidates):
            at_max = self.skip == self.config.max_skip
            self.misses_at_max = 0 if paid else self.misses_at_max + int(at_max)
            self.skip = 0 if paid else min(max(1, 2 * self.skip), self.config.max_skip)
            self.skip_left = self.skip
            if (self.config.retire_after and self.misses_at_max >= self.config.retire_after
                    and self.retired_at is None and self._idle_is_dear()):
                self._retire()

    def _lookup_back_off(self, verified: bool) -> None:
        """After an adaptive plan of the cheap lookup's drafts alone (no expensive drafter in this generation, or it
        has retired): where the lookup costs at least lookup_min_share of a plain step (measured), one that verified
        nothing skips the next 1, 2 ... max_lookup_skip steps' lookups."""
        if not self.config.adaptive or (self.max_draft and self.retired_at is None):
            return  # every draft is verified (--no-adaptive), or the expensive drafter is in play: its own back-off
        lookup_ms = self.live.propose[False].value or 0.0
        if verified or lookup_ms < self.config.lookup_min_share * self._plain_step_ms(self.context):
            self.lookup_skip = 0
        else:
            self.lookup_skip = min(max(1, 2 * self.lookup_skip), self.config.max_lookup_skip)
        self.lookup_skip_left = self.lookup_skip

    def _calibrated_as(self, source: str) -> str:
        """The calibrator's key for a draft source: acceptance is learned per temperature. A token the greedy
        target accepts ~90% of the time (a long n-gram match) is accepted at T = 0.7 only as often as the target
        samples it, so what greedy generations taught made the next sampled ones verify drafts they rejected
        (the bench and the server keep one policy across generations at several temperatures)."""
        return source if self.temperature == 0 else f"{source}@T{self.temperature:g}"

    def _take(self, draft: Draft, k: int) -> Draft:
        self.sources[draft.source] += 1
        self.lengths[k] += 1
        return draft.truncated(k)

    def observe(self, draft, n_accepted: int, context: int = 0, times: StepTimes | None = None,
                first_row: torch.Tensor | None = None) -> None:
        """Update the calibration (a tree counts as its source's chain reaching depth n_accepted: a slight
        over-estimate, since a tree's alternatives make each depth likelier to be reached); with the step's
        measured times, correct the cost curve and let the guard judge the step.
        first_row: the target's row after the verified token, as the rejection rule reads it (logits for greedy,
        warped probabilities else). With it, the first slot of each draft the step did not verify is calibrated
        too, at no cost: without it, a confidence bin whose drafts never looked worth verifying was never
        measured, so its prior decided for the whole generation (the n-gram lookup at T = 0.7 on llama.cpp,
        where a 2-token pass pays only above ~0.66 a slot). It is the past only, so sampling stays exact."""
        self.steps += 1
        self.context = context
        proposed, self.proposed = self.proposed, None
        unverified, self.unverified = self.unverified, []
        if draft is not None and len(draft.tokens):
            self.calibrator.update(self._calibrated_as(draft.source), draft.confidence_or_default(), n_accepted)
        if first_row is not None:
            for d in unverified:
                self.calibrator.update_first(self._calibrated_as(d.source), float(d.confidence_or_default()[0]),
                                             shadow_acceptance(d, first_row, self.temperature == 0))
        if times is not None:
            q = 1 + (0 if draft is None else len(draft.tokens))
            self._sync_live()
            self.live.record(q, context, times, n_accepted + 1, proposed)
            if self.guard:
                self.guard.reprice(self.live.plain_scale(context))
            if self.guard and proposed is not None and times.total > 0 and self.guard.judge(
                    n_accepted + 1, times.total, self._plain_step_ms(context), self.loss_budget_ms()):
                # Idle steps must cost nothing: where keeping the drafter fed costs (its ingest and the target's
                # features), it retires for the generation, at a fall-back or a budget pause alike (fed through a
                # pause, it goes on losing what overdrew the budget: llama.cpp at T = 0.7, 2.6 ms of a 28 ms step
                # for 24 steps, trace of 2026-12-06); where that is negligible (transformers), it keeps ingesting
                # and drafts again at the next probe, where it may pay.
                if self.retired_at is None and self._idle_is_dear():
                    self._retire(by_guard=True)
        if self.drafted and self.retired_at is None:
            measured = None if times is None or times.ingest <= 0 else times.ingest
            self.saved_ms -= self.idle_ms(n_accepted + 1, measured)
            if (self.config.retire_after and self.config.ledger_after and self.steps >= self.config.ledger_after
                    and self.saved_ms < 0):
                self._retire()

    def _retire(self, by_guard: bool = False) -> None:
        """The expensive drafter sits out the rest of the generation (and, where idling it cost, the next ones)."""
        self.retired_at, self.retired_by_guard, self.retired_dear = self.steps, by_guard, self._idle_is_dear()

    def worth_dropping_features(self, steps_left: int, move_ms: float, context: int) -> bool:
        """Whether moving a sequence off the target's feature machinery (move_ms: llama.cpp copies its cache to
        the context without the eval callback) pays back over the steps left: each step there saves c(1) as
        timed with features, less what recording them added, over a plain step (calibrated)."""
        if move_ms <= 0 or self.curve is None:
            return move_ms <= 0
        saving = self.curve.cost(1, context) - (self.curve.feature_ms or 0.0) - self.curve.plain(context)
        return steps_left * saving > move_ms

    def _plain_step_ms(self, context: int) -> float:
        """A step of plain decoding here: its pass (calibrated feature-free, corrected online) and the loop."""
        return self.live.plain_ms(context) + self.live.loop_ms()

    def ceiling(self, acceptance: list[float]) -> float | None:
        """The best speed-up over plain steps this machine allows a drafter accepted as measured (acceptance[j]:
        the share of passes drafting slot j that accepted it) at the last context: max over k of expected
        committed(k) * c(1) / c(k + 1), with this generation's corrected pass costs; drafting itself free.
        None without a cost curve."""
        if self.curve is None:
            return None
        c1, best, committed = self.pass_cost(1, self.context), 1.0, 1.0
        for k, a in enumerate(acceptance[: self.curve.max_q - 1], start=1):
            committed += a
            best = max(best, committed * c1 / self.pass_cost(k + 1, self.context))
        return best

    def stats(self) -> dict:
        return {"draft_sources": dict(self.sources), "draft_lengths": {int(k): v for k, v in sorted(self.lengths.items())},
                "expensive_drafter_retired_at_step": self.retired_at,  # 0: sat out the whole generation
                "retired_by_guard": self.retired_by_guard,
                "expected_ms_saved_by_drafter": round(self.saved_ms, 2),
                "guard": None if self.guard is None else self.guard.stats()}


class Guard:
    """Never slower than plain decoding, by measurement: the committed tokens per ms of speculative steps (a
    window that decays by guard_decay a step) against the rate of a plain step at this context. Once the window
    has lost more than guard_margin plain steps' time against that rate, the drafter sits out 4, 8, 16 ...
    max_probe_gap steps, then probes for probe_steps steps; a probe that pays resumes speculation (and the next
    fall-back starts again from 4). Besides, the time speculative steps lost against plain steps in all
    (`lost_ms`) must stay within a budget that grows with each token (PolicyConfig.loss_budget). A step that
    overdraws it is a fall-back at once if the window has lost more than the margin; otherwise a pause until the
    budget covers the loss again: a throttle, not a verdict on the drafter (`paused`), so it does not double the
    gap, and retires the drafter only where feeding it idle is dear (on transformers at T = 0.7, a few early
    rejections that overdraw the starting budget made the drafter sit out that generation and the next ones)."""

    FIRST_GAP = 4

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.tokens = self.ms = 0.0  # decayed sums over speculative steps since speculation (re)started
        self.steps = 0  # speculative steps since then
        self.gap = 0  # the last fall-back's length, in plain steps (0: none yet)
        self.idle_left = 0
        self.probing = False
        self.fallbacks = self.idle_steps = self.pauses = 0
        # What speculative steps took and what their tokens take at plain speed, this generation: lost_ms;
        # priced at plain_scale, the live correction of plain steps (LiveCosts.plain_scale)
        self.spent_ms = self.plain_equivalent_ms = 0.0
        self.plain_scale = 1.0
        self.paused = False  # the last fall-back was the budget's pause alone (the window did not judge it)

    @property
    def lost_ms(self) -> float:
        """What speculative steps lost against plain steps this generation (gains negative)."""
        return self.spent_ms - self.plain_equivalent_ms

    def reprice(self, plain_scale: float) -> None:
        """The live correction of plain steps is now `plain_scale` (a plain pass measured at last): what the steps
        so far saved or lost is priced at it, so gains credited at a wrong price are not kept."""
        self.plain_equivalent_ms *= plain_scale / self.plain_scale
        self.plain_scale = plain_scale

    def drafting(self, budget_ms: float = float("inf")) -> bool:
        """Whether this step may speculate; budget_ms: the loss budget now (`SpeculationPolicy.loss_budget_ms`)."""
        if self.idle_left > 0:
            self.idle_left -= 1
            self.idle_steps += 1
            if self.idle_left == 0:
                self.probing, self.tokens, self.ms, self.steps = True, 0.0, 0.0, 0
            return False
        if self.lost_ms > budget_ms:  # the gap is over, but the budget does not cover the loss yet
            self.idle_steps += 1
            return False
        return True

    def judge(self, committed: int, step_ms: float, plain_step_ms: float, budget_ms: float = float("inf")) -> bool:
        """A speculative step committed `committed` tokens in step_ms. True when it falls back now."""
        decay = self.config.guard_decay
        self.tokens, self.ms, self.steps = self.tokens * decay + committed, self.ms * decay + step_ms, self.steps + 1
        self.spent_ms += step_ms
        self.plain_equivalent_ms += committed * plain_step_ms
        judged = self.steps >= (self.config.probe_steps if self.probing else self.config.guard_after)
        window_lost = self.ms - self.tokens * plain_step_ms > self.config.guard_margin * plain_step_ms
        overdrawn = self.lost_ms > budget_ms
        # Overdrawn while the window has lost little (small losses, long ago, or in a run that has paid): a pause,
        # until the budget covers the loss (drafting() checks it). Overdrawn by a window that has lost more than
        # the margin: that is a verdict, at once, whatever the step count.
        self.paused = overdrawn and not window_lost
        if self.paused:
            self.pauses += 1
            return True
        if not (window_lost and (judged or overdrawn)):
            if judged and self.probing:  # the probe paid: speculation is back, and a later fall-back starts short
                self.probing, self.gap = False, 0
            return False
        self.gap = min(2 * self.gap if self.gap else self.FIRST_GAP, self.config.max_probe_gap)
        self.idle_left, self.probing, self.fallbacks = self.gap, False, self.fallbacks + 1
        return True

    def stats(self) -> dict:
        return {"fallbacks": self.fallbacks, "budget_pauses": self.pauses, "plain_steps": self.idle_steps,
                "lost_ms": round(self.lost_ms, 2)}


def expected_rate(curve: CostCurve, acceptance: float, block: int, with_drafter: bool, context: int = 256) -> tuple[float, int]:
    """(tokens per second, best k) expected on this curve for a drafter accepted at `acceptance` per slot."""
    if not with_drafter:
        return 1000.0 / curve.cost(1, context), 0
    best = (1000.0 / (curve.cost(1, context) + (curve.draft_ms or 0.0)), 0)
    for k, gain, ms in drafting_steps(curve, acceptance, block - 1, context):
        best = max(best, (1000.0 * gain / ms, k))
    return best


def drafting_steps(curve: CostCurve, acceptance: float, max_draft: int, context: int, draft_ms: float | None = None,
                   ingest_ms: float | None = None):
    """(k, expected committed tokens, ms of the step) for verifying k = 1..max_draft drafts accepted at
    `acceptance` a slot, on the calibrated curve: the k + 1-token pass, one draft, and the ingest of what it
    commits (draft_ms, ingest_ms: as measured; default: as calibrated)."""
    draft_ms = (curve.draft_ms or 0.0) if draft_ms is None else draft_ms
    ingest_ms = (curve.ingest_ms or 0.0) if ingest_ms is None else ingest_ms
    gains = expected_committed([acceptance] * max_draft)
    for k in range(1, max_draft + 1):
        yield k, gains[k], curve.cost(k + 1, context) + draft_ms + ingest_ms * gains[k]


def choose_dtype(curves: dict[str, CostCurve], with_drafter: bool, block: int = 8,
                 acceptance: float = PolicyConfig.prior_acceptance) -> tuple[str, str]:
    """(dtype, why): the dtype with the best expected decoding throughput on this machine."""
    rates = {d: expected_rate(c, acceptance, block, with_drafter) for d, c in curves.items()}
    best = max(rates, key=lambda d: rates[d][0])
    cpu = next(iter(curves.values())).machine.get("cpu", "this CPU")
    parts = ", ".join(f"{d} {r:.1f} tok/s" + (f" (k={k})" if with_drafter else "") for d, (r, k) in rates.items())
    what = f"speculative at {acceptance:.0%} per-slot acceptance" if with_drafter else "plain decoding"
    return best, f"expected {what} on {cpu}: {parts}"
