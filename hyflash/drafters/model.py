"""The drafter family as one model: fused target features -> a few decoder layers over a draft block.

A block anchored at position a is [tokens[a], MASK, ..., MASK] at positions a..a+B-1; it sees target features
of positions < a only (the feature of position a does not exist yet at draft time), and slot k predicts
tokens[a+k]. With `slot_inputs`, every slot also gets a projection of the anchor's embedding and of the
fused feature of position a-1. The target's embedding and LM head are borrowed frozen and never saved.
The drafter's width (`config.hidden_size`, D below) may be below the target's H: the fusion, the
embeddings' projections and every layer work at D, and `out_proj` maps the final hidden states to H for the
head, so the hidden states this module hands out always have the head's width H.

`train_forward` runs many anchors per sequence in one pass; `hyflash.drafters.state.DrafterState` runs the
same layers incrementally at inference; `hyflash.drafters.reference` is the one-anchor-at-a-time oracle.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.drafters import loading, memory
from hyflash.drafters.config import DrafterConfig
from hyflash.drafters.copy import batched_copy_candidates
from hyflash.drafters.layers import DrafterLayer, FeatureFusion, LayerContext, rope
from hyflash.errors import HyflashError


class DrafterModel(nn.Module):
    def __init__(self, config: DrafterConfig, target):
        super().__init__()
        config = config.resolved()
        loading.check_target(config, target)
        self.config = config
        self.target = target  # a plain attribute: its weights are neither parameters nor saved
        H, D = config.target_hidden_size, config.hidden_size  # the target's width (embeddings, head), the drafter's
        self.fusion = FeatureFusion(len(config.feature_layers), H, D, config.rms_eps)
        self.mask_embedding = None
        if config.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.randn(D) * 0.02)
        if config.slot_inputs:
            self.anchor_proj = nn.Linear(H, D, bias=False)
            self.context_proj = nn.Linear(D, D, bias=False)
        if config.copy_ngram:
            # Zero at the start: a drafter given a copy input later computes exactly what it did without it.
            self.copy_proj = nn.Linear(H, D, bias=False)
            self.copy_length = nn.Embedding(config.copy_ngram + 1, D)
            nn.init.zeros_(self.copy_proj.weight)
            nn.init.zeros_(self.copy_length.weight)
        if config.copy_gate:  # zero too: no bonus until trained; it reads what the head reads (width H)
            self.copy_gate = nn.Linear(H, 1)
            nn.init.zeros_(self.copy_gate.weight)
            nn.init.zeros_(self.copy_gate.bias)
        self.layers = nn.ModuleList(DrafterLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(D, eps=config.rms_eps)
        # Only at another width than the target's: a drafter of the target's width keeps the parameters (and
        # checkpoints) it always had.
        self.out_proj = nn.Linear(D, H, bias=False) if config.has_out_proj else None
        vocab = None if config.draft_vocab_size is None else torch.arange(config.draft_vocab_size)
        self.register_buffer("draft_vocab_ids", vocab)  # draft index -> target token id (None = identity)
        self._head_cache = None
        self._index_cache = None
        self.int8_head = None  # set by quantize_int8 (CPU inference)

    # ----- small facts ---------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def param_count(self) -> int:
        """The drafter's own trainable parameters (the target's embedding and head are borrowed). An int8 copy
        reports its float model's count: its quantised linears hold packed weights, not parameters."""
        if self.int8_head is not None:
            return self._float_param_count
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ----- frozen target pieces ------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.target.embed(ids.to(self.target.device)).to(self.norm.weight)

    def _head_weight(self) -> torch.Tensor:
        """The target's LM head rows of the draft vocabulary, in the drafter's dtype: a copy, kept while the
        target's weights and the vocabulary are unchanged (it counts in the drafter's weight bytes)."""
        weight = self.target.head_weight()
        if self.draft_vocab_ids is None and weight.dtype == self.dtype:
            return weight.detach()
        key = (weight.data_ptr(), _version(weight), None if self.draft_vocab_ids is None else
               _version(self.draft_vocab_ids), weight.device, self.dtype)
        if self._head_cache is None or self._head_cache[0] != key:
            rows = weight.detach() if self.draft_vocab_ids is None else weight.detach()[self.draft_vocab_ids.to(weight.device)]
            self._head_cache = (key, rows.to(self.dtype))
        return self._head_cache[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float logits over the draft vocabulary (the target's frozen LM head rows)."""
        if self.int8_head is not None:
            return self.int8_head(hidden.float())
        w = self._head_weight()
        # One [rows, H] x [H, V] product. A non-contiguous batch (training's slots 1.., sliced) would otherwise go
        # to a batched product with the weight broadcast per anchor: 6x slower on a CPU, forward and backward.
        flat = hidden.reshape(-1, hidden.shape[-1]).to(w)
        return F.linear(flat, w).float().view(*hidden.shape[:-1], w.shape[0])

    def quantize_int8(self) -> "DrafterModel":
        """Dynamic int8 weights (fbgemm) for CPU inference: drafting is bound by reading weights, and the head
        alone is 8192 x 576 floats, so a draft step gets several times cheaper. The drafts may change
        slightly; verification by the target is untouched, so the output is still exactly the target's.
        Inference only: the model can no longer be trained or saved."""
        import warnings

        from torch.ao.quantization import quantize_dynamic

        self._float_param_count = self.param_count()
        # The head reads the final hidden states at its own width H (after out_proj, which is quantised below).
        head = nn.Linear(self.config.target_hidden_size, 1, bias=False)
        head.weight = nn.Parameter(self._head_weight().detach().float(), requires_grad=False)
        with warnings.catch_warnings():  # torch.ao's deprecation notice is for library authors, not users
            warnings.simplefilter("ignore")
            quantize_dynamic(self, {nn.Linear}, dtype=torch.qint8, inplace=True)
            self.int8_head = quantize_dynamic(nn.Sequential(head), {nn.Linear}, dtype=torch.qint8)
        return self

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_vocab_ids is None else self.draft_vocab_ids[draft_ids]

    def to_full_vocab(self, probs: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Probabilities [..., V'] over `vocab_ids` (default: the draft vocabulary) -> target-vocabulary
        probabilities [..., V] (zeros elsewhere)."""
        vocab_ids = self.draft_vocab_ids if vocab_ids is None else vocab_ids
        if vocab_ids is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.config.target_vocab_size)
        return full.index_copy_(-1, vocab_ids.to(probs.device), probs)

    def draft_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> their index in the draft vocabulary, -1 for ids outside it (and for ids < 0)."""
        if self.draft_vocab_ids is None:
            return ids
        key = (_version(self.draft_vocab_ids), self.draft_vocab_ids.device)
        if self._index_cache is None or self._index_cache[0] != key:
            lookup = torch.full((self.config.target_vocab_size,), -1, dtype=torch.long, device=ids.device)
            lookup[self.draft_vocab_ids.to(ids.device)] = torch.arange(len(self.draft_vocab_ids), device=ids.device)
            self._index_cache = (key, lookup)
        lookup = self._index_cache[1].to(ids.device)
        return torch.where(ids >= 0, lookup[ids.clamp_min(0)], -1)

    def set_draft_vocab(self, ids) -> None:
        """Choose the target token ids of the reduced draft vocabulary (e.g. the most frequent ones)."""
        ids = torch.as_tensor(ids, dtype=torch.long).view(-1)
        if self.draft_vocab_ids is None or ids.numel() != self.draft_vocab_ids.numel():
            raise ValueError(f"need exactly draft_vocab_size={self.config.draft_vocab_size} ids")
        in_range = 0 <= int(ids.min()) and int(ids.max()) < self.config.target_vocab_size
        if ids.unique().numel() != ids.numel() or not in_range:
            raise ValueError("draft vocabulary ids must be distinct target token ids")
        self.draft_vocab_ids.copy_(ids)

    # ----- shared forward pieces -----------------------------------------------------------------------
    def mask_vector(self) -> torch.Tensor:
        if self.mask_embedding is not None:
            return self.mask_embedding
        return self.embed(torch.tensor(self.config.mask_token_id))

    def anchor_slot(self, emb: torch.Tensor) -> torch.Tensor:
        """The anchor slot's own row from the anchor's embedding emb [..., H]: the embedding itself, or at
        another width than the target's, where it cannot be added, zeros [..., D] (the anchor then reaches
        this slot, like every other, through anchor_proj)."""
        if self.out_proj is None:
            return emb
        return emb.new_zeros(*emb.shape[:-1], self.config.hidden_size)

    def block_inputs(self, anchor_tokens: torch.Tensor, last_context: torch.Tensor, copy=None) -> torch.Tensor:
        """anchor_tokens [B, A], last_context [B, A, D] (fused feature of position a-1), copy (candidates
        [B, A, S-1], match lengths [B, A]) or None -> x [B, A, S, D]."""
        emb = self.embed(anchor_tokens)
        first = self.anchor_slot(emb)
        B, A, D = first.shape
        x = torch.cat([first[:, :, None], self.mask_vector().expand(B, A, self.config.block_size - 1, D)], 2)
        if self.config.slot_inputs:
            x = x + (self.anchor_proj(emb) + self.context_proj(last_context))[:, :, None]
        if self.config.copy_ngram:
            x = torch.cat([x[:, :, :1], x[:, :, 1:] + self.copy_input(*copy)], 2)
        return x

    # ----- the copy input and the pointer (hyflash.drafters.copy) ----------------------------------------
    def copy_inputs(self, tokens: torch.Tensor, anchors: torch.Tensor):
        """(candidates [B, A, S-1], match lengths [B, A]) for the blocks at `anchors` of `tokens` [B, T]; None
        without a copy input."""
        if not self.config.copy_ngram:
            return None
        return batched_copy_candidates(tokens, anchors, self.config.block_size - 1, self.config.copy_ngram)

    def copy_input(self, candidates: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """What each draft slot adds: a projection of its candidate's embedding plus a vector per match length,
        nothing where it has no candidate. candidates [..., S-1], lengths [...] -> [..., S-1, D]."""
        has = (candidates >= 0)[..., None]
        extra = self.copy_proj(self.embed(candidates.clamp_min(0))) + self.copy_length(lengths)[..., None, :]
        return extra * has

    def block_logits(self, hidden: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the draft slots: over the draft vocabulary, plus with a pointer (`config.has_pointer`)
        one last column, the target head's logit of the slot's copy candidate where that candidate lies
        outside the draft vocabulary (-inf elsewhere: inside it the candidate already has its own column).
        With `config.copy_gate`, each slot's candidate column (its own or the pointer) gains the learned bonus.
        hidden [..., S', H], candidates [..., S'] -> [..., S', Vd (+1)]."""
        logits = self.logits(hidden)
        if not self.config.copy_ngram:
            return logits
        column = self.draft_index(candidates)
        if self.config.has_pointer:
            outside = (candidates >= 0) & (column < 0)
            rows = self.target.head_weight().detach()[candidates.clamp_min(0).to(self.target.device)]
            pointer = (rows.to(hidden.device).float() * hidden.float()).sum(-1)
            pointer = pointer.masked_fill(~outside.to(pointer.device), float("-inf"))
            logits = torch.cat([logits, pointer[..., None]], -1)
            column = torch.where(outside, len(self.draft_vocab_ids), column)
        if self.config.copy_gate:
            column = column.to(logits.device)
            bonus = self.copy_gate(hidden).squeeze(-1).float() * (column >= 0)
            logits = logits.scatter_add(-1, column.clamp_min(0)[..., None], bonus[..., None])
        return logits

    def layer_context(self, k, v, positions=None, valid=None, state=None) -> LayerContext:
        """Context keys/values [B, A, L, heads, d] -> a LayerContext; keys are RoPE'd at `positions` [B, A, L]
        unless positions is None (already rotated)."""
        if positions is not None:
            k = rope(k, positions, self.config.rope_theta)
        return LayerContext(k.transpose(-2, -3), v.transpose(-2, -3), valid, state)

    def blocks_forward(self, x, positions, contexts: list[LayerContext]) -> torch.Tensor:
        """Block inputs x [..., S, D] -> final hidden states [..., S, H], ready for the LM head."""
        for layer, ctx in zip(self.layers, contexts):
            x = layer(x, positions, ctx)
        x = self.norm(x)
        return x if self.out_proj is None else self.out_proj(x)

    # ----- training ------------------------------------------------------------------------------------
    def train_forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                      copy=None) -> torch.Tensor:
        """features [B, T, nF, H], tokens [B, T], anchors [B, A] (0 < a < T) -> hidden [B, A, S-1, H] of slots
        1..S-1; slot k of anchor a predicts tokens[a + k]. copy: `copy_inputs(tokens, anchors)` when the
        caller needs them too (computed here otherwise)."""
        cfg = self.config
        B, T = tokens.shape
        anchors = anchors.long().to(tokens.device)
        c = self.fusion(features.to(self.dtype))  # [B, T, D]
        batch = torch.arange(B, device=c.device)[:, None]
        last = c[batch, (anchors - 1).clamp_min(0)] * (anchors > 0)[..., None]
        if cfg.copy_ngram and copy is None:
            copy = self.copy_inputs(tokens, anchors)
        x = self.block_inputs(tokens.gather(1, anchors), last, copy)
        positions = anchors[..., None] + torch.arange(cfg.block_size, device=c.device)
        starts = torch.zeros_like(anchors)
        if cfg.attention_window is not None:
            starts = cfg.chunk_size * ((anchors - cfg.attention_window) // cfg.chunk_size).clamp_min(0)
        contexts = [self._train_context(layer, c, anchors, starts) for layer in self.layers]
        return self.blocks_forward(x, positions, contexts)[:, :, 1:]

    def _train_context(self, layer: DrafterLayer, c, anchors, starts) -> LayerContext:
        cfg = self.config
        B, T, _ = c.shape
        batch = torch.arange(B, device=c.device)[:, None, None]
        k, v, gates = layer.project_context(c)  # [B, T, heads, d]
        if cfg.window_capacity is None:  # full: every block reads all positions, masked to those before it
            pos = torch.arange(T, device=c.device)
            return self.layer_context(k[:, None], v[:, None], pos[None, None], pos < anchors[..., None])
        idx = starts[..., None] + torch.arange(cfg.window_capacity, device=c.device)  # [B, A, L]
        valid = idx < anchors[..., None]
        idx = idx.clamp(max=T - 1)
        state = None
        if cfg.has_memory:
            n = int(starts.max()) // cfg.chunk_size * cfg.chunk_size
            per_head = [x[:, :n].transpose(1, 2) for x in (k, v)]  # [B, heads, n, d]
            g = None if gates is None else gates[:, :n].transpose(1, 2)
            states = memory.chunk_scan(*per_head, g, cfg.memory_rule, cfg.chunk_size)  # [B, heads, J, d, dv]
            state = states.transpose(1, 2)[batch[..., 0], starts // cfg.chunk_size]  # [B, A, heads, d, dv]
        return self.layer_context(k[batch, idx], v[batch, idx], idx, valid, state)

    # ----- initialisation from the target ---------------------------------------------------------------
    @torch.no_grad()
    def init_from_target(self) -> list[str]:
        """Overwrite the decoder layers with copies of target layers where shapes match; returns notes on
        what was copied, adapted or skipped. Raises HyflashError if the target does not expose Llama-style
        layers (model.get_decoder().layers[i].self_attn.q_proj, ..., .mlp.gate_proj, ..., input_layernorm,
        post_attention_layernorm).

        Which layers: drafter layer j of n <- target layer L - n + j (the last n, in order). The drafter's
        output goes through its `norm` into the target's LM head, like the target's last layer output goes
        through the target's final norm, so the top layers are the ones whose weights already write in the
        head's basis; its context comes from the fused features, which are late-layer heavy too (feature
        layers run up to L-3). Layers spread over the depth would chain layers that were never adjacent.
        The final norm is copied from the target's too, and RoPE's base is set to the target's, so the copied
        query/key projections see positions as they were trained to. Other pieces (feature fusion, slot
        inputs, mask vector, memory gates) keep their random initialisation. Deterministic: every process
        of a data-parallel run gets the same weights."""
        where = f"--init-from-target ({getattr(self.target, 'name', 'the target')})"
        if self.config.has_out_proj:  # every copied weight has the target's width
            raise HyflashError(f"{where}: the drafter's width {self.config.hidden_size} is not the target's "
                               f"{self.config.target_hidden_size}, so its layers cannot be copied: leave out "
                               "--hidden-size or --init-from-target")
        model = getattr(self.target, "model", None)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        if model is None or layers is None:
            raise HyflashError(f"{where}: needs a transformers target whose model.get_decoder().layers are "
                               f"exposed; this {getattr(self.target, 'backend', '') or 'target'} backend has none")
        cfg, text = self.config, model.config.get_text_config()
        n, L, H = len(self.layers), len(layers), cfg.target_hidden_size
        if n > L:
            raise HyflashError(f"{where}: the drafter has {n} layers, the target only {L}")
        picks = [L - n + j for j in range(n)]
        notes = [f"drafter layers 0..{n - 1} <- target layers {picks}"]
        t_heads = int(text.num_attention_heads)
        t_kv = int(getattr(text, "num_key_value_heads", None) or t_heads)
        t_dim = int(getattr(text, "head_dim", None) or H // t_heads)
        h, d = cfg.num_heads, cfg.head_dim
        attention = (h, d) == (t_heads, t_dim) and t_heads % t_kv == 0
        if not attention:
            notes.append(f"attention not copied: the drafter has {h} heads of {d}, the target {t_heads} query "
                         f"heads of {t_dim} ({t_kv} key/value heads)")
        elif t_kv < h:
            notes.append(f"keys/values: each of the target's {t_kv} key/value heads repeated {h // t_kv}x "
                         f"for the drafter's {h} heads (the same attention as the target's grouped queries)")
        act = str(getattr(text, "hidden_act", "silu"))
        if act not in ("silu", "swish"):
            notes.append(f"the target's MLP uses {act}, the drafter's silu: the MLP weights are only a start")
        for mine, i in zip(self.layers, picks):
            src = layers[i]
            if hasattr(src, "pre_feedforward_layernorm"):  # Gemma-style: sandwich norms, 1 + w scales
                raise HyflashError(f"{where}: target layer {i} ({type(src).__name__}) has sandwich norms the "
                                   "drafter's pre-norm layer does not; only Llama-style layers are supported")
            label = f"{where}: target layer {i} ({type(src).__name__})"
            q, k, v, o = (_target_part(src, f"self_attn.{x}_proj", label) for x in "qkvo")
            gate, up, down = (_target_part(src, f"mlp.{x}_proj", label) for x in ("gate", "up", "down"))
            norms = [_target_part(src, name, label) for name in ("input_layernorm", "post_attention_layernorm")]
            if attention:
                _copy(mine.q_proj.weight, q.weight, where)
                for dst, kv in ((mine.k_proj.weight, k.weight), (mine.v_proj.weight, v.weight)):
                    _copy(dst, kv.reshape(t_kv, t_dim, H).repeat_interleave(h // t_kv, 0).reshape(h * d, H), where)
                _copy(mine.o_proj.weight, o.weight, where)
                for name, norm in (("q_norm", mine.q_norm), ("k_norm", mine.k_norm)):
                    theirs = getattr(src.self_attn, name, None)  # e.g. Qwen3; Llama has none: ours stay ones
                    if theirs is not None:
                        _copy(norm.weight, theirs.weight, where)
                if any(getattr(x, "bias", None) is not None for x in (q, k, v, o)) and i == picks[0]:
                    notes.append("the target's attention biases have no place in the drafter: dropped")
            _copy(mine.attn_norm.weight, norms[0].weight, where)
            _copy(mine.mlp_norm.weight, norms[1].weight, where)
            mine_i, theirs_i = mine.mlp.gate.weight.shape[0], gate.weight.shape[0]
            m = min(mine_i, theirs_i)
            _copy(mine.mlp.gate.weight[:m], gate.weight[:m], where)
            _copy(mine.mlp.up.weight[:m], up.weight[:m], where)
            _copy(mine.mlp.down.weight[:, :m], down.weight[:, :m], where)
            if mine_i > theirs_i:  # the extra units start silent: at step 0 the MLP computes the target's
                mine.mlp.down.weight[:, m:].zero_()
        if mine_i != theirs_i:
            notes.append(f"MLP width {mine_i} vs the target's {theirs_i}: the first {m} units copied"
                         + (", the others start with zero output weights" if mine_i > theirs_i else " (a slice)"))
        final = getattr(decoder, "norm", None)
        if getattr(final, "weight", None) is not None and final.weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(final.weight)
            notes.append("final norm <- the target's final norm")
        rope_params = getattr(text, "rope_parameters", None) or {}
        theta = getattr(text, "rope_theta", None) or rope_params.get("rope_theta")
        if theta and float(theta) != cfg.rope_theta:
            notes.append(f"rope_theta {cfg.rope_theta:g} -> {float(theta):g} (the target's)")
            cfg.rope_theta = float(theta)
        if rope_params.get("rope_type", "default") != "default":
            notes.append(f"the target's RoPE scaling ({rope_params['rope_type']}) is not reproduced")
        return notes

    # ----- checkpoints ---------------------------------------------------------------------------------
    def save_pretrained(self, path) -> Path:
        return loading.write_checkpoint(path, self.config, self.state_dict())

    @classmethod
    def from_pretrained(cls, path, target, dtype: torch.dtype | None = None) -> "DrafterModel":
        """Load a drafter for `target` (checked); dtype defaults to the target's."""
        config = loading.read_config(path)
        loading.check_target(config, target, where=f"the drafter at {path}")
        model = cls(config, target)
        tensors = loading.read_weights(path)
        try:
            model.load_state_dict(tensors, strict=True)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[1:2] or [str(exc)]
            raise HyflashError(
                f"the weights in {path} do not match its config.json ({first[0].strip()}): re-save the drafter"
            ) from exc
        return model.to(device=target.device, dtype=dtype or target.dtype).eval()


def _version(t: torch.Tensor) -> int:
    """A tensor's in-place version, for the caches above; 0 for an inference tensor (one made in inference mode,
    e.g. a drafter loaded inside it), which keeps no counter and which nothing modifies in place."""
    return 0 if t.is_inference() else t._version


def _target_part(module: nn.Module, path: str, where: str) -> nn.Module:
    """module.a.b for path "a.b", or a HyflashError that names what is missing."""
    for name in path.split("."):
        if not hasattr(module, name):
            raise HyflashError(f"{where} has no {path}: --init-from-target needs Llama-style decoder layers "
                               "(self_attn.q/k/v/o_proj, mlp.gate/up/down_proj, input_layernorm, "
                               "post_attention_layernorm)")
        module = getattr(module, name)
    return module


def _copy(dst: torch.Tensor, src: torch.Tensor, where: str) -> None:
    if dst.shape != src.shape:
        raise HyflashError(f"{where}: a target weight of shape {tuple(src.shape)} does not fit the drafter's "
                           f"{tuple(dst.shape)}")
    dst.copy_(src.detach())
