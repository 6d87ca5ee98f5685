"""The installed llama.cpp build, as the llama.cpp backend (`llamacpp.py`) and its peers load it.

What the build is (its matrix kernels, whether it has ggml's AMX backend), the parameters a model loads with
on it, the KV cache types "auto" means for a weight type on it, ggml's C API for the eval callback, and
llama-cpp-python's own `Llama` set up as the plain run hyflash's text must equal. Kept apart from the target so
that `llamacpp.py` is the Target interface and little else.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
from pathlib import Path

import torch

from hyflash.errors import HyflashError
from hyflash.targets import CACHE_TYPES

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the install
    raise HyflashError(
        "the llama.cpp backend needs llama-cpp-python: pip install llama-cpp-python==0.3.36"
    ) from exc

FLASH_ATTN = True  # the default (see LlamaCppTarget.__init__); llama.cpp peers in the bench use the same
LLAMA_CPP_CACHE = ("f16", "f16")  # llama.cpp's own default
# Weight types whose multi-token passes were measured bit-identical to one-token passes once K is q8_0, by the
# llama.cpp build's matrix products (experiments/llamacpp/kv_cache*.md). With llamafile's sgemm (stock pip
# builds) an F16 file's multi-token products round differently from its one-token ones whatever the cache,
# and there a q8_0 K only costs (up to 15% a step), so it keeps llama.cpp's default; `make venv` builds
# without llamafile, and then F16 and Q8_0 are exact too. Check another file with
# experiments/llamacpp/kv_cache.py.
EXACT_WITH_Q8_0_K = {"llamafile": frozenset({"Q4_1"}), "ggml": frozenset({"Q4_1", "Q8_0", "F16"})}
_backend_ready = False


@functools.cache  # a property of the loaded library, which a process cannot swap
def _built_with(feature: str) -> bool:
    """Whether llama.cpp's system info lists `feature` (e.g. "LLAMAFILE") as compiled in."""
    return f"{feature} = 1".encode() in llama_cpp.llama_print_system_info()


def matmul_kernels() -> str:
    """ "llamafile" when this llama.cpp build multiplies with llamafile's sgemm (llama.cpp's default build
    option GGML_LLAMAFILE, which pip's stock build keeps), else "ggml" (its own kernels only)."""
    return "llamafile" if _built_with("LLAMAFILE") else "ggml"


@functools.cache
def two_by_two_kernels() -> int:
    """The version of hyflash's patch to ggml's x86 matrix kernels in this build (0: a stock build). `make venv`
    builds llama-cpp-python with `patches/llama-cpp-python-*-ggml-x86-two-by-two.patch`: Q4_1 and Q8_0 weights
    multiply two rows by two tokens per kernel call, each output bit for bit the one-token kernel's, so a
    multi-token pass costs less and computes the same numbers (docs/engine.md, "ggml's two-by-two kernels")."""
    try:  # the library llama.cpp has loaded already (ggml_lib's folder); a stock build lacks the marker
        marker = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so")).ggml_cpu_hyflash_two_by_two
    except (OSError, AttributeError):
        return 0
    marker.restype = ctypes.c_int
    return int(marker())


def has_amx_backend() -> bool:
    """Whether this llama.cpp build has ggml's AMX backend (built natively on a CPU with AMX, as pip does)."""
    return _built_with("AMX_INT8")


def default_repack() -> bool:
    """Whether weights go into ggml's extra (repacked) CPU buffer types by default: llama.cpp's default, except
    on a build with the AMX backend: there its extra buffer types (weights repacked for AMX: Q4_0, Q4_1, Q8_0
    and K-quants) crash the first decode with a segfault (measured on a 2-core Xeon VM with AMX, 2026-12-02,
    llama-cpp-python's own `Llama` too; llama.cpp issue #20824), so weights stay in plain CPU buffers, which
    llama.cpp's AVX-512 kernels multiply."""
    return not has_amx_backend()


def model_params(default=None, repack: bool | None = None):
    """llama.cpp's default model parameters with weights repacked or not (`repack`; None: `default_repack()`).
    `default`: the function to start from (the peer passes the library's own, which it replaces while `Llama`
    loads)."""
    params = (default or llama_cpp.llama_model_default_params)()
    params.use_extra_bufts = default_repack() if repack is None else repack
    return params


@contextlib.contextmanager
def _peer_model_params(repack: bool | None = None):
    """While llama-cpp-python's `Llama` loads a model, its model parameters are `model_params(repack=repack)`'s
    (it has no argument for extra buffer types and reads the library's defaults)."""
    low_level = llama_cpp.llama_cpp
    original = low_level.llama_model_default_params
    low_level.llama_model_default_params = functools.partial(model_params, original, repack)
    try:
        yield
    finally:
        low_level.llama_model_default_params = original


def default_cache_types(precision: str, kernels: str | None = None) -> tuple[str, str]:
    """The KV cache types "auto" means for a GGUF of this weight type (`LlamaCppTarget.precision`) on a build
    with these `matmul_kernels()` (default: the installed build's)."""
    exact = EXACT_WITH_Q8_0_K[kernels or matmul_kernels()]
    return ("q8_0", "f16") if precision in exact else LLAMA_CPP_CACHE


def ggml_lib() -> ctypes.CDLL:
    """ggml's C API (ggml_get_name, ggml_nbytes, ggml_backend_tensor_get): the tensors the eval callback
    receives are ggml tensors, and llama-cpp-python binds only llama.h."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_get_name.argtypes, lib.ggml_get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    lib.ggml_nbytes.argtypes, lib.ggml_nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
    lib.ggml_nelements.argtypes, lib.ggml_nelements.restype = [ctypes.c_void_p], ctypes.c_int64
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # llama.cpp logs every load (and its errors) to stderr, through this logger: hyflash reports them itself.
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
        llama_cpp.llama_backend_init()
        _backend_ready = True


def file_fingerprint(path: Path, edge: int = 1 << 20) -> str:
    """sha256 of a file's size, first and last MiB: the header (every tensor's type and shape) and a sample of
    the weights, in milliseconds where hashing a whole GGUF takes a second."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(edge))
        f.seek(max(0, size - edge))
        digest.update(f.read(edge))
    return digest.hexdigest()[:20]


def llama_cpp_peer(path: Path, target=None, **kwargs) -> "llama_cpp.Llama":
    """llama-cpp-python's own `Llama` on `path` with the settings that decide its greedy text: the threads,
    flash attention, KV cache types and weight buffers of `target` (a LlamaCppTarget), or this backend's
    defaults (with torch's thread count) for any other target. It is the plain llama.cpp run hyflash's output
    must equal."""
    threads = getattr(target, "threads", None) or torch.get_num_threads()
    cache_k, cache_v = getattr(target, "cache_types", LLAMA_CPP_CACHE)
    settings = dict(n_threads=threads, n_threads_batch=threads, flash_attn=getattr(target, "flash_attn", FLASH_ATTN),
                    type_k=CACHE_TYPES[cache_k], type_v=CACHE_TYPES[cache_v], verbose=False)
    with _peer_model_params(getattr(target, "repack", None)):
        return llama_cpp.Llama(str(path), **(settings | kwargs))
