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
inputs with few rows: how many count as few depends on the layer's shape (`FewRowsConfig`), since for the
smaller layers torch's kernel wins again from 12 rows on here. bf16 keeps torch's kernel: oneDNN's bf16
path was as fast or faster at every row count measured.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

KERNEL = "few-rows-transposed"  # names the kernel in the calibration key (HFTarget.identity)

_in_verify_pass: ContextVar[bool] = ContextVar("hyflash_verify_pass", default=False)


@dataclass(frozen=True)
class FewRowsConfig:
    """Which row counts take W @ x^T (measured on an AMD EPYC Zen 4, 2 threads, fp32; see the module doc)."""

    head_rows: int = 16  # output heads (out_features >= head_ratio x in_features): faster at 2-16 rows
    layer_rows: int = 8  # the other linears: faster at 2-8 rows in a whole pass (their weights cold), not at 12-16
    head_ratio: int = 8


class FewRowsLinear(torch.nn.Linear):
    """An nn.Linear whose forward takes W @ x^T inside a verify pass for few rows; F.linear otherwise. Swapped in
    by class (`use_for`), so the weights, their tying and the state dict stay as they are."""

    few_rows_config = FewRowsConfig()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _in_verify_pass.get() and x.dim() == 3 and x.shape[0] == 1 and 2 <= x.shape[1] <= self._max_rows():
            out = (self.weight @ x[0].t()).t().contiguous().unsqueeze(0)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)

    def _max_rows(self) -> int:
        config = self.few_rows_config
        return config.head_rows if self.out_features >= config.head_ratio * self.in_features else config.layer_rows


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
    quantised ones); other models keep theirs. True if swapped."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = FewRowsLinear
    return True
