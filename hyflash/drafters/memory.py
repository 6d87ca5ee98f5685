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

(for linear/gated rules u = v: M = γ_C I, N = K̃ᵀ V). Every chunk's map is computed in parallel; only
S_{j+1} = M_j S_j + N_j runs in sequence (chunk by chunk, or blocked: see `chunk_scan`). Training reads the
states at chunk boundaries, which is exactly what inference holds after evicting whole chunks, so both use
this one function. All of it runs in at least float32 with autocast off: the state accumulates over the
whole prefix.
"""

from __future__ import annotations

import math

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


def unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C]. A is nilpotent, so the inverse is the finite
    series Σ (-A)^p = (I - A)(I + A²)(I + A⁴)...: log2(C) batched matmuls, cheap forwards and backwards
    (torch.linalg.solve_triangular's backward is very slow for many small matrices on CPU)."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    inverse, power, span = eye - A, A @ A, 2
    while span < A.shape[-1]:
        inverse = inverse + inverse @ power
        power, span = power @ power, 2 * span
    return inverse


def chunk_transitions(k, v, log_alpha, beta, rule: str):
    """The affine map of each chunk in low-rank form, S_C = γ_C S_0 - K̃ᵀ(W_k S_0) + N: returns (γ_C [..., 1, 1],
    K̃ᵀ [..., dk, C], W_k [..., C, dk], N [..., dk, dv]); K̃ᵀ and W_k are None for rules without the delta term.
    k [..., C, dk] and v [..., C, dv] are already mapped (key_map / value_map), log_alpha and beta [..., C]."""
    g = log_alpha.cumsum(-1)
    k_end_t = (k * torch.exp(g[..., -1:] - g)[..., None]).transpose(-1, -2)  # K̃ᵀ: keys decayed to the chunk end
    decay_all = torch.exp(g[..., -1])[..., None, None]
    if rule not in DELTA_RULES:
        return decay_all, None, None, k_end_t @ v
    C = k.shape[-2]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    decay = torch.exp((g[..., :, None] - g[..., None, :]).masked_fill(~strict, float("-inf")))
    A = beta[..., :, None] * decay * (k @ k.transpose(-1, -2))
    rhs = torch.cat([beta[..., None] * v, (beta * torch.exp(g))[..., None] * k], -1)
    W_v, W_k = (unit_lower_inverse(A) @ rhs).split([v.shape[-1], k.shape[-1]], -1)
    return decay_all, k_end_t, W_k, k_end_t @ W_v


def chunk_scan(
    k, v, gate_logits, rule: str, chunk_size: int, initial: torch.Tensor | None = None, mode: str = "auto"
) -> torch.Tensor:
    """States at every chunk boundary: k, v [..., T, d] raw (unmapped), gate_logits [..., T, 2] or None,
    T a multiple of chunk_size. Returns [..., T // chunk_size + 1, dk, dv]; index j covers tokens [0, j*C)
    (on top of `initial`, default zeros).

    mode `sequential` applies the low-rank maps chunk after chunk (fewest FLOPs, n small ops); `blocked`
    composes dense maps in groups (~2√n batched ops, ~3x the FLOPs). `auto` picks sequential with one torch
    thread or few chunks, blocked otherwise: on a busy CPU many tiny multi-threaded ops stall on the pool."""
    with torch.autocast(k.device.type, enabled=False):
        T = k.shape[-2]
        if T % chunk_size:
            raise ValueError(f"chunk_scan needs a multiple of {chunk_size} tokens, got {T}")
        n = T // chunk_size
        km, vm = key_map(k, rule), value_map(v, rule)
        log_alpha, beta = gate_values(gate_logits, rule, km[..., 0])
        state = initial if initial is not None else km.new_zeros(*km.shape[:-2], km.shape[-1], vm.shape[-1])
        state = state.to(km.dtype)
        if n == 0:
            return state[..., None, :, :]
        decay, k_end_t, W_k, N = chunk_transitions(
            *(x.unflatten(-2, (n, chunk_size)) for x in (km, vm)),
            *(x.unflatten(-1, (n, chunk_size)) for x in (log_alpha, beta)),
            rule,
        )
        if mode == "auto":
            mode = "sequential" if n <= 16 or torch.get_num_threads() == 1 or k.device.type != "cpu" else "blocked"
        if mode == "sequential":
            return _sequential_scan(decay, k_end_t, W_k, N, state)
        M = decay if W_k is None else decay * torch.eye(km.shape[-1], dtype=km.dtype, device=km.device) - k_end_t @ W_k
        return _blocked_scan(M, N, state)


def _sequential_scan(decay, k_end_t, W_k, N, state):
    # Unbind once: indexing inside the loop would cost a full-size zero tensor per step backwards.
    steps = [x.unbind(-3) if x is not None else [None] * N.shape[-3] for x in (decay, k_end_t, W_k, N)]
    states = [state]
    for g_j, kt_j, w_j, n_j in zip(*steps):
        update = g_j * states[-1] + n_j
        states.append(update if w_j is None else update - kt_j @ (w_j @ states[-1]))
    return torch.stack(states, -3)


def _apply(M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    return M * X if M.shape[-1] == 1 else M @ X


def _blocked_scan(M: torch.Tensor, N: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """All prefix states of S_{j+1} = M_j S_j + N_j: M [..., n, d, d] (or [..., n, 1, 1], a multiple of I),
    N [..., n, d, dv], initial [..., d, dv] -> [..., n + 1, d, dv]. In groups of G ≈ √n: prefix maps inside
    every group in parallel (G steps), then the groups in sequence (n / G steps)."""
    n = M.shape[-3]
    G = math.isqrt(n - 1) + 1 if n > 1 else 1
    pad = -n % G
    if pad:  # identity maps at the end
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device).expand(*M.shape[:-3], pad, -1, -1)
        M, N = torch.cat([M, eye], -3), torch.cat([N, N.new_zeros(*N.shape[:-3], pad, *N.shape[-2:])], -3)
    steps = zip(M.unflatten(-3, (-1, G)).unbind(-3), N.unflatten(-3, (-1, G)).unbind(-3))  # G x [..., n/G, ...]
    prefix_M, prefix_N = [], []  # composition of the group's first i+1 maps, for every group at once
    for M_i, N_i in steps:
        prefix_M.append(_apply(M_i, prefix_M[-1]) if prefix_M else M_i)
        prefix_N.append(_apply(M_i, prefix_N[-1]) + N_i if prefix_N else N_i)
    starts = [initial]
    for M_g, N_g in zip(prefix_M[-1].unbind(-3), prefix_N[-1].unbind(-3)):
        starts.append(_apply(M_g, starts[-1]) + N_g)
    start = torch.stack(starts[:-1], -3)[..., None, :, :]  # [..., n/G, 1, d, dv]
    within = _apply(torch.stack(prefix_M, -3), start) + torch.stack(prefix_N, -3)  # [..., n/G, G, d, dv]
    return torch.cat([initial[..., None, :, :], within.flatten(-4, -3)[..., :n, :, :]], -3)


def read(state: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """Read Sᵀq for queries q [..., L, dk] from states [..., dk, dv] -> [..., L, head_dim]."""
    with torch.autocast(q.device.type, enabled=False):
        out = key_map(q, rule) @ state
        if rule == "linear":
            out = out[..., :-1] / (out[..., -1:] + READ_EPS)
        return out
