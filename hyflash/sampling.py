"""Sampling settings, logit warping and the exact speculative rejection rule.

Everything here works on float32 probabilities. The rejection rule is the textbook one (Leviathan et al.,
Chen et al.): accept draft token d with probability min(1, p(d)/q(d)); on rejection sample from
normalise(max(p - q, 0)); if every draft is accepted, sample a bonus token from p. With this rule the output
distribution equals the target's, whatever the drafter proposes, provided q is the distribution the draft
token was actually drawn from (a deterministic drafter has a one-hot q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyflash.errors import HyflashError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise HyflashError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise HyflashError(f"top-p must be in (0, 1], got {self.top_p}; use 1 to disable it")
        if self.top_k < 0:
            raise HyflashError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` (first maximum, NaN counting as the maximum). On the CPU through NumPy: torch's CPU
    argmax is not vectorised. One row of a 49k vocabulary: 32 us in float32 and 167 us in bfloat16 against
    4 us (8 us with the exact upcast to float32); 8 rows: 245 us and 1.3 ms against 24 and 49 us. It runs on
    every target pass and every draft."""
    if x.device.type != "cpu" or not x.is_floating_point():
        return x.argmax(-1)
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # exact: the same maxima in the same places
    return torch.as_tensor(x.detach().numpy().argmax(-1), dtype=torch.long)


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Warp logits [..., V] by temperature, top-k and top-p; return float32 probabilities.

    Greedy settings give a one-hot distribution on the argmax, so greedy is the limit of sampling and the
    same verification code can serve both.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        logits = logits.masked_fill(top_p_drop(logits, sampling.top_p), float("-inf"))
    return logits.softmax(-1)


def top_p_drop_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids top-p drops ([..., V] bool), by the definition: sort the whole vocabulary and drop an id when the
    mass strictly before it already reaches top_p (the top id always stays)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    return drop_sorted.scatter(-1, order, drop_sorted)


def top_p_drop(logits: torch.Tensor, top_p: float, first: int = 256) -> torch.Tensor:
    """top_p_drop_reference without sorting the whole vocabulary: the nucleus is sought among the `first`
    largest logits (torch.topk), eight times as many until they hold top_p of the mass (then every id after them
    is dropped too). The sort took 6 ms a row over Qwen's 151,936 ids on 2 Zen 4 cores, 0.4 s a step of 64
    sequences, more than the llama.cpp pass; this takes ~0.4 ms. Equal to the reference but where rounding puts
    the mass before an id within ~1e-7 of top_p (the two normalise in different orders), or ties straddle it
    (tests/test_sampling.py)."""
    vocab = logits.shape[-1]
    log_total = torch.logsumexp(logits, dim=-1, keepdim=True)
    k = min(first, vocab)
    while True:
        values, ids = torch.topk(logits, k, dim=-1)  # descending
        probs = (values - log_total).exp()
        mass = probs.cumsum(-1)
        if k == vocab or bool((mass[..., -1] >= top_p).all()):
            break
        k = min(8 * k, vocab)
    drop = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    return drop.scatter(-1, ids, (mass - probs) >= top_p)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of probs [..., V] (argmax when the row is one-hot), by inverting the CDF at one
    uniform draw. An exact sampler like torch.multinomial (`sample_reference`), which takes 4.5 ms a row over
    Qwen's 151,936 ids on these CPUs (13% of a 35 ms llama.cpp step); this takes ~0.2 ms. A zero-probability id
    is never drawn: its CDF step is empty, and the clamp keeps u = total on the last id with mass."""
    flat = probs.reshape(-1, probs.shape[-1]).double()
    cdf = flat.cumsum(-1)
    total = cdf[:, -1:].contiguous()
    u = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=flat.device) * total
    out = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    last = torch.searchsorted(cdf, total).squeeze(-1)  # the first id where the CDF reaches its total has mass
    return torch.minimum(out, last).reshape(probs.shape[:-1])


def sample_reference(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The plain sampler `sample` replaces: torch.multinomial (tests hold the two to the same distribution)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).squeeze(-1).reshape(probs.shape[:-1])


def verify_block(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Decide how many of k draft tokens to keep and which token comes next.

    target_probs: [k+1, V] warped target distributions at the k draft slots plus the bonus slot (greedy reads
    only their argmax, so the target's raw logits serve as well).
    draft_tokens: [k]; draft_probs: [k, V] distributions the drafts were drawn from, or None when the drafter
    is deterministic (one-hot q). Returns (number accepted, the correction or bonus token).
    """
    k = draft_tokens.shape[0]
    devices = {t.device for t in (target_probs, draft_tokens, draft_probs) if t is not None}
    if generator is not None:
        devices.add(generator.device)
    if len(devices) > 1:  # caught here, not deep inside torch, and on CPU-only machines too
        raise ValueError(f"verify_block got tensors on several devices ({', '.join(map(str, devices))}): "
                         "move drafts to the target's device first")
    if sampling.greedy:
        best = argmax(target_probs)
        n = 0
        while n < k and int(draft_tokens[n]) == int(best[n]):
            n += 1
        return n, int(best[n])
    for i in range(k):
        d = int(draft_tokens[i])
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            draft_tokens[i], p.shape[-1]
        ).float()
        ratio = p[d] / q[d] if q[d] > 0 else p.new_zeros(())
        u = torch.rand((), generator=generator, device=p.device)
        if u < ratio:
            continue
        residual = (p - q).clamp_min(0)
        total = residual.sum()
        # total is 0 only when p == q, where a rejection has probability 0; guard against float dust.
        residual = residual / total if total > 0 else p
        return i, int(sample(residual, generator))
    return k, int(sample(target_probs[k], generator))
