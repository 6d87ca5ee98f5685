"""Linear layers for verify passes on CPU in float32: W @ x^T instead of x @ W^T for a few rows.

A verify pass runs 2-16 token positions through every linear layer. torch hands x @ W^T with a few rows of x to
MKL's sgemm, which on an AMD EPYC (Zen 4, 2 threads) costs about as much per row as the one-row product:
SmolLM2's output head (49,152 x 576) took 8.7 ms for 1 row, 19 ms for 2 and 28 ms for 3. The same product
computed as W @ x^T (the rows as the narrow side of the product) took 2.9 ms for 2 rows and 4.0 ms for 3. Over
the whole model at 256 tokens of context a 2-token pass went from 1.62 one-token steps to 0.55, a 4-token one
from 1.51 to 0.73 (`experiments/never_slower/few-query-linear/`): the margin speculative decoding works with on
a 2-core CPU. (The output is made contiguous: attention kernels given the transposed view took a slow path.)

Lossless: one-token steps, prefills and anything batched keep torch's own kernel bit for bit, so plain decoding
is unchanged; a verify pass's logits differ from the stock kernel's in the last bits (up to 5.5e-5 on SmolLM2's
logits), as stock multi-row passes already differ from one-token steps. The calibration key names the kernel
(`KERNEL`), so curves measured without it are re-measured.

Applied only inside `verify_passes()` (HFTarget.score), only to float32 linears on the CPU, only for batch-1
inputs with few rows. How many count as few is measured on the machine, per layer shape (`measured_rows`, cached
per CPU): on the Zen 4 the smaller layers lose again from 12 rows, and on an Intel Xeon (AMX, 2 cores, MKL) the
output head took 24 ms at 2 rows this way against torch's 8 ms, so a 2-token pass cost 2.2 one-token steps with
the kernel where the fixed limits applied it everywhere (`FewRowsConfig`, the Zen 4's measured limits, is the
reference the tests use). bf16 keeps torch's kernel: oneDNN's bf16 path was as fast or faster at every row count
measured.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hyflash.files import atomic_write_json
from hyflash.machine import cpu_description
from hyflash.targets.base import cache_root

# Names the kernel in the calibration key (HFTarget.identity); "measured": its row limits are this machine's.
KERNEL = "few-rows-transposed-measured"
MAX_ROWS = 16  # the longest verify pass it is tried for

_in_verify_pass: ContextVar[bool] = ContextVar("hyflash_verify_pass", default=False)


@dataclass(frozen=True)
class FewRowsConfig:
    """Which row counts take W @ x^T (measured on an AMD EPYC Zen 4, 2 threads, fp32; see the module doc)."""

    head_rows: int = 16  # output heads (out_features >= head_ratio x in_features): faster at 2-16 rows
    layer_rows: int = 8  # the other linears: faster at 2-8 rows in a whole pass (their weights cold), not at 12-16
    head_ratio: int = 8


class FewRowsLinear(torch.nn.Linear):
    """An nn.Linear whose forward takes W @ x^T inside a verify pass for few rows; F.linear otherwise. Swapped in
    by class (`use_for`), so the weights, their tying and the state dict stay as they are. `max_rows` (set by
    use_for, per layer shape) bounds the rows; unset, the reference limits of `FewRowsConfig`."""

    few_rows_config = FewRowsConfig()
    max_rows: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _in_verify_pass.get() and x.dim() == 3 and x.shape[0] == 1 and 2 <= x.shape[1] <= self._max_rows():
            out = _kernel(x, self.weight).unsqueeze(0)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)

    def _max_rows(self) -> int:
        if self.max_rows is not None:
            return self.max_rows
        config = self.few_rows_config
        return config.head_rows if self.out_features >= config.head_ratio * self.in_features else config.layer_rows


def _kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [1, rows, in] times W^T, computed as W @ x^T: [rows, out], no bias, contiguous (see the module doc)."""
    return (weight @ x[0].t()).t().contiguous()


def measure_rows(weights: list[torch.Tensor], repeats: int = 5, clock=time.perf_counter) -> int:
    """The most rows (up to MAX_ROWS) for which W @ x^T beats torch's kernel at every count from 2 on, each
    timed over all `weights` of one shape in turn (as cold in the caches as a pass leaves them), the two kernels
    alternated, the fastest of `repeats` rounds each. 1: never."""
    torch.manual_seed(0)
    for rows in range(2, MAX_ROWS + 1):
        x = torch.randn(1, rows, weights[0].shape[1])
        best = {F.linear: float("inf"), _kernel: float("inf")}
        for _ in range(repeats + 1):  # the first round warms up
            for fn in best:
                start = clock()
                for w in weights:
                    fn(x, w)
                best[fn] = min(best[fn], clock() - start)
        if best[_kernel] >= best[F.linear]:
            return rows - 1
    return MAX_ROWS


def measured_rows(model) -> dict[tuple[int, int], int]:
    """measure_rows per layer shape of `model`'s swapped linears, cached per CPU, torch version and thread count
    (`cache_root()/few-rows/`): ~1-3 s once for SmolLM2-135M."""
    shapes: dict[tuple[int, int], list[torch.Tensor]] = {}
    for module in model.modules():
        if type(module) is FewRowsLinear:
            shapes.setdefault(tuple(module.weight.shape), []).append(module.weight.detach())
    cpu, flags = cpu_description()
    key = {"cpu": cpu, "flags": flags, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "shapes": sorted(shapes)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "few-rows" / f"{digest}.json"
    if path.exists():
        return {tuple(map(int, k.split("x"))): v for k, v in json.loads(path.read_text())["rows"].items()}
    with torch.inference_mode():
        rows = {shape: measure_rows(weights) for shape, weights in shapes.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, dict(key, shapes=[list(s) for s in sorted(shapes)],
                                 rows={f"{o}x{i}": r for (o, i), r in rows.items()}))
    return rows


def reference_linear(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """What torch's own nn.Linear computes: the reference FewRowsLinear is held to (tests/test_linear.py)."""
    return F.linear(x, linear.weight, linear.bias)


@contextmanager
def verify_passes():
    """Within the block, linears swapped by `use_for` may take the few-rows kernel."""
    token = _in_verify_pass.set(True)
    try:
        yield
    finally:
        _in_verify_pass.reset(token)


def use_for(model) -> bool:
    """Swap a float32 CPU model's nn.Linear layers to FewRowsLinear (exactly nn.Linear, not subclasses such as
    quantised ones), with the row limits measured here per layer shape (`measured_rows`); other models keep
    theirs. True if swapped."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = FewRowsLinear
    rows = measured_rows(model)
    for module in model.modules():
        if type(module) is FewRowsLinear:
            module.max_rows = rows[tuple(module.weight.shape)]
    return True
