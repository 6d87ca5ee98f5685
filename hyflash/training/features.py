"""Target features for training: computed on the fly, optionally cached on local disk.

A training step needs the target's hidden states at the feature layers for every token of its sequences.
Computing them costs one teacher-forced target pass (no backward); on this 2-core CPU that is about as much as
the drafter's own forward+backward, so after the first epoch a disk cache halves the step time (see
docs/training.md for the measurement). The cache stores one safetensors file per sequence (bf16, the whole
sequence), keyed by the data shard checksums and the target signature, written atomically; with N processes
each writes only its own sequences, so no locking is needed.

Features always come from the whole sequence (full context, as at inference), also for sequences a batch
crops: so they are the same whether they are read from the cache or computed, and whatever a sequence is
batched with.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json
from hyflash.targets import FeatureRecorder  # noqa: F401 - re-exported: training code records with it


def slot_positions(anchors: torch.Tensor, slots: int) -> torch.Tensor:
    """[..., A, slots]: the position whose target distribution slot k (1..slots) of the block at anchor a is
    trained towards, a + k - 1 (that distribution predicts tokens[a + k], the slot's label)."""
    return anchors[..., None] + torch.arange(slots, device=anchors.device)


def head_logits(target, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Float logits of the target's LM head over vocab_ids only (all when None), for hidden [..., H]."""
    head = target.model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if vocab_ids is not None:  # only the draft vocabulary's rows: the KL renormalises onto it anyway
        ids = vocab_ids.to(weight.device)
        weight, bias = weight[ids], None if bias is None else bias[ids]
    logits = F.linear(hidden.to(weight), weight, bias).float()
    cap = getattr(target.model.config.get_text_config(), "final_logit_softcapping", None)
    return logits if not cap else torch.tanh(logits / cap) * cap


def length_groups(lengths: list[int], max_padding: float = 0.25) -> list[list[int]]:
    """Indices of `lengths` in groups to run as one padded batch each, longest first: a group grows while its
    padding stays within max_padding of its tokens. One batch pads every sequence to the longest; on a CPU a
    batch with one 8k-token sequence among 500-token ones spent most of its pass on padding (attention is
    quadratic), while on a GPU short sequences still share one batch."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        group = groups[-1] if groups else None
        if group is not None and lengths[group[0]] * (len(group) + 1) <= (1 + max_padding) * (
            sum(lengths[k] for k in group) + lengths[i]
        ):
            group.append(i)
        else:
            groups.append([i])
    return groups


@torch.inference_mode()
def teacher_features(
    target,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    logit_positions: torch.Tensor | None = None,
    vocab_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """features [b, T, nF, H] (target dtype, on the target's device) for right-padded sequences and, given
    logit_positions [b, ...], the target's float logits at those positions only, over vocab_ids: [b, ..., V'].

    Runs the decoder body, with hooks on the feature layers (`output_hidden_states` would keep every layer),
    and the LM head only on the rows asked for: the head over the whole vocabulary and every position is ~20%
    of a SmolLM2 pass and [b, T, V] in float32 is most of its memory.
    """
    device = target.device
    T = tokens.shape[1]
    mask = (torch.arange(T)[None] < lengths.cpu()[:, None]).long()
    with FeatureRecorder(target) as recorder:
        out = target.model.get_decoder()(
            input_ids=tokens.to(device), attention_mask=mask.to(device), use_cache=False
        )
    feats = recorder.features()
    if logit_positions is None:
        return feats, None
    flat = logit_positions.to(device).clamp(0, T - 1).reshape(len(tokens), -1)
    rows = flat + T * torch.arange(len(tokens), device=device)[:, None]
    # Blocks overlap: each position's head row is computed once, then spread to the slots that read it.
    unique, inverse = torch.unique(rows, return_inverse=True)
    hidden = out.last_hidden_state.flatten(0, 1)[unique]
    logits = head_logits(target, hidden, vocab_ids)
    return feats, logits[inverse].view(*logit_positions.shape, -1)


class FeatureCache:
    """One feature file per sequence under `root/<target key>/`, named by its data shard's checksum and its
    index in the shard, so data generation and training (and any later data folder) share it. Features
    cover the *whole* sequence (full context, as at inference); training crops them like the tokens.

    `dtype` files the features under another dtype's folder, stored in that dtype: long sequences decode
    2-3x faster in float32 on some CPUs, and their features then serve a bfloat16 training run (they are
    what the bfloat16 target computes, up to its rounding)."""

    def __init__(self, root: Path, target, dtype: torch.dtype | None = None):
        self.dtype = dtype
        ident = {"target": target.signature(), "name": str(target.name), "dtype": str(dtype or target.dtype)}
        if target.numbers_identity() is not None:  # the same model, other numbers
            ident["backend"] = target.numbers_identity()
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(root) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        info = self.folder / "cache.json"
        if not info.exists():
            atomic_write_json(info, ident)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.safetensors"

    def has(self, key: str) -> bool:
        return self._path(key).exists()

    def get(self, key: str, length: int) -> torch.Tensor | None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self._path(key)
        if not path.exists():
            return None
        try:
            feats = load_file(str(path))["features"]
        except (SafetensorError, OSError, KeyError) as exc:
            raise HyflashError(f"feature cache file {path} is corrupt ({exc}): delete it") from exc
        if feats.shape[0] != length:
            raise HyflashError(f"feature cache file {path} has {feats.shape[0]} positions, expected {length}: delete it")
        return feats

    def put(self, key: str, features: torch.Tensor) -> None:
        from safetensors.torch import save_file

        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        if self.dtype is not None:
            features = features.to(self.dtype)
        save_file({"features": features.contiguous()}, str(tmp))
        os.replace(tmp, path)


def batch_features(target, batch, dataset, cache: FeatureCache | None, want_logits: bool = False,
                   vocab_ids: torch.Tensor | None = None, source=None):
    """Features [b, T, nF, H] for a Batch (on the target's device) and, with want_logits, the target's logits
    at every block slot [b, A, S-1, V'] over vocab_ids (see `slot_positions`).

    `source`: another target that computes the features instead, cast to the training target's dtype: a
    llama.cpp target (one prefill per sequence), for a drafter meant to run on that backend, or the
    transformers target in another dtype (--feature-compute-dtype), which runs the same whole-sequence pass
    as `target` would: a prefill would refuse sequences longer than the model's context, which data may hold.

    Each sequence's features are those of its whole sequence, cropped like its tokens: read from the cache
    where present, else computed on the whole sequence (and then cached). Computing them on the cropped
    tokens would lose the context before the crop, so a cropped sequence would get other features when its
    batch mates are all cached than when one of them is not, and other features without a cache than with one.
    """
    b, T = batch.tokens.shape
    lengths, offsets = batch.lengths.tolist(), batch.offsets
    whole: list[torch.Tensor | None] = [None] * b
    if cache is not None and not want_logits:  # the logits need a target pass over every sequence anyway
        for j, i in enumerate(batch.indices):
            whole[j] = cache.get(dataset.keys[i], len(dataset.sequences[i]))
    missing = [j for j in range(b) if whole[j] is None]
    seqs = [torch.from_numpy(np.asarray(dataset[batch.indices[j]][0], dtype=np.int64)) for j in missing]
    logits = None
    computer = target if source is None else source
    if missing and computer.backend != "transformers":
        if want_logits:
            raise HyflashError("target logits for training come from the transformers backend only")
        for j, seq in zip(missing, seqs):
            whole[j] = computer.prefill(seq, features=True).features.to(target.dtype)
    elif missing:
        parts = []
        for group in length_groups([len(s) for s in seqs]):
            full_lengths = torch.tensor([len(seqs[k]) for k in group])
            tokens = torch.zeros(len(group), int(full_lengths.max()), dtype=torch.long)
            for row, k in enumerate(group):
                tokens[row, : len(seqs[k])] = seqs[k]
            positions = None
            if want_logits:  # slot positions in the batch's cropped coordinates, shifted to the whole sequence's
                rows = [missing[k] for k in group]
                shift = torch.tensor([offsets[j] for j in rows])[:, None, None]
                positions = slot_positions(batch.anchors[rows], batch.labels.shape[-1]) + shift
            feats, group_logits = teacher_features(computer, tokens, full_lengths, positions, vocab_ids)
            for row, k in enumerate(group):
                whole[missing[k]] = feats[row, : len(seqs[k])].to(target.dtype)
            parts.append((group, group_logits))
        if want_logits:  # back in the order of `missing`
            order = torch.tensor([k for group, _ in parts for k in group]).argsort()
            logits = torch.cat([part for _, part in parts])[order.to(parts[0][1].device)]
    if cache is not None:
        for j in missing:
            key = dataset.keys[batch.indices[j]]
            if not cache.has(key):
                cache.put(key, whole[j].to("cpu", copy=True))
    out = torch.zeros(b, T, *whole[0].shape[1:], dtype=whole[0].dtype, device=target.device)
    for j, w in enumerate(whole):
        out[j, : lengths[j]] = w[offsets[j] : offsets[j] + lengths[j]].to(out.device)
    return out, logits
