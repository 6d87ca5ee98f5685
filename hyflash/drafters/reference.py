"""Plain, slow reference implementations used as test oracles (in the spirit of flash-linear-attention's naive.py).

- `recurrent_states`: each memory rule token by token, written as in DESIGN.md section 3.
- `anchor_forward`: one block at a time, eviction simulated token by token, attention as an explicit softmax
  over the concatenated context and block keys.
They share only the learned pieces (projections, norms, RoPE) with the fast paths.
"""

from __future__ import annotations

import torch

from hyflash.drafters.copy import copy_candidates
from hyflash.drafters.layers import rope
from hyflash.drafters.memory import READ_EPS, gate_values, key_map, value_map


def recurrent_states(k, v, gate_logits, rule: str, initial: torch.Tensor | None = None) -> torch.Tensor:
    """k, v [..., T, d] raw; gate_logits [..., T, 2] or None -> states after every token [..., T + 1, dk, dv]."""
    km, vm = key_map(k, rule), value_map(v, rule)
    log_alpha, beta = gate_values(gate_logits, rule, km[..., 0])
    S = initial if initial is not None else km.new_zeros(*km.shape[:-2], km.shape[-1], vm.shape[-1])
    out = [S]
    for t in range(km.shape[-2]):
        kt, vt = km[..., t, :, None], vm[..., t, None, :]  # column k, row v
        a, b = log_alpha[..., t, None, None].exp(), beta[..., t, None, None]
        if rule == "linear":
            S = S + kt @ vt
        elif rule == "gated":
            S = a * S + kt @ vt
        elif rule == "delta":
            S = S - b * kt @ (kt.transpose(-1, -2) @ S) + b * kt @ vt
        elif rule == "gated_delta":
            S = a * (S - b * kt @ (kt.transpose(-1, -2) @ S)) + b * kt @ vt
        else:
            raise ValueError(rule)
        out.append(S)
    return torch.stack(out, -3)


def read_memory(S, q, rule: str) -> torch.Tensor:
    """Sᵀφ(q) per head for one query q [heads, dk] and S [heads, dk, dv]."""
    out = torch.einsum("hk,hkv->hv", key_map(q, rule), S)
    return out[:, :-1] / (out[:, -1:] + READ_EPS) if rule == "linear" else out


def window_start(config, n: int) -> int:
    """Simulate eviction token by token: the first position still in the attention window after n tokens."""
    if config.kind == "full":
        return 0
    window = 0 if config.kind == "memory" else config.window
    start = 0
    for length in range(1, n + 1):
        if length - start >= window + config.chunk_size:
            start += config.chunk_size
    return start


@torch.no_grad()
def anchor_forward(model, features: torch.Tensor, tokens: torch.Tensor, anchor: int) -> torch.Tensor:
    """One block anchored at `anchor` of one sequence (features [T, nF, H], tokens [T]) -> hidden [S-1, H] (the
    head's width; the drafter works at its own width D = hidden_size in between)."""
    cfg = model.config
    a, S, d = anchor, cfg.block_size, cfg.head_dim
    c = model.fusion(features.to(model.dtype))[:a]  # only positions before the anchor exist at draft time
    start = window_start(cfg, a)
    emb = model.embed(tokens[a])  # [H]
    narrow = cfg.has_out_proj  # narrower than the target: the embedding has no place of its own in a row
    rows = [emb.new_zeros(cfg.hidden_size) if narrow else emb] + [model.mask_vector()] * (S - 1)
    if cfg.slot_inputs:
        extra = model.anchor_proj(emb) + model.context_proj(c[a - 1])
        rows = [r + extra for r in rows]
    if cfg.copy_ngram:  # each draft slot's copy candidate: the plain suffix match over tokens[:a + 1]
        candidates, n = copy_candidates(tokens[: a + 1], S - 1, cfg.copy_ngram)
        for k, token in enumerate(candidates.tolist(), start=1):
            if token >= 0:
                rows[k] = rows[k] + model.copy_proj(model.embed(torch.tensor(token))) + model.copy_length.weight[n]
    x = torch.stack(rows)  # [S, H]
    ctx_pos = torch.arange(start, a)
    blk_pos = torch.arange(a, a + S)
    for layer in model.layers:
        k_ctx, v_ctx, gates = layer.project_context(c)  # [a, heads, d]
        hn = layer.attn_norm(x)
        q = layer.q_norm(layer._heads(layer.q_proj(hn)))  # [S, heads, d]
        k_blk = layer.k_norm(layer._heads(layer.k_proj(hn)))
        v_blk = layer._heads(layer.v_proj(hn))
        keys = torch.cat([rope(k_ctx[start:], ctx_pos, cfg.rope_theta), rope(k_blk, blk_pos, cfg.rope_theta)])
        values = torch.cat([v_ctx[start:], v_blk])
        q_rot = rope(q, blk_pos, cfg.rope_theta)
        out = torch.empty(S, cfg.num_heads, d, dtype=x.dtype)
        for h in range(cfg.num_heads):
            weights = torch.softmax((q_rot[:, h] @ keys[:, h].T) / d**0.5, -1)
            out[:, h] = weights @ values[:, h]
        if cfg.has_memory:
            g = None if gates is None else gates[:start].transpose(0, 1)
            state = recurrent_states(k_ctx[:start].transpose(0, 1), v_ctx[:start].transpose(0, 1), g,
                                     cfg.memory_rule)[:, -1]
            for s in range(S):
                read = read_memory(state, q[s], cfg.memory_rule).to(x.dtype)
                if layer.memory_out_gate is not None:
                    read = read * torch.sigmoid(layer.memory_out_gate(hn[s]))[:, None]
                out[s] = out[s] + read
        x = x + layer.o_proj(out.flatten(-2))
        x = x + layer.mlp(layer.mlp_norm(x))
    hidden = model.norm(x)[1:]
    return model.out_proj(hidden) if narrow else hidden
