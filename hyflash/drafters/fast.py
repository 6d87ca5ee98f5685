"""The draft step with few operations: one block, batch 1, at inference only.

Measured on the llama.cpp backend (experiments/llamacpp/draft_cost.md): right after a target pass a draft
costs about twice what back-to-back drafts cost, because the pass evicts the drafter's weights from the
caches (~0.1 ms per MB of int8 weights read back), and the general `DrafterModel.blocks_forward` runs ~560
torch operations per draft (11 Linears, RoPE rebuilt per call, views of [B, A, S, ...] shapes). `FastDraft`
computes the same function with the Linears that read one input stacked into one (q|k|v|memory gate,
gate|up, anchor|context), RoPE tables cached, one softmax over [window; block] keys, and the memory read
inline. `DrafterState` uses it for drafting (ingest keeps the general path: stacking its k|v|gate Linears
measured no faster); the general path stays the reference (tests/test_fast_draft.py holds the two equal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.drafters import memory
from hyflash.drafters.layers import rope_cos_sin


def frozen_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An inference-only Linear holding copies of `weight` [out, in] (and `bias`)."""
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None).to(weight)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out.requires_grad_(False)


def stacked_linear(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the concatenation of `linears`' outputs (same input)."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    if all(lin.bias is None for lin in linears):
        return frozen_linear(weight)
    biases = [lin.bias.detach() if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in linears]
    return frozen_linear(weight, torch.cat(biases))


class RopeTables:
    """cos/sin rows per absolute position, computed by `layers.rope_cos_sin` (as `layers.rope` does) and kept:
    a draft then reads rows instead of rebuilding them. Grows by doubling. The sin table is stored with the
    sign of `layers.rotate`'s -x2 half folded in, so that a rotation is three operations (`rotated`)."""

    def __init__(self, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device):
        self.head_dim, self.theta, self.dtype = head_dim, theta, dtype
        self.cos = self.signed_sin = torch.empty(0, head_dim, dtype=dtype, device=device)

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if end > len(self.cos):
            n = max(end, 2 * len(self.cos), 256)
            positions = torch.arange(n, device=self.cos.device)
            self.cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, self.dtype)
            half = self.head_dim // 2
            self.signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], -1)
        return self.cos[start:end, None], self.signed_sin[start:end, None]  # [L, 1, d]: broadcast over heads


def rotated(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`layers.rotate(x, cos, sin)` for `RopeTables` rows: [x1, x2] * cos + [x2, x1] * [-sin1, sin2], the same
    products and sums (the general form takes six operations: chunk, neg, cat and three arithmetic)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class FastLayer(nn.Module):
    def __init__(self, layer):
        super().__init__()
        cfg = layer.config
        self.heads, self.head_dim, self.eps = cfg.num_heads, cfg.head_dim, cfg.rms_eps
        self.rule = cfg.memory_rule if cfg.has_memory else None
        self.gated_read = layer.memory_out_gate is not None
        parts = [layer.q_proj, layer.k_proj, layer.v_proj] + ([layer.memory_out_gate] if self.gated_read else [])
        self.qkv = stacked_linear(parts)
        self.o_proj = layer.o_proj
        self.gate_up = stacked_linear([layer.mlp.gate, layer.mlp.up])
        self.down = layer.mlp.down
        self.norms = {name: getattr(layer, name).weight.detach() for name in ("attn_norm", "mlp_norm")}
        self.qk_norm = torch.cat([layer.q_norm.weight.detach().expand(self.heads, -1),
                                  layer.k_norm.weight.detach().expand(self.heads, -1)])  # [2 heads, d]

    def forward(self, x, cos, sin, ctx_k, ctx_v, state):
        """x [S, D] at positions whose table rows are cos/sin [S, 1, d]; ctx_k (rotated) / ctx_v [heads, L, d];
        state [heads, dk, dv] or None -> x [S, D]."""
        S, h, d, n = x.shape[0], self.heads, self.head_dim, self.norms
        qkv = self.qkv(F.rms_norm(x, x.shape[-1:], n["attn_norm"], self.eps))
        # q and k sit at the same positions: one norm (their weights side by side) and one rotation for both.
        qk = F.rms_norm(qkv[:, : 2 * h * d].view(S, 2 * h, d), (d,), None, self.eps) * self.qk_norm
        qk_rot = rotated(qk, cos, sin).transpose(0, 1)  # [2 heads, S, d]
        keys = torch.cat([ctx_k, qk_rot[h:]], 1)
        values = torch.cat([ctx_v, qkv[:, 2 * h * d : 3 * h * d].view(S, h, d).transpose(0, 1)], 1)
        scores = qk_rot[:h] @ keys.transpose(-1, -2) * d**-0.5
        probs = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(-1)  # as the general path
        out = probs.to(values.dtype) @ values  # [heads, S, d]
        if state is not None:
            read = memory.read(state, qk[:, :h].transpose(0, 1), self.rule).to(out.dtype)
            if self.gated_read:
                out = torch.addcmul(out, read, torch.sigmoid(qkv[:, 3 * h * d :].t())[..., None])
            else:
                out = out + read
        x = x + self.o_proj(out.transpose(0, 1).reshape(S, h * d))
        g, u = self.gate_up(F.rms_norm(x, x.shape[-1:], n["mlp_norm"], self.eps)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class FastDraft(nn.Module):
    """`DrafterModel` for one block [last token, MASK, ...] of one sequence, from a snapshot of the float
    model's weights (build it before `DrafterModel.quantize_int8`; `quantize_int8` here converts its own)."""

    def __init__(self, model):
        super().__init__()
        cfg = model.config
        self.model = [model]  # a list: not a submodule (its weights are not ours to convert twice)
        self.block_size, self.eps = cfg.block_size, cfg.rms_eps
        self.layers = nn.ModuleList(FastLayer(layer) for layer in model.layers)
        self.slot_proj = None
        if cfg.slot_inputs:  # [W_a | W_c] reads [emb; context]: one Linear for anchor_proj + context_proj
            self.slot_proj = frozen_linear(torch.cat([model.anchor_proj.weight.detach(),
                                                      model.context_proj.weight.detach()], 1))
        self.copy_proj = self.copy_length = None
        if cfg.copy_ngram:
            self.copy_proj = frozen_linear(model.copy_proj.weight.detach())
            self.copy_length = model.copy_length.weight.detach().clone()
        self.norm = model.norm.weight.detach()
        self.out_proj = model.out_proj  # None at the target's width
        self.mask_rows = model.mask_vector().detach().to(self.norm).expand(cfg.block_size - 1, -1).clone()
        p = model.norm.weight
        self.rope = RopeTables(cfg.head_dim, cfg.rope_theta, p.dtype, p.device)

    def quantize_int8(self) -> "FastDraft":
        """Dynamic int8 Linears, one scale per output row: the stacked Linears join rows of different scales."""
        import warnings

        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(self, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
        return self

    def hidden(self, state, last_token: int, copy=None) -> torch.Tensor:
        """Final hidden states [block_size - 1, H] (the head's width) of the block at position `state.length` (as
        `DrafterState.block_hidden` computes them with the general path); copy: (candidates [S-1], match
        length) for a drafter with a copy input."""
        S = self.block_size
        emb = self.model[0].embed(torch.tensor([last_token], device=self.norm.device))  # [1, H]: the target's width
        rows = self.mask_rows
        if self.copy_proj is not None:
            candidates, length = copy
            has = candidates >= 0
            if has.any():  # rows without a candidate add nothing (as `DrafterModel.copy_input` masks them)
                extra = self.copy_proj(self.model[0].embed(candidates.clamp_min(0))) + self.copy_length[length]
                rows = rows + extra * has[:, None].to(extra)
        x = torch.cat([self.model[0].anchor_slot(emb), rows])  # [S, D]: the drafter's
        if self.slot_proj is not None:
            x = x + self.slot_proj(torch.cat([emb, state.last_feature.to(emb)[None]], -1))  # [1, D]
        cos, sin = self.rope.rows(state.length, state.length + S)
        live = state.length - state.start
        # Window keys: the state's copy rotated at ingest; full keeps its keys rotated at ingest anyway.
        keys = state.rotated_keys or state.keys
        for i, layer in enumerate(self.layers):
            ctx_k = keys[i][:live]
            memory_state = state.states[i] if state.states else None
            x = layer(x, cos, sin, ctx_k.transpose(0, 1), state.values[i][:live].transpose(0, 1), memory_state)
        x = F.rms_norm(x[1:], x.shape[-1:], self.norm, self.eps)
        return x if self.out_proj is None else self.out_proj(x)
