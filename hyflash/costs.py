"""What the speculation policy reads: a machine's measured cost curve for one (model, dtype).

`calibration.py` measures and caches curves; `policy.py` turns them into decisions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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

    @property
    def max_q(self) -> int:
        return len(self.pass_ms[0])

    def cost(self, q: int, context: int) -> float:
        """c(q) at this context length: linear between measured contexts, flat beyond them."""
        q = min(max(q, 1), self.max_q)
        xs, ys = self.contexts, [row[q - 1] for row in self.pass_ms]
        if context <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if context <= x1:
                return y0 + (y1 - y0) * (context - x0) / (x1 - x0)
        return ys[-1]

    def relative(self, context: int) -> list[float]:
        """c(q) / c(1) for q = 1..max_q: how many plain steps a q-token verification costs."""
        base = self.cost(1, context)
        return [self.cost(q, context) / base for q in range(1, self.max_q + 1)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurve":
        return cls(**data)
