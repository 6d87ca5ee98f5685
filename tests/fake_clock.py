"""The decoding loop's clock in tests, made deterministic: time passes only where a test says it does."""

from __future__ import annotations

from hyflash import decoding


class CurveClock:
    """Time passes in target passes only: c(q) of `curve` at the cache's length (a plain pass, q = 1 without
    features: curve.plain), times slowdown(q) (the machine as it really is, where the curve may be stale).
    Drafters the test wraps can `advance` it. So the policy measures exactly what the test decides."""

    def __init__(self, monkeypatch, target, curve, slowdown=lambda q: 1.0):
        self.now_ms = 0.0
        monkeypatch.setattr(decoding, "_clock", lambda: self.now_ms / 1000)
        score = target.score

        def timed(block, features=True, **kw):
            q = len(block)
            self.now_ms += curve.score_ms(q, target.cache_length, features) * slowdown(q)
            return score(block, features=features, **kw)

        monkeypatch.setattr(target, "score", timed)

    def advance(self, ms: float) -> None:
        self.now_ms += ms
