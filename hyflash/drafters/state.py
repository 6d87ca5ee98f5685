"""Inference-time drafter: a DrafterModel plus the context it has seen, behind the decoding loop's interface.

Per layer it holds the context keys/values of the attention window and, for memory kinds, one recurrent
state per head. After n verified tokens the window holds positions [m, n) with m = config.memory_start(n),
at most window + chunk_size - 1 tokens in a fixed-size buffer; whole chunks of chunk_size tokens are folded
into the state as they leave it (`memory.chunk_scan`, the same code training uses). Window keys are kept
before RoPE (the memory folds un-rotated keys); the fast draft path also keeps a rotated copy, filled at ingest,
so that a draft does not rotate the whole window again (at window 256 that rotation was ~4% of a draft).
`full` keeps every token instead, rotating each key once at ingest. Only verified tokens are ingested, so
nothing is ever rolled back.
"""

from __future__ import annotations

import torch

from hyflash.drafters import memory
from hyflash.drafters.base import Draft, Drafter
from hyflash.drafters.copy import TokenHistory
from hyflash.drafters.fast import FastDraft, rotated
from hyflash.drafters.layers import rope
from hyflash.drafters.model import DrafterModel
from hyflash.sampling import SamplingConfig, argmax, logits_to_probs, sample

INGEST_SLICE = 512  # verified tokens taken in per step of `ingest` (a multiple of every chunk size we ship)


class DrafterState(Drafter):
    needs_features = True
    ingest_state = ("length", "start", "keys", "rotated_keys", "values", "gates", "states", "last_feature", "history")

    def __init__(self, model: DrafterModel, fast: bool = True):
        """fast: draft with `FastDraft`, built now from the model's float weights (a snapshot: a model trained
        further needs a new state); False (or a model already quantised) drafts with the general path."""
        self.model = model.eval()
        self.config = model.config
        self.block_size = model.config.block_size
        self.fast = FastDraft(model).eval() if fast and model.int8_head is None else None
        self.reset()

    def quantize_int8(self) -> "DrafterState":
        """int8 weights for CPU inference (see `DrafterModel.quantize_int8`), in the model and the fast path."""
        self.model.quantize_int8()
        if self.fast is not None:
            self.fast.quantize_int8()
        return self

    def reset(self) -> None:
        cfg, p = self.config, self.model.norm.weight
        self.length = 0  # verified tokens ingested
        self.start = 0  # positions [0, start) are in the memory, [start, length) in the window buffers
        cap = cfg.window_capacity or 0  # full kind: buffers grow with the context
        heads, d = cfg.num_heads, cfg.head_dim
        self.keys = [p.new_zeros(cap, heads, d) for _ in self.model.layers]
        # The fast path's copy of the window keys after RoPE (the general path rotates at draft time).
        self.rotated_keys = [p.new_zeros(cap, heads, d) for _ in self.model.layers] if self.fast and cap else []
        self.values = [p.new_zeros(cap, heads, d) for _ in self.model.layers]
        self.gates = [p.new_zeros(cap, heads, 2) for layer in self.model.layers if layer.memory_gates is not None]
        self.states = []
        if cfg.has_memory:
            dv = memory.value_dim(d, cfg.memory_rule)
            state_dtype = torch.promote_types(p.dtype, torch.float32)
            self.states = [torch.zeros(heads, d, dv, dtype=state_dtype, device=p.device) for _ in self.model.layers]
        self.last_feature = p.new_zeros(cfg.hidden_size)  # a fused feature: the drafter's width
        # The copy input searches every verified token (like the n-gram drafter's history: 4 bytes a token).
        self.history = TokenHistory() if cfg.copy_ngram else None

    def held_tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.rotated_keys, *self.values, *self.gates, *self.states, self.last_feature]

    def memory_bytes(self) -> int:
        history = 0 if self.history is None else self.history.nbytes()
        return sum(t.numel() * t.element_size() for t in self.held_tensors()) + history

    @torch.inference_mode()
    def ingest(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        """Take in verified tokens with their target features, INGEST_SLICE tokens at a time: a long prompt in
        one piece would fuse, project and fold every position at once (SmolLM2's default drafter taking in
        7.5k positions, two threads: +0.78 GiB peak RSS at once, +0.07 GiB in slices of 512; experiments/rss/)."""
        if features is None:
            raise ValueError("a HyFlash-family drafter needs target features: call ingest with features")
        for i in range(0, features.shape[0], INGEST_SLICE):
            self._ingest(tokens[i : i + INGEST_SLICE], features[i : i + INGEST_SLICE])

    def _ingest(self, tokens: torch.Tensor, features: torch.Tensor) -> None:
        n_new = features.shape[0]
        if self.history is not None:
            self.history.extend(tokens)
        cfg = self.config
        c = self.model.fusion(features.to(self.model.norm.weight))  # [n, D]
        length = self.length + n_new
        start = cfg.memory_start(length)
        folded = start - self.start  # whole chunks leaving the window now
        live = self.length - self.start
        if self.rotated_keys:
            new_rows = self.fast.rope.rows(self.length, length)
        for i, layer in enumerate(self.model.layers):
            k, v, g = layer.project_context(c)
            if cfg.window_capacity is None:  # full: rotate once now, keep everything
                positions = self.length + torch.arange(n_new, device=k.device)
                self.keys[i] = torch.cat([self.keys[i], rope(k, positions, cfg.rope_theta)])
                self.values[i] = torch.cat([self.values[i], v])
                continue
            # Every window buffer of this layer with its new rows; all of them slide alike.
            window = [(self.keys[i], k), (self.values[i], v)]
            if g is not None:
                window.append((self.gates[i], g))
            if self.rotated_keys:
                window.append((self.rotated_keys[i], rotated(k, *new_rows)))
            if not folded:  # nothing leaves the window (most steps): append in place
                for buffer, rows in window:
                    buffer[live : live + n_new] = rows
                continue
            whole = [torch.cat([buffer[:live], rows]) for buffer, rows in window]
            if cfg.has_memory:
                per_head = [x[:folded].transpose(0, 1) for x in whole[:2]]
                gf = None if g is None else whole[2][:folded].transpose(0, 1)
                states = memory.chunk_scan(*per_head, gf, cfg.memory_rule, cfg.chunk_size, self.states[i])
                self.states[i] = states[:, -1]
            for (buffer, _), rows in zip(window, whole):
                buffer[: length - start] = rows[folded:]
        self.length, self.start = length, start
        self.last_feature = c[-1].clone()

    def copy_candidates(self, last_token: int):
        """(candidates [S-1], match length) of the block after `last_token`, or None without a copy input."""
        if self.history is None:
            return None
        candidates, n = self.history.copy_candidates(last_token, self.block_size - 1, self.config.copy_ngram)
        return candidates.to(self.model.norm.weight.device), n

    @torch.inference_mode()
    def block_hidden(self, last_token: int, copy=None) -> torch.Tensor:
        """Final hidden states [block_size - 1, H] of the block [last_token, MASK, ...] at position `length`;
        copy: `copy_candidates(last_token)` for a drafter with a copy input."""
        if self.fast is not None:
            return self.fast.hidden(self, last_token, copy)
        model, cfg = self.model, self.config
        device = model.norm.weight.device
        batched = None if copy is None else (copy[0].view(1, 1, -1), torch.tensor([[copy[1]]], device=device))
        x = model.block_inputs(torch.tensor([[last_token]], device=device), self.last_feature.view(1, 1, -1),
                               batched)
        positions = (self.length + torch.arange(cfg.block_size, device=device)).view(1, 1, -1)
        live = self.length - self.start
        ctx_positions = None  # full: keys were rotated at ingest
        if cfg.window_capacity is not None:
            ctx_positions = (self.start + torch.arange(live, device=device)).view(1, 1, -1)
        contexts = [
            model.layer_context(
                self.keys[i][None, None, :live],
                self.values[i][None, None, :live],
                ctx_positions,
                state=self.states[i][None, None] if cfg.has_memory else None,
            )
            for i in range(cfg.num_layers)
        ]
        return model.blocks_forward(x, positions, contexts)[0, 0, 1:]

    @torch.inference_mode()
    def draft(
        self, last_token: int, num_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        num_tokens = min(num_tokens, self.block_size - 1)
        if num_tokens <= 0 or self.length == 0:
            return Draft(tokens=torch.empty(0, dtype=torch.long))
        model = self.model
        copy = self.copy_candidates(last_token)
        candidates = None if copy is None else copy[0][:num_tokens]
        logits = model.block_logits(self.block_hidden(last_token, copy)[:num_tokens], candidates)  # [k, V']
        vocab = model.draft_vocab_ids
        if self.config.has_pointer:  # the pointer column becomes a column per distinct outside candidate
            logits, vocab = pointer_vocabulary(logits, candidates, vocab)
        ids = (lambda picks: picks) if vocab is None else (lambda picks: vocab.to(picks.device)[picks])
        if sampling.greedy:
            slot_probs = logits.softmax(-1)
            confidence = slot_probs.amax(-1)  # the argmax's probability: distribution-level
            return Draft(tokens=ids(argmax(logits)), confidence=confidence, expensive=True,
                         slot_probs=slot_probs, vocab_ids=vocab)
        probs = logits_to_probs(logits, sampling)
        picks = sample(probs, generator)
        # Everything stays on the model's device; the decoding loop moves what it verifies.
        return Draft(tokens=ids(picks), probs=model.to_full_vocab(probs, vocab),
                     confidence=probs.amax(-1), expensive=True, slot_probs=probs, vocab_ids=vocab)


def pointer_vocabulary(logits: torch.Tensor, candidates: torch.Tensor,
                       draft_vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [k, Vd + 1] whose last column points at each slot's candidate -> (logits [k, Vd + m], vocab ids
    [Vd + m]): the m distinct candidates the pointer can reach get a column each, holding the pointer logit in
    their slot's row and -inf in the others, so each row is the same distribution over target ids."""
    k = logits.shape[0]
    finite = torch.isfinite(logits[:, -1])
    outside = candidates[finite].unique()
    vocab = torch.cat([draft_vocab.to(outside.device), outside])
    extra = logits.new_full((k, len(outside)), float("-inf"))
    if len(outside):
        column = torch.searchsorted(outside, candidates[finite].to(outside.device))
        extra[finite.nonzero().flatten(), column] = logits[finite, -1]
    return torch.cat([logits[:, :-1], extra], 1), vocab
