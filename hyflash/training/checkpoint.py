"""Training checkpoints: atomic, checksummed, and free of pickle.

A checkpoint is a folder `step-000123/` holding
  model.safetensors      every tensor of the drafter's state_dict (trainable weights and its buffers)
  optimizer.safetensors  the optimiser's per-parameter tensors, keyed "<param index>.<name>"
  rng.safetensors        torch's CPU RNG state (a uint8 tensor)
  meta.json              step, the run's fingerprint, optimiser hyper-parameters and scalar state,
                         scheduler state, Python/NumPy RNG states, and the sha256 of each file above

It is written into a hidden temporary folder and renamed into place, so a kill at any moment leaves either a
complete checkpoint or none. Loading checks every checksum and that the fingerprint (model and training
settings that shape the trajectory) matches the run being resumed; otherwise it raises HyflashError.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hyflash.errors import HyflashError
from hyflash.files import file_sha256, replace_folder
from hyflash.optimizer_state import load_optimizer, optimizer_tensors

_STEP_DIR = re.compile(r"^step-(\d{6,})$")
FORMAT_VERSION = 1


@dataclass
class Restored:
    step: int
    meta: dict


def rng_snapshot() -> tuple[dict, torch.Tensor]:
    py = random.getstate()
    np_state = np.random.get_state()
    meta = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return meta, torch.get_rng_state()


def rng_restore(meta: dict, torch_state: torch.Tensor) -> None:
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch_state)


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    fingerprint: dict,
    extra: dict | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` under root atomically; keep only the newest `keep` checkpoints."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model_tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    opt_tensors, opt_info = optimizer_tensors(optimizer)
    rng_meta, torch_rng = rng_snapshot()
    save_file(model_tensors, str(tmp / "model.safetensors"))
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    save_file({"torch": torch_rng}, str(tmp / "rng.safetensors"))
    meta = {
        "version": FORMAT_VERSION,
        "step": step,
        "fingerprint": fingerprint,
        "optimizer": opt_info,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_meta,
        "extra": extra or {},
        "sha256": {name: file_sha256(tmp / name)
                   for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors")},
    }
    with open(tmp / "meta.json", "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    replace_folder(tmp, final)  # a re-run of the same step (e.g. after resuming from it) replaces it
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint folders, oldest first (temporary folders of killed writes are ignored)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _describe_mismatch(saved: dict, current: dict) -> str:
    keys = sorted(set(saved) | set(current))
    diffs = [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]
    return "; ".join(diffs[:5])


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, fingerprint: dict,
    defaults: dict | None = None,
) -> Restored:
    """Restore everything saved by save_checkpoint into the given objects (and the RNGs).

    `defaults`: values for settings that a checkpoint written by an older hyflash does not record (settings
    added since take their default, which reproduces the old behaviour), so upgrading does not strand runs."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        files = meta["sha256"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise HyflashError(f"checkpoint {path} is corrupt: cannot read {meta_path.name} ({exc}); delete it") from exc
    if meta.get("version") != FORMAT_VERSION:
        raise HyflashError(f"checkpoint {path} has format version {meta.get('version')}, expected {FORMAT_VERSION}")
    for name, digest in files.items():
        if not (path / name).exists() or file_sha256(path / name) != digest:
            raise HyflashError(f"checkpoint {path} is corrupt: {name} is missing or fails its checksum; delete it")
    saved = {**{k: v for k, v in (defaults or {}).items() if k in fingerprint}, **meta["fingerprint"]}
    if saved != fingerprint:
        raise HyflashError(
            f"checkpoint {path} belongs to a run with other settings ({_describe_mismatch(saved, fingerprint)}); "
            "resume with the same settings or start a new --out folder"
        )
    try:
        model_tensors = load_file(str(path / "model.safetensors"))
        opt_tensors = load_file(str(path / "optimizer.safetensors"))
        torch_rng = load_file(str(path / "rng.safetensors"))["torch"]
        model.load_state_dict(model_tensors, strict=True)
        load_optimizer(optimizer, opt_tensors, meta["optimizer"])
    except (SafetensorError, RuntimeError, KeyError, ValueError) as exc:
        raise HyflashError(f"checkpoint {path} does not fit this model ({str(exc).splitlines()[0]})") from exc
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    rng_restore(meta["rng"], torch_rng)
    return Restored(step=int(meta["step"]), meta=meta)
