"""Copy candidates: what the longest recent suffix match in the context says comes next.

The n-gram drafter proposes exactly this continuation. A block drafter with `copy_ngram > 0` gets it as an
input instead, one candidate token per draft slot plus the match length, and learns when to trust it (see
docs/training.md §7: where the drafter lost to the n-gram lookup, it lost on copies of URLs, doctests and
repeated code). Its output gains a pointer: a copy token outside the reduced draft vocabulary can still be
proposed, with the logit the target's LM head row gives it.

`suffix_match` is the plain definition (the n-gram drafter uses it too); `batched_copy_candidates` computes
the same for many anchors of many sequences at once, for training (tests hold the two equal).
"""

from __future__ import annotations

import numpy as np
import torch


def suffix_match(seq: torch.Tensor, max_ngram: int, min_ngram: int = 1) -> tuple[int, int]:
    """(start, n) for a 1-D token sequence: n is the longest suffix length in [min_ngram, max_ngram] that also
    occurs earlier (ending before the last token), and start is where the continuation of its most recent
    earlier occurrence begins; (-1, 0) when no suffix recurs."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        windows = seq[:-1].unfold(0, n, 1)  # every earlier n-gram (excluding the suffix itself)
        hits = (windows == seq[-n:]).all(-1).nonzero().flatten()
        if len(hits):
            return int(hits[-1]) + n, n
    return -1, 0


class TokenHistory:
    """A growing token sequence that answers `suffix_match(history + [last_token])` in tens of microseconds.

    The decode loop asks this every step (the n-gram lookup, and a HyFlash drafter's copy input); the plain
    `suffix_match` compares every earlier n-gram for each n, ~0.15 ms at 6k tokens, 1-2% of a llama.cpp step on
    2 cores. Here one vectorised comparison finds the earlier occurrences of the last token, and only those are
    extended backwards. Tokens live in a numpy int32 buffer that doubles when full (4-8 bytes a token), so
    appending is amortised O(1) instead of a copy of the whole history per step. Tests hold it equal to
    `suffix_match`.

    `extend` only queues its tokens; the next read copies them in. Right after a target pass the copy took ~0.08 ms
    (cold caches; ~1% of a llama.cpp Q4_1 step on 2 cores), paid on every step even where the lookup backs off
    or the guard idles, which must cost nothing (issue 36); queued, a step that reads nothing pays ~1 µs."""

    def __init__(self) -> None:
        self._buf = np.empty(256, dtype=np.int32)
        self._len = 0
        self._queued: list = []  # pieces extended and not yet in the buffer, in order

    def __len__(self) -> int:
        self._flush()
        return self._len

    def extend(self, tokens) -> None:
        self._queued.append(tokens)

    def _flush(self) -> None:
        if not self._queued:
            return
        pieces, self._queued = self._queued, []
        new = np.concatenate([
            np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t, dtype=np.int64).reshape(-1)
            for t in pieces])
        need = self._len + len(new)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), dtype=np.int32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = new
        self._len = need

    @property
    def tokens(self) -> np.ndarray:
        """The history (a view: copy it to keep it)."""
        self._flush()
        return self._buf[: self._len]

    def nbytes(self) -> int:
        """The tokens' bytes (4 a token), as draft memory reports it; the buffer may hold up to twice that."""
        self._flush()
        return 4 * self._len

    def match(self, last_token: int, max_ngram: int, min_ngram: int = 1) -> tuple[int, int]:
        """suffix_match(history + [last_token], max_ngram, min_ngram): (start, n), start indexing that sequence.

        A fixed handful of numpy calls whatever the match length: the decode loop calls this right after a target
        pass has flushed the CPU's caches, where each numpy call costs ~10x its warm time (a loop of ~5 calls per
        token of match length took ~0.2 ms a step on llama.cpp, 2-3% of a one-token step, experiments/never_slower)."""
        h = self.tokens  # flushes the queue, so _len is current
        L = self._len
        longest = min(max_ngram, L)
        if longest < min_ngram:
            return -1, 0
        ends = np.flatnonzero(h == last_token) + 1  # an earlier occurrence of the 1-token suffix ends at each
        if len(ends) == 0:
            return -1, 0
        # Token j before each end (j = 1 .. longest - 1) against the suffix's token j before the last; a run of
        # agreements from j = 1 is the match's length beyond its last token. Positions before the start disagree.
        before = ends[:, None] - np.arange(2, longest + 1)
        agree_at = (h[np.maximum(before, 0)] == h[L - 1 : L - longest : -1]) & (before >= 0)
        agree = 1 + np.logical_and.accumulate(agree_at, axis=1).sum(axis=1)
        n = int(agree.max())
        if n < min_ngram:
            return -1, 0
        return int(ends[agree == n][-1]), n

    def continuation(self, start: int, last_token: int, k: int) -> list[int]:
        """(history + [last_token])[start : start + k]: a match's continuation may run into the last token."""
        tail = self.tokens[start : start + k].tolist()  # flushes the queue, so _len is current
        if len(tail) < k and start + len(tail) == self._len:
            tail.append(last_token)
        return tail[:k]

    def copy_candidates(self, last_token: int, num_slots: int, max_ngram: int) -> tuple[torch.Tensor, int]:
        """copy_candidates(history + [last_token], num_slots, max_ngram)."""
        start, n = self.match(last_token, max_ngram)
        out = torch.full((num_slots,), -1, dtype=torch.long)
        if n:
            tail = self.continuation(start, last_token, num_slots)
            out[: len(tail)] = torch.tensor(tail, dtype=torch.long)
        return out, n


def copy_candidates(seq: torch.Tensor, num_slots: int, max_ngram: int) -> tuple[torch.Tensor, int]:
    """For a block after the last token of `seq`: the tokens the suffix match continues with, one per slot
    ([num_slots] long, -1 where the continuation runs past the known tokens or there is no match), and n."""
    start, n = suffix_match(seq, max_ngram)
    out = torch.full((num_slots,), -1, dtype=torch.long)
    if n:
        tail = seq[start : start + num_slots]
        out[: len(tail)] = tail
    return out, n


def batched_copy_candidates(tokens: torch.Tensor, anchors: torch.Tensor, num_slots: int,
                            max_ngram: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`copy_candidates(tokens[b, :a + 1], ...)` for every anchor a: tokens [B, T], anchors [B, A] ->
    (candidates [B, A, num_slots], match lengths [B, A])."""
    B, T = tokens.shape
    device = tokens.device
    anchors = anchors.long()
    ends = torch.arange(T, device=device)
    batch = torch.arange(B, device=device)[:, None]
    # agree[b, a, e]: for how many tokens, up to max_ngram, the context ending at e (< a) agrees backwards with
    # the one ending at the anchor; an earlier occurrence of the n-token suffix ends at e exactly when it is
    # >= n. One [B, A, T] comparison per offset, instead of one per n-gram length and token.
    running = ends < anchors[..., None]
    agree = torch.zeros(running.shape, dtype=torch.int16, device=device)
    for k in range(max_ngram):
        same = tokens[:, (ends - k).clamp_min(0)][:, None] == tokens.gather(1, (anchors - k).clamp_min(0))[..., None]
        running = running & same & (ends >= k)
        if not running.any():
            break
        agree += running
    lengths = agree.amax(-1).long()  # the longest suffix (<= max_ngram) that recurs
    latest = torch.where((agree >= lengths[..., None]) & (lengths[..., None] > 0), ends, -1).amax(-1)
    starts = torch.where(lengths > 0, latest + 1, -1)  # its most recent occurrence's continuation
    positions = starts[..., None] + torch.arange(num_slots, device=device)  # [B, A, S]
    known = (lengths[..., None] > 0) & (positions <= anchors[..., None])
    candidates = tokens[batch[..., None], positions.clamp(0, T - 1)]
    return torch.where(known, candidates, -1), lengths


def copy_labels(draft_labels: torch.Tensor, labels: torch.Tensor, candidates: torch.Tensor,
                draft_vocab_size: int) -> torch.Tensor:
    """Labels for logits with a pointer column: a target label outside the draft vocabulary (draft label -1)
    that equals the slot's copy candidate becomes index draft_vocab_size (the pointer); everything else keeps
    its draft label. labels are target ids (-1 = none), draft_labels the same mapped to the draft vocabulary."""
    pointed = (draft_labels < 0) & (labels >= 0) & (labels == candidates.to(labels.device))
    return torch.where(pointed, torch.full_like(draft_labels, draft_vocab_size), draft_labels)
