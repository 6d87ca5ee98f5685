"""Drafter checkpoints on disk: a folder with config.json and model.safetensors (weights only, never pickle).

Every failure a user can meet is a one-line HyflashError naming the problem and the fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hyflash.drafters.config import DrafterConfig
from hyflash.errors import HyflashError
from hyflash.files import replace_folder, temporary_folder_beside

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "hyflash-drafter"  # marks config.json as ours
TRAINED_SUBFOLDER = "drafter"  # where `hyflash train --out RUN` saves its drafter: RUN/drafter
NEW_HINT = "create one with `hyflash drafter new --kind hyflash --out DIR` (or train one)"


def write_checkpoint(path, config: DrafterConfig, tensors: dict[str, torch.Tensor]) -> Path:
    """Write atomically: into a temporary sibling folder, then swapped in over `path`."""
    path = Path(path).expanduser()
    tmp = temporary_folder_beside(path)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, **config.to_dict()}, indent=2) + "\n")
        replace_folder(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def drafter_folder(path) -> Path:
    """The drafter folder `path` names: the folder itself, or the drafter inside a `hyflash train --out` folder
    (TRAINED_SUBFOLDER), so that `--drafter RUN` works as well as `--drafter RUN/drafter`."""
    path = Path(path).expanduser()
    if not (path / CONFIG_FILE).is_file() and (path / TRAINED_SUBFOLDER / CONFIG_FILE).is_file():
        return path / TRAINED_SUBFOLDER
    return path


def read_config(path) -> DrafterConfig:
    path = drafter_folder(path)
    if not path.is_dir():
        raise HyflashError(f"no drafter folder at {path}: check the path, or {NEW_HINT}")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise HyflashError(f"{path} has no {CONFIG_FILE}, so it is not a drafter folder: {NEW_HINT}")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HyflashError(f"{file} is unreadable or corrupt ({exc}): re-save or recreate the drafter") from exc
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        raise HyflashError(f"{file} is not a hyflash drafter config: point --drafter at a drafter folder")
    try:
        return DrafterConfig.from_dict(data).resolved()
    except HyflashError as exc:
        raise HyflashError(f"{file}: {exc}; re-save or recreate the drafter") from exc


def read_weights(path) -> dict[str, torch.Tensor]:
    file = drafter_folder(path) / WEIGHTS_FILE
    if not file.is_file():
        raise HyflashError(f"{Path(path)} has no {WEIGHTS_FILE}: the save was incomplete; re-save or recreate it")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise HyflashError(f"{file} is corrupt or unreadable ({exc}): re-save or recreate the drafter") from exc


def check_target(config: DrafterConfig, target, where="the drafter") -> None:
    """Raise if the drafter was built for another target: hidden size, vocabulary, depth, feature layers."""
    have, want = target.signature(), config.signature()
    have["feature_layers"] = list(have["feature_layers"])
    name = getattr(target, "name", "") or "the target"
    labels = {"hidden_size": "hidden size", "vocab_size": "vocabulary size", "num_layers": "layer count",
              "feature_layers": "feature layers"}
    for key, label in labels.items():
        if have[key] != want[key]:
            raise target_mismatch(config, label, want[key], have[key], name, where)


def target_mismatch(config: DrafterConfig, label: str, want, have, name: str, where="the drafter") -> HyflashError:
    """The one-line error for a drafter built for a target that differs in `label`."""
    return HyflashError(
        f"{where} was built for {config.target_name or 'another target'} with {label} {want}, "
        f"but {name} has {have}: use it with the target it was built for, or create one for "
        f"this target with `hyflash drafter new --model MODEL --out DIR` (or train one)"
    )


def inference_dtype(target) -> torch.dtype:
    """The drafter runs in float32 on CPUs: it is small, and bf16 matmuls of several rows are 3-5x slower
    than fp32 on CPUs without native bf16 (AVX2). On accelerators it follows the target."""
    return torch.float32 if target.device.type == "cpu" else target.dtype
