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
