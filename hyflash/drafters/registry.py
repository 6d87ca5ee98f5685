"""The one place a drafter spec becomes a drafter, and the drafters shipped inside the package.

A spec, as `--drafter` takes it:
  none     no drafter (plain decoding)
  ngram    prompt lookup (NgramDrafter)
  default  the drafter shipped for the target's model together with the n-gram lookup (a HybridDrafter: the
           policy takes whichever draft pays more); the n-gram drafter alone, with a note, for a model that
           has none shipped
  model:NAME|PATH  draft-model speculation: a smaller LM of the target's vocabulary (a built-in model name, a
           GGUF or a Hugging Face folder, on the target's backend) drafts autoregressively (drafters/draft_model.py)
  PATH     a drafter folder, or the folder `hyflash train --out PATH` wrote (its drafter is PATH/drafter)
`is_folder` is the one test of "this spec names a folder", and `build_drafter` / `needs_features` the one
reading of each kind.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from hyflash.drafters.base import Drafter
from hyflash.drafters.draft_model import DraftModelConfig, load_draft_model
from hyflash.drafters.hybrid import HybridDrafter
from hyflash.drafters.loading import CONFIG_FILE, drafter_folder, inference_dtype
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.ngram import NgramDrafter
from hyflash.drafters.state import DrafterState
from hyflash.errors import HyflashError

SPECS = ("none", "ngram", "default")  # the named specs; anything else is a PATH
DRAFT_MODEL_PREFIX = "model:"  # model:NAME|PATH, a smaller LM as the drafter
SPEC_HELP = ("none | ngram | default | PATH to a drafter folder (or a `hyflash train --out` folder) | model:NAME|PATH "
             "(a smaller LM of the target's vocabulary drafts)")
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "drafters"
# Built-in target name -> folder of its shipped drafter (trained with the recipe in docs/training.md).
SHIPPED_DRAFTERS = {"smollm2-135m": ASSETS / "smollm2-135m", "qwen2.5-coder-1.5b": ASSETS / "qwen2.5-coder-1.5b"}
NGRAM_BLOCK = 8


def is_folder(spec: str | None) -> bool:
    """Whether `spec` names a drafter folder (rather than none, ngram or default)."""
    return spec is not None and spec not in SPECS and not spec.startswith(DRAFT_MODEL_PREFIX)


def shipped_drafter_path(model: str) -> Path:
    """The shipped drafter for a built-in target, or a HyflashError that says what to do instead."""
    path = SHIPPED_DRAFTERS.get(model)
    if path is None:
        raise HyflashError(
            f"no default drafter ships for {model!r} (only for {', '.join(SHIPPED_DRAFTERS)}): "
            "train one with `hyflash data` + `hyflash train` and pass --drafter PATH, or use --drafter ngram"
        )
    if not (path / CONFIG_FILE).exists():
        raise HyflashError(f"the default drafter for {model!r} is missing from {path}: reinstall hyflash")
    return path


def resolve_spec(spec: str, model: str) -> str:
    """'default' -> the shipped drafter's folder for `model` (or a HyflashError); a PATH -> the drafter folder it
    names (a training run's PATH/drafter); none and ngram unchanged."""
    if spec == "default":
        return str(shipped_drafter_path(model))
    return str(drafter_folder(spec)) if is_folder(spec) else spec


def needs_features(spec: str | None, model: str) -> bool:
    """Whether the drafter `spec` (as build_drafter reads it) uses the target's features: a llama.cpp target
    built without them runs ~9% faster (no eval callback)."""
    if spec == "default":
        return model in SHIPPED_DRAFTERS  # else build_drafter falls back to the n-gram drafter
    return is_folder(spec)


def fingerprint(spec: str | None, model: str) -> str:
    """What `spec` runs for `model`, as a short hash a measurement can be keyed by: "none", "ngram", or a
    sha256 of the drafter folder's config and weights ("hybrid:" before it for default's pair). A retrained
    drafter in the same folder is another drafter."""
    if spec in (None, "none"):
        return "none"
    if spec == "ngram" or (spec == "default" and model not in SHIPPED_DRAFTERS):
        return "ngram"
    folder = Path(resolve_spec(spec, model))
    digest = hashlib.sha256()
    for file in [folder / CONFIG_FILE, *sorted(folder.glob("*.safetensors"))]:
        digest.update(file.name.encode())
        digest.update(file.read_bytes() if file.exists() else b"")
    return ("hybrid:" if spec == "default" else "") + digest.hexdigest()[:20]


def load_drafter(path, target, int8: bool | None = None) -> DrafterState:
    """The inference-time drafter stored at `path` (a drafter folder or a training run's), checked against
    `target`.

    int8 (default: on CPUs) quantises the drafter's weights, never the target's: drafts get cheaper, the
    output stays exactly the target's."""
    state = DrafterState(DrafterModel.from_pretrained(drafter_folder(path), target, dtype=inference_dtype(target)))
    if int8 if int8 is not None else target.device.type == "cpu":
        state.quantize_int8()
    return state


def build_drafter(spec: str, target, block_size: int | None = None, quiet: bool = False) -> Drafter | None:
    """The drafter `spec` names, for `target` (see the module's docstring); block_size: the n-gram drafter's."""
    if spec == "none":
        return None
    if spec == "default":
        if target.name in SHIPPED_DRAFTERS:
            return HybridDrafter(load_drafter(shipped_drafter_path(target.name), target))
        if not quiet:
            print(f"hyflash: no shipped drafter for {target.name}; using the n-gram drafter", file=sys.stderr)
        spec = "ngram"
    if spec == "ngram":
        return NgramDrafter(block_size=block_size or NGRAM_BLOCK)
    if spec.startswith(DRAFT_MODEL_PREFIX):
        config = DraftModelConfig(max_draft=block_size - 1) if block_size else DraftModelConfig()
        return load_draft_model(spec.removeprefix(DRAFT_MODEL_PREFIX), target, config)
    return load_drafter(spec, target)
