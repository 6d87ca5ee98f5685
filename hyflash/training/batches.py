"""Deterministic batches of sequences and random anchors for block training.

Everything random here is a pure function of (seed, epoch, step or sequence index), never of a global RNG:
that is what makes resume-after-kill and N-process training reproduce a 1-process run exactly. Step s of the
run always trains on the same global batch; process r of N takes every N-th sequence of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hyflash.drafters.config import DrafterConfig
from hyflash.errors import HyflashError


@dataclass
class Batch:
    tokens: torch.Tensor  # [b, T] long, right-padded with 0
    lengths: torch.Tensor  # [b]
    anchors: torch.Tensor  # [b, A] positions of block anchors (duplicates allowed where masked)
    labels: torch.Tensor  # [b, A, S-1] target token ids the slots must predict, -1 = no loss
    indices: list[int]  # dataset indices of the sequences (for the feature cache)
    offsets: list[int]  # first kept position of each sequence (long ones are cropped at the front)


def epoch_order(num_sequences: int, lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> np.ndarray:
    """A shuffled order in which each run of `batch_size` sequences has similar lengths (little padding).

    Shuffle, sort within windows of 32 batches by length, cut into batches, shuffle the batches.
    """
    rng = np.random.default_rng([seed, epoch, 0xB47C])
    order = rng.permutation(num_sequences)
    window = batch_size * 32
    for start in range(0, num_sequences, window):
        part = order[start : start + window]
        order[start : start + window] = part[np.argsort(lengths[part], kind="stable")]
    n_batches = num_sequences // batch_size  # the ragged tail is dropped (next epoch reshuffles)
    batches = order[: n_batches * batch_size].reshape(n_batches, batch_size)
    return batches[rng.permutation(n_batches)]


def sample_anchors(
    length: int, gen_start: int, num_anchors: int, block_size: int, seed: int, epoch: int, index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Anchors among positions whose block labels are all target-written: a >= gen_start (the first
    generated token is the first anchor decoding ever drafts from) and a <= length - 2 (labels past the
    end are masked, so the final tokens and end-of-sequence are learned at every slot).
    Returns (anchors [A], valid [A]); when fewer positions exist than A, the rest repeat and are invalid."""
    first = max(1, gen_start)
    candidates = np.arange(first, length - 1)
    valid = np.ones(num_anchors, dtype=bool)
    if len(candidates) == 0:
        return np.full(num_anchors, max(1, length - 2)), ~valid
    rng = np.random.default_rng([seed, epoch, index, 0xA7C])
    if len(candidates) >= num_anchors:
        picks = np.sort(rng.choice(candidates, size=num_anchors, replace=False))
    else:
        picks = np.resize(candidates, num_anchors)
        valid[len(candidates) :] = False
    return picks, valid


def make_batch(
    dataset, indices: list[int], num_anchors: int, block_size: int, max_length: int, seed: int, epoch: int
) -> Batch:
    seqs, starts, offsets = [], [], []
    for i in indices:
        tokens, gen_start = dataset[i]
        # Long sequences keep their last max_length tokens: all of the target-written part, most context.
        cut = max(0, len(tokens) - max_length)
        seqs.append(tokens[cut:])
        starts.append(max(0, gen_start - cut))
        offsets.append(cut)
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    anchors = torch.zeros(len(seqs), num_anchors, dtype=torch.long)
    labels = torch.full((len(seqs), num_anchors, block_size - 1), -1, dtype=torch.long)
    slot = torch.arange(1, block_size)
    for b, (seq, g, i) in enumerate(zip(seqs, starts, indices)):
        tokens[b, : len(seq)] = torch.from_numpy(np.asarray(seq, dtype=np.int64))
        picks, valid = sample_anchors(len(seq), g, num_anchors, block_size, seed, epoch, i)
        anchors[b] = torch.from_numpy(picks)
        target_pos = anchors[b, :, None] + slot  # [A, S-1]
        inside = (target_pos < len(seq)) & torch.from_numpy(valid)[:, None]
        labels[b] = torch.where(inside, tokens[b, target_pos.clamp(max=width - 1)], -1)
    lengths = torch.tensor([len(s) for s in seqs])
    return Batch(tokens, lengths, anchors, labels, list(indices), offsets)


def draft_vocab_from_counts(counts: np.ndarray, size: int, always: list[int] = ()) -> np.ndarray:
    """The `size` most frequent ids (ties: lower id first), always including `always` (e.g. end-of-sequence)."""
    order = np.lexsort((np.arange(len(counts)), -counts))
    chosen = [int(t) for t in always]
    seen = set(chosen)
    for t in order:
        if len(chosen) >= size:
            break
        if int(t) not in seen:
            chosen.append(int(t))
            seen.add(int(t))
    return np.asarray(chosen[:size], dtype=np.int64)


def training_batches(dataset, steps: int, batch_size: int, num_anchors: int, block_size: int, max_length: int,
                     seed: int, start: int = 0, rank: int = 0, world: int = 1):
    """(step, epoch, Batch) for steps start .. steps-1, in order: the batches `hyflash train` trains on (epoch
    `step // batches_per_epoch`, that epoch's `epoch_order`, `make_batch`); with `world` processes, process
    `rank` gets every world-th sequence of each global batch. Checks the batch size now, not at the first step."""
    per_epoch = len(dataset) // batch_size
    if per_epoch == 0:
        raise HyflashError(f"{len(dataset)} sequences are fewer than one batch of {batch_size}")
    lengths = np.array([len(s) for s in dataset.sequences])

    def batches():
        order, order_epoch = None, -1
        for step in range(start, steps):
            epoch, position = divmod(step, per_epoch)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(len(dataset), lengths, batch_size, seed, epoch), epoch
            indices = [int(i) for i in order[position]][rank::world]
            yield step, epoch, make_batch(dataset, indices, num_anchors, block_size, max_length, seed, epoch)

    return batches()


def anchor_context_stats(dataset, steps: int, batch_size: int, num_anchors: int, block_size: int, max_length: int,
                         seed: int, window: int, chunk_size: int, thresholds=(256, 1024, 2048)) -> dict:
    """How much context the training anchors of a run have: a block at anchor a (in the cropped sequence) reads
    the a tokens before it, so its context exceeds the window when a > window, and a memory drafter (hyflash)
    has folded tokens into its recurrent state when its memory start for a tokens is > 0 (a >= window +
    chunk_size). Counts the valid anchors of every step (`training_batches`); padded repeats are left out."""
    rule = DrafterConfig(kind="hyflash", window=window, chunk_size=chunk_size)
    contexts, long_source, padded = [], [], 0
    for _, _, batch in training_batches(dataset, steps, batch_size, num_anchors, block_size, max_length, seed):
        valid = batch.labels[:, :, 0] >= 0  # a valid anchor always has its slot-1 label (a <= length - 2)
        whole = batch.lengths + torch.tensor(batch.offsets)  # uncropped sequence lengths
        contexts.append(batch.anchors[valid])
        long_source.append((whole[:, None] >= 2048).expand_as(valid)[valid])
        padded += int((~valid).sum())
    context = torch.cat(contexts).numpy()
    if len(context) == 0:
        raise HyflashError("no valid training anchors: the sequences have no target-written positions")
    values, inverse = np.unique(context, return_inverse=True)
    in_memory = np.array([rule.memory_start(int(a)) > 0 for a in values])[inverse]

    def share(mask) -> float:
        return round(float(np.mean(mask)), 4)

    return {
        "anchors": int(len(context)),
        "padded_anchor_slots": padded,
        "share_context_exceeds_window": share(context > window),
        "share_memory_in_use": share(in_memory),
        "share_context_over": {str(t): share(context > t) for t in thresholds},
        "share_from_sequences_2k": share(torch.cat(long_source).numpy()),
        "context_mean": round(float(context.mean()), 1),
        "context_median": float(np.median(context)),
        "context_max": int(context.max()),
    }
