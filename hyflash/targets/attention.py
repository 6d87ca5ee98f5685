"""Attention for few-query passes (decode steps, verification blocks, draft trees) on CPU.

bf16/fp16: plain matmul-softmax-matmul instead of torch's SDPA kernel. Measured on an AMD EPYC (Zen 5, AVX-512
BF16): for one decoding step at 3.6k tokens of context, SDPA in bf16 took 6.7 ms per layer against 1.3 ms for the
plain product (1.8 vs 0.3 ms at 1k), so a bf16 step at long context ran 2.6x slower than a float32 one. Decode and
verify passes have few queries (1 to a tree budget), so their score matrix is small and the plain product is
the cheap way; prefill chunks keep SDPA.

float32: SDPA itself, with the key/value heads shared inside the kernel (`enable_gqa`). Given a mask (every
verify pass has one), transformers' SDPA path copies the whole cache's keys and values once per query head
(`repeat_kv`) before calling the same kernel: at 6k tokens of context that copy made a 2-token pass 2-5x a
one-token pass (SmolLM2, AMD EPYC Zen 4: 3.5-11 ms a layer against 0.8 ms shared). The result is bit for bit
SDPA's (tests/test_attention.py); one-token steps stay on transformers' own path, which shares them already.

Registered through transformers' public AttentionInterface / AttentionMaskInterface under `few_query_cpu`,
with SDPA's own masks, so it receives exactly what SDPA would and hands large passes to SDPA unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "few_query_cpu"  # transformers reads any name containing "flash" as flash attention
MAX_QUERIES = 32  # passes with more query positions (prefill chunks) go to SDPA


def few_query_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                        is_causal=None, **kwargs):
    """SDPA's contract ([b, h, q, d] in, [b, q, h, d] out, GQA by module.num_key_value_groups, a boolean or
    additive mask broadcast over heads, None = causal), computed as softmax(q k^T * scale + mask) v."""
    q_len = query.shape[2]
    # No mask with several queries means SDPA's own causal convention (a prefill): leave that to SDPA.
    several_unmasked = q_len > 1 and attention_mask is None
    one_fp32 = q_len == 1 and query.dtype == torch.float32  # transformers shares key/value heads there already
    if (q_len > MAX_QUERIES or several_unmasked or one_fp32 or query.device.type != "cpu" or dropout
            or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if query.dtype == torch.float32:
        return shared_heads_sdpa(query, key, value, attention_mask, scaling)
    return reference_attention(query, key, value, attention_mask, scaling)


def shared_heads_sdpa(query, key, value, attention_mask, scaling=None):
    """SDPA over the key/value heads as they are (`enable_gqa`), not repeated per query head: what transformers'
    SDPA path computes for a masked pass, bit for bit, without copying the cache."""
    mask = None if attention_mask is None else attention_mask[..., : key.shape[2]]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                                           enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def reference_attention(query, key, value, attention_mask, scaling=None):
    """The plain product, key/value heads shared by groups of query heads without copying them. Without a
    mask every query reads every key (callers pass a mask whenever several queries need causality)."""
    b, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(b, kv_heads, groups * q_len, dim)  # query head j reads key head j // groups
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale).view(b, kv_heads, groups, q_len, kv_len)
    if attention_mask is not None:  # None: one query, which may read every key
        mask = attention_mask[..., :kv_len]
        mask = mask.view(mask.shape[0], 1, 1, q_len, kv_len) if mask.shape[1] == 1 else \
            mask.view(mask.shape[0], kv_heads, groups, q_len, kv_len)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv_heads, groups * q_len, kv_len)
    out = torch.matmul(probs, value).view(b, heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `few_query_cpu` an attention implementation transformers models can switch to (idempotent)."""
    AttentionInterface.register(NAME, few_query_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_for(model) -> bool:
    """Switch a CPU model on SDPA to `few_query_cpu`; accelerator models keep what they have."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(register())
    return True
