"""The drafters shipped inside the package: `--drafter default` resolves here, per target model."""

from __future__ import annotations

from pathlib import Path

from hyflash.errors import HyflashError

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "drafters"
# Built-in target name -> folder of its shipped drafter (trained with the recipe in docs/training.md).
DEFAULT_DRAFTERS = {"smollm2-135m": ASSETS / "smollm2-135m"}


def default_drafter_path(model: str) -> Path:
    """The shipped drafter for a built-in target, or a HyflashError that says what to do instead."""
    path = DEFAULT_DRAFTERS.get(model)
    if path is None:
        raise HyflashError(
            f"no default drafter ships for {model!r} (only for {', '.join(DEFAULT_DRAFTERS)}): "
            "train one with `hyflash data` + `hyflash train` and pass --drafter PATH, or use --drafter ngram"
        )
    if not (path / "config.json").exists():
        raise HyflashError(f"the default drafter for {model!r} is missing from {path}: reinstall hyflash")
    return path


def resolve_drafter_spec(spec: str, model: str) -> str:
    """'default' -> the shipped drafter's folder for `model` (or a HyflashError); any other spec unchanged."""
    return str(default_drafter_path(model)) if spec == "default" else spec
