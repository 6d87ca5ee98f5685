"""Targets: one interface (base.BaseTarget), two backends.

`HFTarget` is the transformers backend (hf.py; `HFTarget.load(name, dtype)`): training, the bench and the
tests use it directly. `LlamaCppTarget` (llamacpp.py) runs GGUF files through
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
from hyflash.targets.hf import DTYPES, PREFILL_CHUNK, FeatureRecorder, HFTarget, hf_identity, resolve_model_path

BACKENDS = ("transformers", "llama.cpp")
# The llama.cpp backend's KV cache element types, by llama.cpp's names (its -ctk / -ctv) -> ggml_type ids;
# here, not in llamacpp.py, so the command line can offer them without importing llama-cpp-python.
CACHE_TYPES = {"f16": 1, "q8_0": 8, "bf16": 30}
# The most leaves of a draft tree the llama.cpp backend verifies (one sequence each; see llamacpp.py); here, so
# a --tree that could exceed it is refused when the arguments are read, not mid-generation.
TREE_LEAVES = 32

__all__ = [
    "BACKENDS", "BUILTIN_MODELS", "CACHE_TYPES", "DEFAULT_MODEL", "DTYPES", "PREFILL_CHUNK", "TREE_LEAVES", "BaseTarget",
    "FeatureRecorder", "HFTarget", "TargetOutput", "builtin_gguf", "cache_root", "default_feature_layers", "gguf_path",
    "check_options", "check_tree", "identity", "load_target", "resolve_model_path",
]


def check_options(backend: str, options: dict) -> None:
    """Target settings only the llama.cpp backend has (its KV cache types) fail on transformers, in one line."""
    if options and backend != "llama.cpp":
        flags = ", ".join("--" + key.replace("_", "-") for key in options)
        verb, them = ("apply", "them") if len(options) > 1 else ("applies", "it")
        raise HyflashError(f"{flags} {verb} to the llama.cpp backend only: add --backend llama.cpp or drop {them}")


def check_tree(backend: str, budgets) -> None:
    """A tree budget the backend could not verify fails in one line before anything loads: on llama.cpp a tree
    of N nodes may have N leaves, one cache sequence each, and it has TREE_LEAVES of them."""
    if backend == "llama.cpp":
        too_big = [b for b in budgets if b > TREE_LEAVES]
        if too_big:
            raise HyflashError(f"--tree {too_big[0]} is more nodes than the llama.cpp backend's limit of "
                               f"{TREE_LEAVES} draft-tree leaves: use --tree {TREE_LEAVES} or less (or auto)")


def identity(dtype: str, target: BaseTarget | None = None) -> dict:
    """What, besides the CPU and the model, makes a measurement of a target valid (calibration's cache key):
    a loaded target's own `identity()`; with none loaded, the transformers backend's for `dtype`, which needs
    nothing loaded (versions only), so a cached curve is found without loading the model."""
    return target.identity() if target is not None else hf_identity(dtype)


def load_target(
    model: str = DEFAULT_MODEL,
    dtype: str = "bfloat16",
    backend: str = "transformers",
    feature_layers: tuple[int, ...] | None = None,
    record_features: bool = True,
    **options,
) -> BaseTarget:
    """A target for `model` (a built-in name or a local path) on `backend`.

    transformers: `dtype` is one of DTYPES; the model is a built-in name or a Hugging Face folder.
    llama.cpp: the GGUF's own quantisation runs, so `dtype` must be "auto" (or None); the model is a built-in
    name (the GGUF its package ships) or a local `PATH.gguf`.
    record_features=False (llama.cpp only; transformers records only when asked) builds a target that
    never gives features, ~9% faster for plain decoding and feature-free drafters (n-gram).
    options: the llama.cpp target's settings (cache_type_k, cache_type_v; see LlamaCppTarget).
    """
    check_options(backend, options)
    if backend == "transformers":
        return HFTarget.load(model, dtype=dtype, feature_layers=feature_layers)
    if backend == "llama.cpp":
        if dtype not in ("auto", None):
            raise HyflashError(
                f"--dtype {dtype} does not apply to the llama.cpp backend (it runs the GGUF's own "
                f"quantisation): drop --dtype or pass --dtype auto"
            )
        from hyflash.targets.llamacpp import LlamaCppTarget

        return LlamaCppTarget.load(model, feature_layers=feature_layers, record_features=record_features, **options)
    raise HyflashError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
