"""Targets: one interface (base.BaseTarget), two backends.

`Target` is the transformers backend (hf.py; `Target.load(name, dtype)`), kept under its old name because
training, the bench and the tests use it directly. `LlamaCppTarget` (llamacpp.py) runs GGUF files through
llama-cpp-python; it is imported lazily, so the package works without llama-cpp-python installed.
`load_target(model, dtype, backend)` picks one.
"""

from __future__ import annotations

from hyflash.errors import HyflashError
from hyflash.targets.base import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    BaseTarget,
    TargetOutput,
    builtin_gguf,
    cache_root,
    default_feature_layers,
    gguf_path,
)
from hyflash.targets.hf import DTYPES, PREFILL_CHUNK, FeatureRecorder, Target, resolve_model_path

BACKENDS = ("transformers", "llama.cpp")

__all__ = [
    "BACKENDS", "BUILTIN_MODELS", "DEFAULT_MODEL", "DTYPES", "PREFILL_CHUNK", "BaseTarget", "FeatureRecorder",
    "Target", "TargetOutput", "builtin_gguf", "cache_root", "default_feature_layers", "gguf_path",
    "load_target", "resolve_model_path",
]


def load_target(
    model: str = DEFAULT_MODEL,
    dtype: str = "bfloat16",
    backend: str = "transformers",
    feature_layers: tuple[int, ...] | None = None,
    record_features: bool = True,
) -> BaseTarget:
    """A target for `model` (a built-in name or a local path) on `backend`.

    transformers: `dtype` is one of DTYPES; the model is a built-in name or a Hugging Face folder.
    llama.cpp: the GGUF's own quantisation runs, so `dtype` must be "auto" (or None); the model is a built-in
    name (the GGUF its package ships) or a local `PATH.gguf`.
    record_features=False (llama.cpp only; transformers records only when asked) builds a target that
    never gives features, ~9% faster for plain decoding and feature-free drafters (n-gram).
    """
    if backend == "transformers":
        return Target.load(model, dtype=dtype, feature_layers=feature_layers)
    if backend == "llama.cpp":
        if dtype not in ("auto", None):
            raise HyflashError(
                f"--dtype {dtype} does not apply to the llama.cpp backend (it runs the GGUF's own "
                f"quantisation): drop --dtype or pass --dtype auto"
            )
        from hyflash.targets.llamacpp import LlamaCppTarget

        return LlamaCppTarget.load(model, feature_layers=feature_layers, record_features=record_features)
    raise HyflashError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
