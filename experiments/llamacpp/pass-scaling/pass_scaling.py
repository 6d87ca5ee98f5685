"""How a llama.cpp pass's cost grows with the tokens it scores, per weight type and weight buffer type.

Why: speculative decoding pays only if verifying q tokens costs much less than q one-token steps. On a 2-core
Intel Xeon the shipped Q4_1 file's 8-token pass cost ~4 steps (docs/results.md "Xeon"), which caps any drafter.
This asks whether another weight type (requantised from the shipped Q4_1 file by llama.cpp's own quantiser,
experiments/drafter-v2/make_f16.py) or llama.cpp's repacked weight buffers (CPU_REPACK: weights interleaved
for its GEMM kernels) change that. "extra" is llama.cpp's default, which on a build with the AMX backend
prefers AMX buffers (hyflash turns it off there: it segfaults on this VM, targets/llamacpp.py); "repack"
keeps it off but puts the block weights in CPU_REPACK buffers through tensor buffer-type overrides.

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/pass-scaling/pass_scaling.py

Each (file, mode) runs in its own process, so a crash is recorded, not fatal. Timing: q tokens scored after
256 tokens of context, logits for every position (as verification asks), 2 threads, median of 7 after 2
warm-ups. Writes pass_scaling.json and pass_scaling.md next to this file.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
QS = (1, 2, 3, 4, 6, 8)
CONTEXT = 256
MODES = ("plain", "repack", "extra")
BLOCK_WEIGHTS = rb"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight"


class _BuftOverride(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _cpu_extra_bufts(llama_cpp) -> dict[str, int]:
    """The CPU backend's extra weight buffer types by name (e.g. AMX, CPU_REPACK), through ggml's registry."""
    libdir = Path(llama_cpp.__file__).parent / "lib"
    ggml, base = ctypes.CDLL(str(libdir / "libggml.so")), ctypes.CDLL(str(libdir / "libggml-base.so"))
    ggml.ggml_backend_dev_by_type.restype, ggml.ggml_backend_dev_by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype, base.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    dev = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    address = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(dev),
                                                     b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(dev)
    out, i = {}, 0
    while bufts[i]:
        out[base.ggml_backend_buft_name(bufts[i]).decode()] = bufts[i]
        i += 1
    return out


def measure(path: str, mode: str) -> dict:
    """Median ms of a pass of q tokens, for every q in QS (runs in a child process)."""
    import llama_cpp as ll

    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.use_extra_bufts = mode == "extra"
    overrides = None
    if mode == "repack":
        overrides = (_BuftOverride * 2)(_BuftOverride(BLOCK_WEIGHTS, _cpu_extra_bufts(ll)["CPU_REPACK"]),
                                        _BuftOverride(None, None))
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    model = ll.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 1024, 512, 512
    cparams.n_threads = cparams.n_threads_batch = 2
    ctx = ll.llama_init_from_model(model, cparams)
    memory, batch = ll.llama_get_memory(ctx), ll.llama_batch_init(512, 0, 1)

    def decode(tokens: list[int], start: int, every_logit: bool) -> None:
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = every_logit or i == len(tokens) - 1
        if ll.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    decode([(7 * i + 3) % 40000 + 100 for i in range(CONTEXT)], 0, False)
    ms = {}
    for q in QS:
        times = []
        for rep in range(9):
            start = time.perf_counter()
            decode([(11 * j + rep) % 30000 + 200 for j in range(q)], CONTEXT, True)
            times.append((time.perf_counter() - start) * 1000)
            ll.llama_memory_seq_rm(memory, 0, CONTEXT, -1)
        ms[q] = statistics.median(times[2:])
    return ms


def main() -> None:
    from hyflash.machine import cpu_description
    from hyflash.targets import builtin_gguf

    folder, name = builtin_gguf("smollm2-135m")
    work = Path.home() / ".cache" / "hyflash" / "gguf"
    files = {"Q4_1": folder / name}
    for kind in ("Q4_0", "Q8_0"):
        files[kind] = work / f"smollm2-135m-{kind}.gguf"
        subprocess.run([sys.executable, "experiments/drafter-v2/make_f16.py", str(files[kind]), kind],
                       check=True, capture_output=True)
    rows = []
    for kind, path in files.items():
        for mode in MODES:
            done = subprocess.run([sys.executable, __file__, "--child", str(path), mode], capture_output=True,
                                  text=True, timeout=600)
            ms = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
            rows.append({"file": kind, "mode": mode, "returncode": done.returncode,
                         "ms": ms and {int(q): v for q, v in ms.items()}})
            print(kind, mode, done.returncode, ms, flush=True)
    cpu = cpu_description()[0]
    (HERE / "pass_scaling.json").write_text(json.dumps({"cpu": cpu, "context": CONTEXT, "rows": rows}, indent=1))
    lines = [f"Machine: {cpu}, 2 threads; q tokens after {CONTEXT} of context, every logit; median of 7.", "",
             "| file | weight buffers | 1-token pass | " + " | ".join(f"{q} tokens ÷ 1" for q in QS[1:]) + " |",
             "|---|---|---:|" + "---:|" * (len(QS) - 1)]
    for r in rows:
        if r["ms"] is None:
            crash = "segfault" if r["returncode"] in (-11, 139) else f"exit {r['returncode']}"
            lines.append(f"| {r['file']} | {r['mode']} | {crash} |" + " |" * (len(QS) - 1))
        else:
            one = r["ms"][1]
            lines.append(f"| {r['file']} | {r['mode']} | {one:.1f} ms | "
                         + " | ".join(f"{r['ms'][q] / one:.2f}" for q in QS[1:]) + " |")
    (HERE / "pass_scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], sys.argv[3])))
    else:
        main()
