"""The eval callback's gate in C: llama.cpp asks a context's eval callback about every graph node of every pass
(~1,100 on SmolLM2-135M); through Python that is ~9% of a plain step, paid even when nothing is recorded.
`llamacpp_gate.c` answers those questions in C and calls the Python callback only with a wanted node's data.

It is compiled once per source and machine with the C compiler that built llama-cpp-python (`make venv`
builds it from source), into the hyflash cache, atomically. Where no compiler works, the target keeps the
plain Python callback (`LlamaCppTarget(eval_gate=False)`, the reference the tests hold the gate equal to).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from hyflash.targets.base import cache_root

SOURCE = Path(__file__).with_name("llamacpp_gate.c")
NAMES = 8  # GATE_NAMES in the C source
NAME_BYTES = 64  # GATE_NAME_BYTES, ggml's GGML_MAX_NAME


class Gate(ctypes.Structure):
    """struct hyflash_gate: which nodes are wanted, and whether the target is recording now."""

    _fields_ = [("recording", ctypes.c_int), ("n_names", ctypes.c_int),
                ("names", (ctypes.c_char * NAME_BYTES) * NAMES), ("get_name", ctypes.c_void_p),
                ("on_data", ctypes.c_void_p), ("on_data_user", ctypes.c_void_p)]


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def library_path() -> Path:
    """Where this source's build for this machine lives: a new source or machine gets a new file."""
    digest = hashlib.sha256(SOURCE.read_bytes() + platform.machine().encode()).hexdigest()[:16]
    return cache_root() / "llamacpp-gate" / f"gate-{digest}.so"


def build() -> tuple[Path | None, str]:
    """The compiled gate (built now if needed) and "" or, where it cannot be built, None and why."""
    out = library_path()
    if out.is_file():
        return out, ""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang; or $CC) on PATH"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
    except OSError as exc:
        return None, f"cannot write the gate into {out.parent}: {exc}"
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            return None, f"{cc} failed: {done.stderr.strip()[:300]}"
        os.replace(tmp, out)  # atomic: another process loading the gate sees the whole file or none
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{cc} failed: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, ""


_loaded: dict[str, object] = {}


def load() -> tuple[ctypes.CDLL | None, str]:
    """The gate's library, loaded once per process, or None and why not."""
    if "lib" not in _loaded:
        path, why = build()
        lib = None
        if path is not None:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                why = f"the compiled gate {path} does not load: {exc}"
        _loaded["lib"], _loaded["why"] = lib, why
    return _loaded["lib"], _loaded["why"]  # type: ignore[return-value]


def make_gate(lib: ctypes.CDLL, names: list[bytes], get_name_address: int, on_data) -> tuple[Gate, int]:
    """A gate wanting the nodes `names`, calling `on_data` (a ggml_backend_sched_eval_callback) with their data;
    and the address of the C callback to put in llama_context_params.cb_eval, with the gate as its user data.
    Keep the returned Gate (and on_data) alive as long as any context uses them."""
    if len(names) > NAMES or any(len(n) >= NAME_BYTES for n in names):
        raise ValueError(f"the gate holds at most {NAMES} names of under {NAME_BYTES} bytes: {names}")
    gate = Gate()
    gate.n_names = len(names)
    for i, name in enumerate(names):
        gate.names[i].value = name
    gate.get_name = get_name_address
    gate.on_data = ctypes.cast(on_data, ctypes.c_void_p).value
    return gate, ctypes.cast(lib.hyflash_gate_eval, ctypes.c_void_p).value
