"""Acceptance-aware on-policy drafter training with REOPOLD credit.

For a draft token d sampled at block slot k, the target accepts it with probability min(1, exp(R_k)) where
    R_k = log p_target(d | prefix, d_<k) - log q_drafter(d)          (both warped by the decoding temperature)
which is exactly REOPOLD's token reward. Slot k only matters if the block survives up to it, so its credit is
weighted by the survival probability prod_{j<k} min(1, exp(R_j)) (detached). The loss is REOPOLD's policy
gradient on the drafter's own samples:
    -sum M * survival * Rhat * log q(d) / sum M
with Rhat = max(R, floor) and M the entropy / phase mask of `hyflash.credit` (the same rules the
distillation trainer uses). It is mixed with the cross-entropy objective by the trainer.

`objective="acceptance"` is the exact, sample-free alternative: the scoring pass yields the target's whole
distribution p_k at every slot (given the sampled drafts before it), so the acceptance probability of slot k,
    alpha_k = sum_v min(p_k(v), q_k(v))                                (= 1 - total variation)
is a differentiable function of the drafter's q_k; the term is -sum reach_k * alpha_k over slots, with
reach_k = prod_{j<k} min(1, p_j(d_j) / q_j(d_j)) the chance that this sample's own drafts d_<k were accepted
(detached). p_k is conditioned on those drafts, so sum_k reach_k * alpha_k is an unbiased estimate of the
expected accepted length; weighting by prod_{j<k} alpha_j instead would average over drafts the sampled prefix
did not take. The gradient of alpha_k, sum over v with q_k(v) < p_k(v) of grad q_k(v), is the expectation
REOPOLD's estimator samples with reward 1[R > 0] — computed exactly instead of from one sample per slot.

The target scores every sampled block of a sequence in ONE forward pass: the blocks' draft tokens are appended
after the sequence, each at its own absolute positions, with a 4-D attention mask so that block i sees the
sequence up to its anchor and its own earlier drafts only (`scoring_mask`). `reference_draft_logprobs` is the
plain one-block-at-a-time oracle that tests hold it equal to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hyflash.credit import CreditConfig, reopold_credit, reward_quantiles


@dataclass(frozen=True)
class OnPolicyConfig:
    weight: float = 0.0  # loss = cross-entropy + weight * on-policy term; 0 turns the mode off
    temperature: float = 1.0  # the decoding temperature whose acceptance is optimised
    credit: CreditConfig = field(default_factory=CreditConfig)
    survival: bool = True  # weight slot k by the chance that slots < k were accepted
    objective: str = "reopold"  # reopold: sampled policy gradient with REOPOLD credit | acceptance: exact alpha_k


def sample_drafts(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """Sample one draft token per slot, as the parallel drafter does at decode time.

    logits [b, A, S, Vd] -> (draft indices [b, A, S], log q of them (differentiable), student entropy (detached)).
    The generator must live on the logits' device (torch would not say so on every device pair).
    """
    if generator is not None and generator.device != logits.device:
        raise ValueError(f"the sampling generator is on {generator.device} but the logits on {logits.device}: "
                         "make it with torch.Generator(device=logits.device)")
    log_q_all = F.log_softmax(logits.float() / temperature, dim=-1)
    with torch.no_grad():
        probs = log_q_all.exp()
        flat = probs.reshape(-1, probs.shape[-1])
        picks = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
        entropy = -(probs * log_q_all).sum(-1)
    log_q = log_q_all.gather(-1, picks[..., None]).squeeze(-1)
    return picks, log_q, entropy


def scoring_mask(seq_len: int, anchors: torch.Tensor, drafts_per_block: int, sliding_window: int | None = None):
    """Boolean mask [b, 1, Q, Q] (True = may attend) for the sequence followed by every block's drafts.

    Query/key layout: seq_len sequence tokens, then for anchor i the drafts d_1..d_m at positions a_i+1..a_i+m.
    Sequence tokens are causal among themselves; draft j of block i sees sequence positions <= a_i and drafts
    1..j of its own block. A sliding window (Gemma-style layers) also bounds the distance in positions.
    """
    num_anchors, m = anchors.shape[1], drafts_per_block
    pos = positions_for(seq_len, anchors, m)  # [b, Q]
    # The last sequence position each query may read: itself for sequence tokens, the anchor for drafts.
    last_seq = torch.cat([pos[:, :seq_len], anchors.repeat_interleave(m, dim=1)], dim=1)
    block = torch.cat(
        [torch.full((seq_len,), -1, dtype=torch.long), torch.arange(num_anchors).repeat_interleave(m)]
    ).to(anchors.device)
    q_blk, k_blk = block[None, :, None], block[None, None, :]
    q_pos, k_pos = pos[:, :, None], pos[:, None, :]
    mask = (k_blk < 0) & (k_pos <= last_seq[:, :, None])
    mask |= (k_blk == q_blk) & (q_blk >= 0) & (k_pos <= q_pos)
    if sliding_window is not None:
        mask &= (q_pos - k_pos) < sliding_window
    return mask[:, None]


def positions_for(seq_len: int, anchors: torch.Tensor, m: int) -> torch.Tensor:
    """Absolute positions [b, seq_len + A*m]: 0..seq_len-1, then a_i + 1..a_i + m for each block."""
    b = anchors.shape[0]
    seq = torch.arange(seq_len, device=anchors.device).expand(b, -1)
    drafts = (anchors[:, :, None] + torch.arange(1, m + 1, device=anchors.device)).reshape(b, -1)
    return torch.cat([seq, drafts], dim=1)


def _layer_masks(model, mask: torch.Tensor, seq_len: int, anchors: torch.Tensor, m: int):
    """A per-layer-type mask dict for models that mix sliding and full attention (e.g. Gemma-3)."""
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    if "sliding_attention" not in layer_types:
        return mask
    sliding = scoring_mask(seq_len, anchors, m, sliding_window=config.sliding_window).to(mask.device)
    return {"full_attention": mask, "sliding_attention": sliding}


@torch.no_grad()
def target_draft_logprobs(target, tokens: torch.Tensor, anchors: torch.Tensor, drafts: torch.Tensor, temperature: float):
    """log p_target(d_k | tokens[:a+1], d_<k) for drafts [b, A, S] (target ids), in one pass per sequence, on
    the target's device (tokens and anchors may stay on the CPU, where batches are built)."""
    return torch.stack([
        per_slot.gather(-1, drafts[row, :, :, None].to(per_slot.device)).squeeze(-1)
        for row, per_slot in enumerate(_target_slot_logprobs(target, tokens, anchors, drafts, temperature))
    ])


@torch.no_grad()
def target_slot_probs(target, tokens, anchors, drafts, temperature: float, vocab_ids: torch.Tensor) -> torch.Tensor:
    """p_target(v | tokens[:a+1], d_<k) for v in vocab_ids (the draft vocabulary): [b, A, S, len(vocab_ids)],
    on the target's device."""
    return torch.stack([
        per_slot[..., vocab_ids.to(per_slot.device)].exp()
        for per_slot in _target_slot_logprobs(target, tokens, anchors, drafts, temperature)
    ])


def _target_slot_logprobs(target, tokens, anchors, drafts, temperature: float):
    """Yields, per sequence, the target's log-probabilities [A, S, V] at every slot of every block."""
    b, num_anchors, slots = drafts.shape
    m = slots - 1  # the last draft's own logits would score a token beyond the block
    device = target.device
    anchors = anchors.cpu()  # positions: read as Python numbers, and small
    for row in range(b):  # one row at a time keeps the [Q, V] logits small
        a = anchors[row : row + 1]
        seq_len = int(a.max()) + 1  # nothing after the last anchor is ever visible to a block
        ids = torch.cat([tokens[row, :seq_len].to(device), drafts[row, :, :m].reshape(-1).to(device)])[None]
        mask = scoring_mask(seq_len, a, m).to(device)
        logits = target.model(
            input_ids=ids,
            position_ids=positions_for(seq_len, a, m).to(device),
            attention_mask=_layer_masks(target.model, mask, seq_len, a, m),
            use_cache=False,
        ).logits[0].float()
        # slot 1 is predicted at the anchor itself; slot k > 1 at draft k-1 of the same block
        first = logits[a[0].to(device)]  # [A, V]
        rest = logits[seq_len:].view(num_anchors, m, -1)  # [A, m, V]
        yield F.log_softmax(torch.cat([first[:, None], rest], dim=1) / temperature, dim=-1)


@torch.no_grad()
def reference_draft_logprobs(target, tokens, anchors, drafts, temperature: float) -> torch.Tensor:
    """Plain oracle: score each block on its own, tokens[:a+1] + drafts, with the ordinary causal mask."""
    b, num_anchors, slots = drafts.shape
    out = torch.empty(b, num_anchors, slots)
    for row in range(b):
        for i in range(num_anchors):
            a = int(anchors[row, i])
            ids = torch.cat([tokens[row, : a + 1], drafts[row, i, : slots - 1]])[None].to(target.device)
            logits = target.model(input_ids=ids, use_cache=False).logits[0, a:].float() / temperature
            out[row, i] = F.log_softmax(logits, -1).gather(-1, drafts[row, i, :, None].to(logits.device)).squeeze(-1).cpu()
    return out


def acceptance(reward: torch.Tensor) -> torch.Tensor:
    """min(1, exp(R)): the probability that speculative sampling accepts a draft token with reward R."""
    return reward.clamp(max=0).exp()


def survival_weights(reward: torch.Tensor) -> torch.Tensor:
    """prod_{j<k} min(1, exp(R_j)) along the last dim: the chance a block reaches slot k (slot 1: 1)."""
    return reach_probability(acceptance(reward))


def reach_probability(accept: torch.Tensor) -> torch.Tensor:
    """prod_{j<k} accept_j along the last dim, from per-slot acceptance probabilities (slot 1: 1)."""
    return torch.cumprod(torch.cat([torch.ones_like(accept[..., :1]), accept[..., :-1]], dim=-1), dim=-1)


def onpolicy_loss(
    logits: torch.Tensor,
    valid: torch.Tensor,
    batch_tokens: torch.Tensor,
    anchors: torch.Tensor,
    to_target_ids,
    target,
    step: int,
    config: OnPolicyConfig,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict]:
    """The on-policy term for drafter logits [b, A, S, Vd] over slots whose labels exist (`valid` [b, A, S])."""
    picks, log_q, entropy = sample_drafts(logits, config.temperature, generator)
    drafts = to_target_ids(picks)
    if config.objective == "acceptance":
        vocab_ids = to_target_ids(torch.arange(logits.shape[-1], device=picks.device))
        p = target_slot_probs(target, batch_tokens, anchors, drafts, config.temperature, vocab_ids)
        return _acceptance_loss(logits, valid, picks, p, config)
    log_p = target_draft_logprobs(target, batch_tokens, anchors, drafts, config.temperature)
    reward = log_p.to(log_q.device) - log_q.detach()
    valid = valid.to(log_q.device)
    credit = reopold_credit(reward, entropy, valid, step, config.credit)
    weight = credit.mask.float()
    if config.survival:
        weight = weight * survival_weights(reward)
    loss = -(weight * credit.advantage * log_q).sum() / credit.mask.sum().clamp_min(1)
    accept_prob = acceptance(reward)
    accept = (accept_prob * valid).sum((0, 1)) / valid.sum((0, 1)).clamp_min(1)
    stats = {
        **credit.stats,
        **reward_quantiles(reward, valid),
        "sampled_accept_by_slot": [round(float(x), 4) for x in accept],
        "sampled_expected_tau": _expected_tau(accept_prob, valid),
        "student_entropy": float(entropy[valid].mean()) if valid.any() else float("nan"),
    }
    return loss, stats


def _expected_tau(accept_prob: torch.Tensor, valid: torch.Tensor) -> float:
    """Expected tokens per pass, 1 + sum_k P(slots 1..k all accepted), over blocks whose slots all have labels."""
    reach = torch.cumprod(accept_prob, dim=-1)
    full_blocks = valid.all(-1)
    return 1 + float(reach.sum(-1)[full_blocks].mean()) if full_blocks.any() else float("nan")


def exact_acceptance(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """sum_v min(p(v), q(v)) over the last dim: the chance that speculative sampling accepts a draft from q."""
    return torch.minimum(p, q).sum(-1)


def _acceptance_loss(logits, valid, picks, p, config: OnPolicyConfig):
    """-sum_k reach_k * alpha_k / #slots: alpha_k exact given the sampled drafts d_<k (p [b, A, S, Vd] is the
    target's distribution after them), reach_k = prod_{j<k} min(1, p_j(d_j) / q_j(d_j)) the chance that this
    sample's drafts d_<k were all accepted (detached), as REOPOLD's survival weights."""
    q = F.softmax(logits.float() / config.temperature, dim=-1)
    p = p.to(q.device)
    alpha = exact_acceptance(q, p)  # [b, A, S]
    valid = valid.to(alpha.device)
    picks = picks.to(q.device)[..., None]
    reward = (p.gather(-1, picks).log() - q.detach().gather(-1, picks).log()).squeeze(-1)  # log p(d) / q(d)
    reach = reach_probability(acceptance(reward))
    weight = valid.float() * reach if config.survival else valid.float()
    loss = -(weight * alpha).sum() / valid.sum().clamp_min(1)
    accept = (alpha.detach() * valid).sum((0, 1)) / valid.sum((0, 1)).clamp_min(1)
    full_blocks = valid.all(-1)  # expected accepted drafts: sum_k P(slots 1..k accepted) = E[reach_k * alpha_k]
    accepted = (reach * alpha.detach()).sum(-1)[full_blocks]
    stats = {
        "exact_accept_by_slot": [round(float(x), 4) for x in accept],
        "exact_expected_tau": 1 + float(accepted.mean()) if full_blocks.any() else float("nan"),
    }
    return loss, stats
