"""What the speculation policy reads: a machine's measured cost curve for one (model, dtype), and the same
curve corrected online by what the generation running now measures.

`calibration.py` measures and caches curves; `policy.py` turns them into decisions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def _interpolate(xs: list[int], ys: list[float], x: float) -> float:
    """Linear between measured points; beyond the last, along the last segment's slope (a pass reads the whole
    cache, so its cost keeps growing with context), never below the last measured value."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0] if x <= xs[0] else ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


@dataclass
class CostCurve:
    """Measured costs of one (model, dtype) on one machine, in milliseconds."""

    model: str
    dtype: str
    contexts: list[int]
    pass_ms: list[list[float]]  # pass_ms[i][q - 1]: one cached pass over q tokens at contexts[i]
    draft_ms: float | None = None  # one drafter block (all slots), None without a drafter
    ingest_ms: float | None = None  # drafter ingest of one verified token
    machine: dict = field(default_factory=dict)
    # What recording features adds to a one-token pass (llama.cpp: its eval callback splits the graph and
    # copies the layers out), paid on every pass while a drafter that reads features is in use.
    feature_ms: float | None = None
    # plain_ms[i]: one step of plain decoding at contexts[i], as `--drafter none` runs it (no features asked
    # for; on llama.cpp, a context without the eval callback). What the guard must beat. None: pass_ms[i][0].
    plain_ms: list[float] | None = None
    # max |logit difference| between one 8-token pass and 8 one-token passes over the same tokens (calibration's
    # measure_exactness): 0.0 = bit-identical, so speculative greedy text equals plain decoding's exactly.
    exactness: float | None = None

    @property
    def max_q(self) -> int:
        return len(self.pass_ms[0])

    def cost(self, q: int, context: int) -> float:
        """c(q) at this context length: linear between measured contexts, extrapolated beyond them."""
        q = min(max(q, 1), self.max_q)
        return _interpolate(self.contexts, [row[q - 1] for row in self.pass_ms], context)

    def plain(self, context: int) -> float:
        """One plain decoding step at this context length (see plain_ms)."""
        return _interpolate(self.contexts, self.plain_ms, context) if self.plain_ms else self.cost(1, context)

    def score_ms(self, q: int, context: int, features: bool = True) -> float:
        """What one target.score of q tokens costs at this context: a one-token pass without features is a plain
        step, anything else c(q). The rule fake clocks charge by (tests, the offline replay)."""
        return self.plain(context) if q == 1 and not features else self.cost(q, context)

    def relative(self, context: int) -> list[float]:
        """c(q) / c(1) for q = 1..max_q: how many plain steps a q-token verification costs."""
        base = self.cost(1, context)
        return [self.cost(q, context) / base for q in range(1, self.max_q + 1)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurve":
        return cls(**data)


@dataclass
class StepTimes:
    """What one decoding step took, in ms, as the loop measured it (the policy reads nothing else of time)."""

    draft: float = 0.0  # proposing drafts and planning
    verify: float = 0.0  # the target pass and the rejection rule
    ingest: float = 0.0  # the drafter's ingest of the verified tokens
    total: float = 0.0  # the whole step, the loop's bookkeeping included


# q buckets the online correction keeps a factor for: 1 | 2 | 3-4 | 5-8 | 9+ (c(q) bends differently at
# different q: the matrix kernels change shape, so one factor for all would misplace the best k).
_BUCKET_EDGES = (1, 2, 4, 8)


def _bucket(q: int) -> int:
    return next((i for i, edge in enumerate(_BUCKET_EDGES) if q <= edge), len(_BUCKET_EDGES))


class Ema:
    """An exponential moving average; None until the first value."""

    def __init__(self, alpha: float):
        self.alpha, self.value = alpha, None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


class LiveCosts:
    """The cost curve as this generation finds it. The calibration may be stale (another job now shares the CPU),
    or measured at other contexts than the one the generation is at: every measured pass corrects the curve by
    the EMA of measured / predicted, per q bucket (see _factor for one not measured yet). Also measured here: the per-step costs the curve
    cannot know (the drafter's propose and ingest, the loop's own Python) and plain steps.

    Without a curve (None) every pass costs 1 and nothing is corrected: the flat curve of a fixed policy."""

    def __init__(self, curve: CostCurve | None, alpha: float = 0.25):
        self.curve, self.alpha = curve, alpha
        # Whether passes record features now. A curve timed with features (for a drafter that reads them) costs
        # a pass without them (its drafter retired: the n-gram lookup drafts on, on llama.cpp in the context
        # without the eval callback) c(q) less what features added to c(1) over a plain step.
        self.features = True
        # Whether the expensive drafter is in use (not retired): only then is a step's ingest the drafter's (after
        # it retires, what is left is the n-gram index's, ~0.1 ms, which would make a later generation think
        # that feeding the drafter is cheap).
        self.drafter_in_use = True
        # The drafter's own times: they do not depend on the context, and the calibration times them warm, where
        # a generation's steps, right after a pass has flushed the caches, pay about twice as much (llama.cpp on
        # 2 cores: ingest 0.57 ms calibrated, ~1.0 ms a step). So they are kept across generations (reset() leaves
        # them), and a generation's start decision and first plans use what the earlier ones measured.
        self.propose = {True: Ema(alpha), False: Ema(alpha)}  # by whether the expensive drafter ran
        self.ingest_per_token = Ema(alpha)
        # The ingest of a step that committed one token: what keeping the drafter fed costs an idle (plain) step.
        # Not ingest_per_token: the ingest is mostly a fixed cost a step (transformers fp32: ~1 ms whether the
        # step commits 1 token or 8), so a per-token average swings with the acceptance of the last steps.
        self.idle_ingest = Ema(alpha)
        self.reset()

    def reset(self) -> None:
        """A new generation: it may run at another context, so the pass corrections start again from the
        calibration (the drafter's own times carry over: see __init__)."""
        self.factor = [Ema(self.alpha) for _ in range(len(_BUCKET_EDGES) + 1)]
        self.plain_factor = Ema(self.alpha)
        # One-token passes with features, measured / calibrated: a bound on plain steps (plain_ms), which are
        # the same pass without the features' work.
        self.feature_one = Ema(self.alpha)
        self.loop = Ema(self.alpha)  # the step's time outside drafting, the pass and ingest

    def _factor(self, q: int) -> float:
        """The bucket's correction; one not measured yet stays as calibrated (a one-token pass: as plain steps
        measured, if any). Not the other buckets' mean: if a stale curve is wrong in its shape, q's still
        costed as calibrated get chosen and so measured, a plain step among them, within a step or two."""
        candidates = (self.factor[_bucket(q)].value,) + ((self.plain_factor.value,) if q == 1 else ())
        return next((f for f in candidates if f is not None), 1.0)

    def _calibrated(self, q: int, context: int) -> float:
        cost = self.curve.cost(q, context)
        if self.features:
            return cost
        return max(cost - max(0.0, self.curve.cost(1, context) - self.curve.plain(context)), 1e-6)

    def pass_ms(self, q: int, context: int) -> float:
        return 1.0 if self.curve is None else self._calibrated(q, context) * self._factor(q)

    def caution(self, q: int) -> float:
        """What pass_ms(q) is multiplied by to cost what a q-token pass could lose: 1 where q's bucket was timed;
        else the largest correction timed so far (at least 1), not the calibration's. The machine that runs
        2-token passes 16% slower than its curve runs 5-token ones slower too: on a Zen 3 one rejected 4-token
        n-gram draft cost 30 ms against 25.8 calibrated and overdrew the guard's budget (code at 128 tokens,
        2026-12-06). (A q > 1 not timed yet is in pass_ms as calibrated, so this is its whole correction.)"""
        if self.curve is None or self.factor[_bucket(q)].value is not None:
            return 1.0
        return max([1.0, self._factor(q)] + [f.value for f in self.factor if f.value is not None]) / self._factor(q)

    def plain_ms(self, context: int) -> float:
        """A plain decoding step's pass (feature-free): corrected by the plain passes measured (plain steps, and
        one-token passes without features), else as calibrated. Never inferred from other passes: longer ones
        may be slower for the curve's shape, and one-token passes with features for the eval callback, whose
        cost grows with the context on llama.cpp (at 6k tokens: ~36 ms a pass against ~25 plain, where the
        curve, timed at up to 4k, says 0.8 ms more), so a guard that read plain steps off them kept a drafter
        that made the generation 20% slower."""
        if self.curve is None:
            return 1.0
        return self.curve.plain(context) * self.plain_scale(context)

    def plain_scale(self, context: int) -> float:
        """plain_ms over the calibrated plain step: the plain passes' correction, where none was measured yet
        bounded by the one-token passes with features measured (a plain step is such a pass without the
        features' work). The bound matters where the calibration is far off and every step so far was
        speculative: at 6k tokens on llama.cpp (Zen 3), beyond the curve's 4k, the extrapolated plain step read
        69 ms against 37 measured, and the guard banked a second of "gains" from steps that each lost."""
        if self.curve is None:
            return 1.0
        if self.plain_factor.value is not None:
            return self.plain_factor.value
        if self.feature_one.value is None:
            return 1.0
        bound = self.curve.cost(1, context) * self.feature_one.value
        return min(1.0, bound / max(self.curve.plain(context), 1e-9))

    def one_token_measured(self) -> bool:
        """Whether this generation has timed a one-token pass (a plain step, or one with features)."""
        return self.plain_factor.value is not None or self.feature_one.value is not None

    def record(self, q: int, context: int, times: StepTimes, tokens: int, proposed: bool | None) -> None:
        """One step: a q-token pass at `context` committing `tokens`; proposed: None (the drafter did not run:
        a plain step), else whether its expensive part did."""
        if self.curve is None or times.verify <= 0:  # no curve to correct, or a clock that did not tick
            return
        if proposed is None or (q == 1 and not self.features):
            # A plain step, or a one-token pass without features (the n-gram lookup found nothing worth
            # verifying): what plain decoding's pass costs here.
            self.plain_factor.add(times.verify / self.curve.plain(context))
        elif q == 1:
            self.feature_one.add(times.verify / self.curve.cost(1, context))
        if proposed is not None:
            self.factor[_bucket(q)].add(times.verify / self._calibrated(q, context))
            # (zero readings, here too, are a clock that did not tick: no information)
            if times.draft > 0:
                self.propose[proposed].add(times.draft)
            if times.ingest > 0 and self.drafter_in_use:
                self.ingest_per_token.add(times.ingest / max(1, tokens))
        if times.ingest > 0 and tokens == 1 and self.drafter_in_use:  # plain steps too: it is fed while it rests
            self.idle_ingest.add(times.ingest)
        self.loop.add(max(0.0, times.total - times.draft - times.verify - times.ingest))

    def draft_ms(self) -> float:
        """What the expensive drafter adds to a step's proposing: measured (with it, less without it) once seen,
        else the calibrated block time."""
        with_it, without = self.propose[True].value, self.propose[False].value
        if with_it is not None:
            return max(0.0, with_it - (without or 0.0))
        return 0.0 if self.curve is None else (self.curve.draft_ms or 0.0)

    def ingest_ms(self) -> float:
        if self.ingest_per_token.value is not None:
            return self.ingest_per_token.value
        return 0.0 if self.curve is None else (self.curve.ingest_ms or 0.0)

    def idle_ingest_ms(self) -> float:
        """The drafter's ingest on a step that commits one token: measured, else as ingest_ms() has it."""
        return self.idle_ingest.value if self.idle_ingest.value is not None else self.ingest_ms()

    def loop_ms(self) -> float:
        return self.loop.value or 0.0
