"""Recurrent prefix memory: four update rules in one chunkwise-parallel form (plain PyTorch, no Triton).

Per head the state S is [dk, dv] and a query reads Sᵀq. Token-level rules (k, q mapped by `key_map`):

  linear       S = S + φ(k) vᵀ                      φ = elu + 1, read normalised by z = Σ φ(k)
  gated        S = α S + k vᵀ                        α in (0, 1) per head and token, k L2-normalised
  delta        S = (I - β k kᵀ) S + β k vᵀ           β in (0, 1) per head and token
  gated_delta  S = α (I - β k kᵀ) S + β k vᵀ

The linear rule's normaliser rides along as an extra value column of ones (dv + 1).

Chunk form. Over a chunk of C tokens with cumulative log decay g_t = Σ_{i<=t} log α_i, write
S_t = α_t S_{t-1} + k_t u_tᵀ. For the delta rules u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t), which unrolls to the
unit lower-triangular system (I + A) U = β V - β γ K S_0 with A[t, i] = β_t e^{g_t - g_i} k_tᵀ k_i (i < t)
and γ_t = e^{g_t}. Solving once per chunk gives U = W_v - W_k S_0, so the chunk is one affine map

  S_C = M S_0 + N,   M = γ_C I - K̃ᵀ W_k,   N = K̃ᵀ W_v,   K̃_i = e^{g_C - g_i} k_i

(for linear/gated rules u = v: M = γ_C I, N = K̃ᵀ V). Every chunk's (M, N) is computed in parallel; only
S_{j+1} = M_j S_j + N_j runs sequentially. Training reads the states at chunk boundaries, which is exactly
what inference holds after evicting whole chunks, so both use this one function. All of it runs in at least
float32 with autocast off: the state accumulates over the whole prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GATED_RULES = ("gated", "gated_delta")
DELTA_RULES = ("delta", "gated_delta")
READ_EPS = 1e-6


def _precise(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def key_map(x: torch.Tensor, rule: str) -> torch.Tensor:
    """Feature map for memory keys and queries: elu+1 for linear attention, L2 normalisation otherwise."""
    x = _precise(x)
    return F.elu(x) + 1 if rule == "linear" else F.normalize(x, dim=-1)


def value_map(v: torch.Tensor, rule: str) -> torch.Tensor:
    """Values as stored in the state: the linear rule appends a column of ones (its normaliser z)."""
    v = _precise(v)
    return torch.cat([v, torch.ones_like(v[..., :1])], -1) if rule == "linear" else v


def value_dim(head_dim: int, rule: str) -> int:
    return head_dim + 1 if rule == "linear" else head_dim


def gate_values(logits: torch.Tensor | None, rule: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log α, β) shaped like `like` [..., T] from gate logits [..., T, 2]: log α = logsigmoid(logit 0) for
    gated rules, β = sigmoid(logit 1) for delta rules; 0 and 1 where the rule has no such gate."""
    log_alpha = F.logsigmoid(_precise(logits[..., 0])) if rule in GATED_RULES else torch.zeros_like(like)
    beta = torch.sigmoid(_precise(logits[..., 1])) if rule in DELTA_RULES else torch.ones_like(like)
    return log_alpha, beta


def chunk_transitions(k, v, log_alpha, beta, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine maps (M [..., dk, dk], N [..., dk, dv]) of chunks: k [..., C, dk] and v [..., C, dv] already
    mapped (key_map / value_map), log_alpha and beta [..., C]."""
    g = log_alpha.cumsum(-1)
    k_end = k * torch.exp(g[..., -1:] - g)[..., None]  # K̃: each key decayed to the chunk's end
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    decay_all = torch.exp(g[..., -1])[..., None, None] * eye
    if rule not in DELTA_RULES:
        return decay_all, k_end.transpose(-1, -2) @ v
    C = k.shape[-2]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    decay = torch.exp((g[..., :, None] - g[..., None, :]).masked_fill(~strict, float("-inf")))
    A = beta[..., :, None] * decay * (k @ k.transpose(-1, -2))
    rhs = torch.cat([beta[..., None] * v, (beta * torch.exp(g))[..., None] * k], -1)
    W = torch.linalg.solve_triangular(A + torch.eye(C, dtype=k.dtype, device=k.device), rhs, upper=False,
                                      unitriangular=True)
    W_v, W_k = W.split([v.shape[-1], k.shape[-1]], -1)
    return decay_all - k_end.transpose(-1, -2) @ W_k, k_end.transpose(-1, -2) @ W_v


def chunk_scan(k, v, gate_logits, rule: str, chunk_size: int, initial: torch.Tensor | None = None) -> torch.Tensor:
    """States at every chunk boundary: k, v [..., T, d] raw (unmapped), gate_logits [..., T, 2] or None,
    T a multiple of chunk_size. Returns [..., T // chunk_size + 1, dk, dv]; index j covers tokens [0, j*C)
    (on top of `initial`, default zeros)."""
    with torch.autocast(k.device.type, enabled=False):
        T = k.shape[-2]
        if T % chunk_size:
            raise ValueError(f"chunk_scan needs a multiple of {chunk_size} tokens, got {T}")
        n = T // chunk_size
        km, vm = key_map(k, rule), value_map(v, rule)
        log_alpha, beta = gate_values(gate_logits, rule, km[..., 0])
        state = initial if initial is not None else km.new_zeros(*km.shape[:-2], km.shape[-1], vm.shape[-1])
        states = [state.to(km.dtype)]
        if n == 0:
            return torch.stack(states, -3)
        M, N = chunk_transitions(
            *(x.unflatten(-2, (n, chunk_size)) for x in (km, vm)),
            *(x.unflatten(-1, (n, chunk_size)) for x in (log_alpha, beta)),
            rule,
        )
        for j in range(n):
            states.append(M[..., j, :, :] @ states[-1] + N[..., j, :, :])
        return torch.stack(states, -3)


def read(state: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """Read Sᵀq for queries q [..., L, dk] from states [..., dk, dv] -> [..., L, head_dim]."""
    with torch.autocast(q.device.type, enabled=False):
        out = key_map(q, rule) @ state
        if rule == "linear":
            out = out[..., :-1] / (out[..., -1:] + READ_EPS)
        return out
