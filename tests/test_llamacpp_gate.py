"""The eval callback's C gate (hyflash/targets/llamacpp_gate.py): built once, atomically, into the cache; where
no compiler works, the reason is given and the target falls back to (or, asked for the gate, refuses with) the
Python callback. Its equality with the Python callback is tested on the real model in test_llamacpp_target.py."""

from __future__ import annotations

import ctypes
import os

import pytest

from conftest import import_llama_cpp
from hyflash.errors import HyflashError
from hyflash.targets import llamacpp_gate


def test_the_gate_builds_once_into_the_cache_and_answers_in_c(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path))
    if llamacpp_gate.compiler() is None:
        pytest.skip("no C compiler here")
    path, why = llamacpp_gate.build()
    assert path is not None and why == "" and path.parent == tmp_path / "llamacpp-gate"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
    stamp = path.stat().st_mtime_ns
    assert llamacpp_gate.build() == (path, "") and path.stat().st_mtime_ns == stamp  # not rebuilt
    lib = ctypes.CDLL(str(path))

    # The gate, driven directly: a fake ggml_get_name (the tensor pointer is its name) and a Python data callback.
    name_of = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda t: t)  # the "tensor" is its name's address
    seen = []
    on_data = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(
        lambda t, ask, user: seen.append((ctypes.cast(t, ctypes.c_char_p).value, ask)) or True)
    gate, address = llamacpp_gate.make_gate(lib, [b"l_out-3", b"result_norm"],
                                            ctypes.cast(name_of, ctypes.c_void_p).value, on_data)
    ask = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_char_p, ctypes.c_bool, ctypes.c_void_p)(address)
    user = ctypes.addressof(gate)
    gate.recording = 0
    assert [ask(n, True, user) for n in (b"l_out-3", b"attn_norm-0")] == [False, False] and seen == []
    gate.recording = 1
    assert [ask(n, True, user) for n in (b"l_out-3", b"l_out-30", b"result_norm", b"l_out-")] == \
        [True, False, True, False]
    assert seen == []  # questions never reach Python
    assert ask(b"l_out-3", False, user) and seen == [(b"l_out-3", False)]  # data does


def test_without_a_compiler_the_gate_says_why_and_a_target_asked_for_it_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path))
    monkeypatch.setattr(llamacpp_gate, "compiler", lambda: None)
    assert llamacpp_gate.build() == (None, "no C compiler (cc, gcc or clang; or $CC) on PATH")
    monkeypatch.setattr(llamacpp_gate, "_loaded", {})
    assert llamacpp_gate.load() == (None, "no C compiler (cc, gcc or clang; or $CC) on PATH")
    with pytest.raises(ValueError, match="at most 8 names"):
        llamacpp_gate.make_gate(None, [b"x"] * 9, 0, None)
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        return
    import_llama_cpp()
    from hyflash.targets.llamacpp import LlamaCppTarget

    with pytest.raises(HyflashError, match="C gate cannot be built: no C compiler.*eval_gate=False"):
        LlamaCppTarget.load("smollm2-135m", n_threads=1, eval_gate=True)
    fallback = LlamaCppTarget.load("smollm2-135m", n_threads=1)
    assert not fallback.eval_gate and "eval_gate" not in fallback.identity()
