"""Building blocks of the drafter: feature fusion, RoPE, and one decoder layer that reads a context.

A layer sees a draft block x [B, A, S, H] (A blocks per sequence, S = block_size slots, H the drafter's width
`hidden_size`) and, per block, a `LayerContext`: the context keys/values it may attend to (already RoPE'd at
their absolute positions, with a validity mask) and, for memory kinds, the recurrent state of the older prefix.
Attention runs over [context; block] with no causal mask inside the block; blocks never see each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.drafters import memory
from hyflash.drafters.config import DrafterConfig


def rope_cos_sin(positions: torch.Tensor, d: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., L, d] of the rotary angles at integer positions [..., L] (float64 angles, for long
    contexts), in `dtype`."""
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., L, d/2]
    return (torch.cat([angles.cos(), angles.cos()], -1).to(dtype),
            torch.cat([angles.sin(), angles.sin()], -1).to(dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., L, heads, d] rotated by cos/sin [..., L, 1, d] (broadcast over heads)."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [..., L, heads, d] at integer positions broadcastable to [..., L]."""
    cos, sin = rope_cos_sin(positions.to(x.device), x.shape[-1], theta, x.dtype)
    return rotate(x, cos[..., None, :], sin[..., None, :])


class FeatureFusion(nn.Module):
    """Target features [..., nF, H] -> context feature [..., hidden] (the drafter's width): RMSNorm per target
    layer (their scales differ by 10x and more), one Linear over the concatenation, RMSNorm."""

    def __init__(self, num_features: int, feature_size: int, hidden: int, eps: float):
        super().__init__()
        self.layer_norm_weight = nn.Parameter(torch.ones(num_features, feature_size))
        self.proj = nn.Linear(num_features * feature_size, hidden, bias=False)
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.eps = eps

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.rms_norm(features, features.shape[-1:], eps=self.eps) * self.layer_norm_weight
        return self.norm(self.proj(x.flatten(-2)))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def context_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a [B, A, heads, S, X] and b [B, A or 1, heads, X, Y] (a context shared by every block). With
    a shared b, matmul's broadcasting would copy b once per block (and its gradient too): for the full kind's
    4k-token context that is [8, 64, 9, 4096, 64] floats, 4.8 GB per product, which ran a depth-2 run out of
    24 GB. The blocks' rows are stacked into one product with b instead."""
    if b.shape[1] != 1 or a.shape[1] == 1:
        return a @ b
    B, A, h, S, X = a.shape
    out = a.transpose(1, 2).reshape(B, h, A * S, X) @ b[:, 0]  # [B, heads, A*S, Y]
    return out.unflatten(2, (A, S)).transpose(1, 2)


@dataclass
class LayerContext:
    """What one layer's blocks read besides themselves (A may be 1 and broadcast over blocks)."""

    k: torch.Tensor  # [B, A, heads, L, d] context keys, RoPE applied
    v: torch.Tensor  # [B, A, heads, L, d]
    valid: torch.Tensor | None  # [B, A, L] bool, None = every key valid
    state: torch.Tensor | None  # [B, A, heads, d, dv] memory state, None = no memory


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        H, h, d = config.hidden_size, config.num_heads, config.head_dim
        self.config = config
        self.attn_norm = nn.RMSNorm(H, eps=config.rms_eps)
        self.q_proj = nn.Linear(H, h * d, bias=False)
        self.k_proj = nn.Linear(H, h * d, bias=False)
        self.v_proj = nn.Linear(H, h * d, bias=False)
        self.o_proj = nn.Linear(h * d, H, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=config.rms_eps)
        self.k_norm = nn.RMSNorm(d, eps=config.rms_eps)
        self.mlp_norm = nn.RMSNorm(H, eps=config.rms_eps)
        self.mlp = MLP(H, config.intermediate_size)
        self.memory_gates = self.memory_out_gate = None
        if config.has_memory and config.memory_rule != "linear":
            # Per head and context token: logit of the decay α (starts near 0.993) and of the write strength β.
            self.memory_gates = nn.Linear(H, h * 2)
            with torch.no_grad():
                self.memory_gates.weight.mul_(0.1)
                self.memory_gates.bias.copy_(torch.tensor([5.0, 0.0]).repeat(h))
        if config.has_memory and config.memory_combine == "gate":
            self.memory_out_gate = nn.Linear(H, h)  # per slot and head: how much of the memory read to add

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.config.num_heads, self.config.head_dim))

    def project_context(self, c: torch.Tensor):
        """Context features c [..., L, H] -> keys (q/k-normed, no RoPE yet) and values [..., L, heads, d], and
        memory gate logits [..., L, heads, 2] (None for the linear rule or without memory)."""
        k = self.k_norm(self._heads(self.k_proj(c)))
        v = self._heads(self.v_proj(c))
        gates = None if self.memory_gates is None else self.memory_gates(c).unflatten(-1, (-1, 2))
        return k, v, gates

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """x [B, A, S, H], positions [B, A, S] absolute -> x [B, A, S, H]."""
        cfg = self.config
        hn = self.attn_norm(x)
        q = self.q_norm(self._heads(self.q_proj(hn)))
        k = self.k_norm(self._heads(self.k_proj(hn)))
        v = self._heads(self.v_proj(hn)).transpose(-2, -3)
        q_rot = rope(q, positions, cfg.rope_theta).transpose(-2, -3)  # [B, A, heads, S, d]
        k_rot = rope(k, positions, cfg.rope_theta).transpose(-2, -3)
        scale = cfg.head_dim**-0.5
        ctx_scores = context_matmul(q_rot, ctx.k.transpose(-1, -2)) * scale  # [B, A, heads, S, L]
        if ctx.valid is not None:
            ctx_scores = ctx_scores.masked_fill(~ctx.valid[:, :, None, None, :], float("-inf"))
        scores = torch.cat([ctx_scores, (q_rot @ k_rot.transpose(-1, -2)) * scale], -1)
        probs = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(-1).to(v.dtype)
        L = ctx.k.shape[-2]
        out = context_matmul(probs[..., :L], ctx.v) + probs[..., L:] @ v
        if ctx.state is not None:
            read = memory.read(ctx.state, q.transpose(-2, -3), cfg.memory_rule).to(out.dtype)
            if self.memory_out_gate is not None:
                read = read * torch.sigmoid(self.memory_out_gate(hn)).transpose(-1, -2)[..., None]
            out = out + read
        x = x + self.o_proj(out.transpose(-2, -3).flatten(-2))
        return x + self.mlp(self.mlp_norm(x))
