"""Target features for training: computed on the fly, optionally cached on local disk.

A training step needs the target's hidden states at the feature layers for every token of its sequences.
Computing them costs one teacher-forced target pass (no backward); on this 2-core CPU that is about as much as
the drafter's own forward+backward, so after the first epoch a disk cache halves the step time (see
docs/training.md for the measurement). The cache stores one safetensors file per sequence (bf16, the
cropped sequence only), keyed by the data shard checksums and the target signature, written atomically;
with N processes each writes only its own sequences, so no locking is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from hyflash.errors import HyflashError


@torch.inference_mode()
def teacher_features(
    target, tokens: torch.Tensor, lengths: torch.Tensor, want_logits: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """features [b, T, nF, H] (target dtype) and optionally logits [b, T, V] for right-padded sequences.

    Runs the decoder body only unless logits are wanted: the LM head over the whole vocabulary is ~20% of a
    SmolLM2 pass and the cross-entropy loss does not need it.
    """
    T = tokens.shape[1]
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    if want_logits:
        out = target.teacher_forward(tokens.to(target.device), mask.to(target.device))
        return out.features, out.logits
    body = target.model.get_decoder()
    out = body(input_ids=tokens.to(target.device), attention_mask=mask.to(target.device), use_cache=False,
               output_hidden_states=True)
    feats = torch.stack([out.hidden_states[i] for i in target.feature_layers], dim=2)
    return feats, None


class FeatureRecorder:
    """Records the target's features while it runs (e.g. inside `generate`), via forward hooks on the
    feature layers: data generation gets the features of every token it writes for free, instead of a
    second, teacher-forced pass (which costs about as much as the drafter's training step).

    hidden_states[i] (the features' indexing) is the output of decoder layer i-1; index 0 is the embedding.
    """

    def __init__(self, target):
        body = target.model.get_decoder()
        self.modules = []
        for i in target.feature_layers:
            if i == 0:
                self.modules.append(body.get_input_embeddings())
            elif i == target.num_layers:
                self.modules.append(body.norm)
            else:
                self.modules.append(body.layers[i - 1])
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.handles = []

    def __enter__(self) -> "FeatureRecorder":
        for j, module in enumerate(self.modules):
            self.handles.append(module.register_forward_hook(self._hook(j)))
        return self

    def _hook(self, j: int):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.calls[j].append(out.detach())

        return hook

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def features(self) -> torch.Tensor:
        """[B, positions run, nF, H]: every forward call's positions, in order."""
        return torch.stack([torch.cat(parts, dim=1) for parts in self.calls], dim=2)


class FeatureCache:
    """One feature file per sequence under `root/<target key>/`, named by its data shard's checksum and its
    index in the shard, so data generation and training (and any later data folder) share it. Features
    cover the *whole* sequence (full context, as at inference); training crops them like the tokens."""

    def __init__(self, root: Path, target):
        ident = {"target": target.signature(), "name": str(target.name), "dtype": str(target.dtype)}
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(root) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        info = self.folder / "cache.json"
        if not info.exists():
            tmp = info.with_name(f".cache.json.{os.getpid()}")
            tmp.write_text(json.dumps(ident, indent=1))
            os.replace(tmp, info)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.safetensors"

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
        save_file({"features": features.contiguous()}, str(tmp))
        os.replace(tmp, path)


def batch_features(target, batch, dataset, cache: FeatureCache | None, want_logits: bool = False):
    """Features [b, T, nF, H] for a Batch: cropped from cached whole-sequence features where present, else
    computed on the (cropped) batch, and then cached when the batch holds whole sequences."""
    b, T = batch.tokens.shape
    lengths = batch.lengths.tolist()
    cached = [None] * b
    if cache is not None and not want_logits:
        for j, i in enumerate(batch.indices):
            full = cache.get(dataset.keys[i], len(dataset.sequences[i]))
            if full is not None:
                cached[j] = full[batch.offsets[j] : batch.offsets[j] + lengths[j]]
    if all(c is not None for c in cached):
        out = torch.zeros(b, T, *cached[0].shape[1:], dtype=cached[0].dtype)
        for j, c in enumerate(cached):
            out[j, : lengths[j]] = c
        return out, None
    feats, logits = teacher_features(target, batch.tokens, batch.lengths, want_logits)
    if cache is not None:
        for j, i in enumerate(batch.indices):
            if cached[j] is None and batch.offsets[j] == 0:  # only uncropped sequences are whole
                cache.put(dataset.keys[i], feats[j, : lengths[j]].clone())
    return feats, logits
