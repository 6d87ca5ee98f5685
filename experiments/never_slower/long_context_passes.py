"""Pass costs at 6,144 tokens of context on transformers (SmolLM2 fp32, the never-slower suite's code prompt):
q = 1, 2, 4, 8 tokens scored on top of the prefilled cache, then rolled back; the median of 6, and the rollback.

    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.long_context_passes current

Modes: `current` (the code as it is), `trim` / `trimbig` (glibc's trim threshold set to 64 MiB / 1 GiB after
the prefill), `nomap` (no large_blocks_mapped around the prefill). docs/engine.md ("Few-query attention")
quotes it: `current` at 420fa4d (390 ms for 2 tokens), `trim` at 420fa4d (187 ms), `current` at 41f4f52 (134 ms).
"""
import ctypes
import statistics
import sys
import time
import torch
from hyflash.machine import set_torch_threads
from hyflash.targets import hf
from hyflash.targets.hf import HFTarget
from hyflash.bench.datasets import load_set
set_torch_threads()
mode = sys.argv[1]
libc = ctypes.CDLL("libc.so.6")
if mode.startswith("trim"):
    trim_bytes = {"trim": 64 << 20, "trimbig": 1 << 30}[mode]
    orig = hf.large_blocks_mapped
    from contextlib import contextmanager
    @contextmanager
    def patched(threshold=1 << 20):
        with orig(threshold):
            yield
        libc.mallopt(-1, trim_bytes)  # M_TRIM_THRESHOLD
    hf.large_blocks_mapped = patched
elif mode == "nomap":
    from contextlib import nullcontext
    hf.large_blocks_mapped = lambda threshold=1 << 20: nullcontext()
target = HFTarget.load("smollm2-135m", dtype="float32")
items = {i.item_id: i for i in load_set("never-slower", target, 3, 96)}
ids = list(items["code:hypothesis/hypothesis/extra/_array_helpers.py:6144"].ids)
target.prefill(ids, features=False)
n = target.cache_length
res = {}
for q in (1, 2, 4, 8):
    ts, rb = [], []
    for r in range(6):
        block = torch.tensor(ids[100:100 + q])
        t = time.perf_counter()
        target.score(block, features=True)
        t2 = time.perf_counter()
        target.rollback(n)
        ts.append((t2 - t) * 1000); rb.append((time.perf_counter() - t2) * 1000)
    res[q] = (round(statistics.median(ts), 1), round(statistics.median(rb), 2))
print(mode, res, flush=True)
