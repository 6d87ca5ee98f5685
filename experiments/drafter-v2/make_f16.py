"""An F16 GGUF of the shipped SmolLM2 Q4_1 file (the same weights, dequantised: what the transformers target
runs), for the llama.cpp F16 rows of the bench. llama.cpp's own quantiser does it (allow_requantize).
TYPE (default F16) names another llama.cpp file type, e.g. Q8_0 (requantised from the Q4_1 weights).

usage: .venv/bin/python experiments/drafter-v2/make_f16.py OUT.gguf [TYPE]
"""

import ctypes
import os
import sys

import llama_cpp

from hyflash.targets import builtin_gguf

folder, name = builtin_gguf("smollm2-135m")
out = sys.argv[1]
if not os.path.exists(out):
    params = llama_cpp.llama_model_quantize_default_params()
    file_type = sys.argv[2] if len(sys.argv) > 2 else "F16"
    known = sorted(n.removeprefix("LLAMA_FTYPE_MOSTLY_") for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_"))
    if file_type not in known:
        sys.exit(f"unknown llama.cpp file type {file_type!r}: use one of {', '.join(known)}")
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.allow_requantize = True
    tmp = out + ".tmp"
    if llama_cpp.llama_model_quantize(str(folder / name).encode(), tmp.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama.cpp could not convert {folder / name} to {file_type}")
    os.replace(tmp, out)
print(out)
