"""What a target's cache holds of its last prefill, so that the next prefill of a prompt that starts with the same
tokens runs only the rest (the same prompt again, a chat's next turn, a longer document), bit for bit as a fresh
prefill would.

A prefill runs its prompt in chunks of a fixed size from position 0. A later prefill keeps the whole chunks the
two prompts share and runs the rest chunk by chunk from there: the very passes a fresh prefill would run, on the
same cached keys and values, so its logits are a fresh prefill's even where a pass's numbers depend on its
length (llama.cpp's K-quants, transformers' attention over a different split). Cells a generation added after
the prompt came from one-token and verification passes, not a prefill's chunks, and are never reused.

A prefill that feeds a drafter the prompt's features (`on_features`) does not keep those features (a drafter takes
them chunk by chunk so that they are never all held at once); it keeps the drafter's own bounded state instead
(`Drafter.snapshot`) after the prompt's last whole chunk and at its end, and restores that same drafter object
there (`resumable`). A drafter that cannot be snapshotted is fed the whole prompt again.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class PrefillRecord:
    """The last prefill of a cache: its prompt `ids` (the cache's first len(ids) cells, as `chunk`-token passes
    from position 0 left them), the last position's logits (None once a rollback cut into the prompt), and the
    snapshots of the drafter it fed (`owner`) by position."""

    ids: list[int]
    chunk: int
    logits: torch.Tensor | None = None
    owner: weakref.ref | None = None
    snapshots: dict[int, dict] = field(default_factory=dict)

    def resume_positions(self) -> tuple[int, int]:
        """Where a drafter is snapshotted: after the prompt's last whole chunk (where a chat's next turn or a
        longer prompt resumes) and at its end (the same prompt again)."""
        return len(self.ids) // self.chunk * self.chunk, len(self.ids)

    def reusable(self, ids: list[int], chunk: int) -> int:
        """How many leading cells a prefill of `ids` in `chunk`-token passes may keep: the shared tokens in whole
        chunks, and never the last token, whose logits it must give (unless the prompt is this one, its logits
        kept)."""
        if chunk != self.chunk:
            return 0
        if ids == self.ids and self.logits is not None:
            return len(ids)
        shared = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            shared += 1
        return min(shared, len(ids) - 1) // chunk * chunk

    def resume_point(self, cells: int, drafter) -> int:
        """The most cells a prefill that feeds `drafter` the prompt's features may keep: a position up to `cells`
        where this record holds a snapshot of that very drafter object (0: none)."""
        if self.owner is None or self.owner() is not drafter:
            return 0
        return max((p for p in self.snapshots if p <= cells), default=0)

    def cut(self, length: int) -> None:
        """The cache now keeps only its first `length` cells."""
        if length < len(self.ids):
            self.ids, self.logits = self.ids[:length], None
            self.snapshots = {p: s for p, s in self.snapshots.items() if p <= length}

    def after_chunk(self, end: int, drafter) -> None:
        """A chunk ending at `end` has run and been fed to `drafter`: snapshot it where the record resumes."""
        if self.owner is not None and end in self.resume_positions():
            snapshot = drafter.snapshot()
            if snapshot is not None:
                self.snapshots[end] = snapshot


def begin_prefill(last: PrefillRecord | None, ids: list[int], chunk: int, features: bool, on_features, resumable,
                  keep_cells: Callable[[int], None], reset: Callable[[], None],
                  reusable: bool = True) -> tuple[int, PrefillRecord, torch.Tensor | None]:
    """Set a cache up for a prefill of `ids` in `chunk`-token passes, given its last prefill (None: none): keep
    what it may of it (`keep_cells(n)` drops every cell from n on; the drafter fed the features restored to its
    snapshot there) or `reset()` it. Returns (cells kept, the new prefill's record, the logits when the whole
    prompt was kept, else None); the caller runs the chunks from the kept cells on, calling
    `record.after_chunk` after each, and sets `record.logits` at the end. reusable=False: keep nothing (a cache
    that cannot keep an earlier prompt's cells)."""
    keep = 0 if last is None or not reusable else last.reusable(ids, chunk)
    if features:  # only up to a snapshot of the drafter on_features feeds: the kept chunks' features are gone
        keep = 0 if not keep or resumable is None or on_features is None else last.resume_point(keep, resumable)
    if keep:
        keep_cells(keep)
        last.cut(keep)  # true of the cache now, should a pass after this fail
        if features:
            resumable.restore(last.snapshots[keep])
    else:
        reset()
    record = PrefillRecord(ids, chunk)
    if features and resumable is not None:
        record.owner = weakref.ref(resumable)
        if keep:  # the kept snapshots that still stand for this prompt (a snapshot never changes once taken)
            record.snapshots = {p: s for p, s in last.snapshots.items() if p in record.resume_positions()}
    return keep, record, (last.logits if keep == len(ids) else None)
