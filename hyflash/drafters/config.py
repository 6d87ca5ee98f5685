"""One dataclass configures the whole drafter family: `full`, `local`, `memory` and `hyflash`.

The kinds differ only in which context a draft block sees (see docs/drafters.md):

  full     every verified token's context K/V (the DFlash baseline; memory grows with context)
  local    the last `window` tokens (plus up to chunk_size-1 not yet evicted), no recurrent memory
  memory   the recurrent state of the prefix, plus the < chunk_size tokens of the chunk being filled
  hyflash  the last `window` tokens plus the recurrent state of everything older

Tokens leave the window in chunks of `chunk_size`: after n verified tokens the memory covers positions
[0, m) with m = chunk_size * max(0, (n - window) // chunk_size) and attention covers [m, n).
The recurrent memory has one state per attention head, of size head_dim x head_dim, and reads the same
key/value projections as the attention, so kinds compare at (almost exactly) equal parameter count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from hyflash.errors import HyflashError

KINDS = ("full", "local", "memory", "hyflash")
MEMORY_RULES = ("linear", "gated", "delta", "gated_delta")
MEMORY_COMBINES = ("gate", "sum")


@dataclass
class DrafterConfig:
    kind: str = "hyflash"
    num_layers: int = 1
    block_size: int = 16  # the anchor (last verified token) plus block_size - 1 draft slots
    window: int = 64  # local attention window (local, hyflash); ignored by full and memory
    memory_rule: str = "gated_delta"  # linear | gated | delta | gated_delta (memory, hyflash)
    chunk_size: int = 16  # eviction chunk: tokens are folded into the memory this many at a time
    # The drafter's own width; 0 = the target's hidden size. Narrower than the target, it projects the fused
    # features and the target's embeddings down to it and its output back up to the LM head (`out_proj`).
    hidden_size: int = 0
    num_heads: int = 0  # attention heads = memory heads; 0 = hidden_size // head_dim
    head_dim: int = 64  # attention head size = memory key and value size (state head_dim x head_dim)
    intermediate_size: int = 0  # MLP width; 0 = 8/3 hidden_size rounded up to a multiple of 64
    memory_combine: str = "gate"  # gate: attn + sigmoid(W x) * memory per head | sum: attn + memory
    slot_inputs: bool = True  # add the anchor embedding and last context feature to every block slot
    # Copy input (hyflash.drafters.copy): 0 = off; n > 0 = every slot also gets the token that the longest
    # (<= n) recurring suffix of the context continues with, and its match length; with a reduced draft
    # vocabulary the output gains a pointer to that token, so a copy outside the vocabulary can be drafted.
    copy_ngram: int = 0
    # With a copy input: a learned bonus, a linear function of each slot's hidden state, added to the logit of
    # that slot's copy candidate (its own column, or the pointer's). The drafter can then trust a long match
    # for many slots, as the n-gram lookup does, without moving its hidden state onto the candidate's head row.
    copy_gate: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    mask_token_id: int | None = None  # None: a learned mask vector; else this embedding row
    draft_vocab_size: int | None = None  # None: full vocabulary; else that many target ids (a buffer)
    # The target the drafter was built for (checked when loading).
    target_name: str = ""
    target_hidden_size: int = 0
    target_vocab_size: int = 0
    target_num_layers: int = 0
    feature_layers: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise HyflashError(f"bad drafter config: {message}")

        need(self.kind in KINDS, f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        need(self.memory_rule in MEMORY_RULES, f"memory rule {self.memory_rule!r} is not one of {MEMORY_RULES}")
        need(self.memory_combine in MEMORY_COMBINES, f"memory_combine must be one of {', '.join(MEMORY_COMBINES)}")
        need(self.num_layers >= 1, f"num_layers must be >= 1, got {self.num_layers}")
        need(self.block_size >= 2, f"block_size must be >= 2, got {self.block_size}")
        need(self.window >= 1 or self.kind in ("full", "memory"), f"window must be >= 1, got {self.window}")
        need(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")
        need(self.head_dim >= 2 and self.head_dim % 2 == 0, f"head_dim must be even, got {self.head_dim}")
        need(min(self.hidden_size, self.num_heads, self.intermediate_size) >= 0,
             "hidden_size, num_heads and intermediate_size must be >= 0")
        need(self.draft_vocab_size is None or self.draft_vocab_size >= 1, "draft_vocab_size must be >= 1")
        need(0 <= self.copy_ngram <= 16, f"copy_ngram must be in 0..16 (0 = no copy input), got {self.copy_ngram}")
        need(not self.copy_gate or self.copy_ngram > 0, "copy_gate needs a copy input (copy_ngram > 0)")
        self.feature_layers = [int(i) for i in self.feature_layers]

    # ----- derived facts -------------------------------------------------------------------------------
    @property
    def has_memory(self) -> bool:
        return self.kind in ("memory", "hyflash")

    @property
    def has_pointer(self) -> bool:
        """Whether the output has a pointer column: a copy input with a reduced draft vocabulary."""
        return self.copy_ngram > 0 and self.draft_vocab_size is not None

    @property
    def has_out_proj(self) -> bool:
        """Whether the drafter's width differs from the target's: its output then reaches the target's LM head
        through `out_proj`, and target embeddings reach it only through projections."""
        return self.hidden_size != self.target_hidden_size

    @property
    def attention_window(self) -> int | None:
        """Guaranteed attention span in tokens: None = everything (full), 0 for memory-only."""
        return {"full": None, "memory": 0}.get(self.kind, self.window)

    @property
    def window_capacity(self) -> int | None:
        """Most context tokens attention ever holds (window + an unfinished chunk); None = unbounded."""
        w = self.attention_window
        return None if w is None else w + self.chunk_size - 1

    def memory_start(self, n: int) -> int:
        """With n verified tokens, positions [0, start) live in the memory, [start, n) in the window."""
        w = self.attention_window
        if w is None:
            return 0
        return self.chunk_size * max(0, (n - w) // self.chunk_size)

    def signature(self) -> dict:
        return {
            "hidden_size": self.target_hidden_size,
            "vocab_size": self.target_vocab_size,
            "num_layers": self.target_num_layers,
            "feature_layers": list(self.feature_layers),
        }

    # ----- construction --------------------------------------------------------------------------------
    @classmethod
    def for_target(cls, target, **overrides) -> "DrafterConfig":
        """A config for `target` (a hyflash.targets.BaseTarget): signature filled in, sizes resolved."""
        sig = target.signature()
        config = cls(
            target_name=str(getattr(target, "name", "")),
            target_hidden_size=sig["hidden_size"],
            target_vocab_size=sig["vocab_size"],
            target_num_layers=sig["num_layers"],
            feature_layers=list(sig["feature_layers"]),
            **overrides,
        )
        return config.resolved()

    def resolved(self) -> "DrafterConfig":
        """Fill the automatic sizes (0): the width from the target's hidden size, the rest from the width."""
        if self.target_hidden_size <= 0:
            raise HyflashError("bad drafter config: target_hidden_size is not set (build it with for_target)")
        self.hidden_size = self.hidden_size or self.target_hidden_size
        hidden = self.hidden_size
        if self.has_out_proj and not (self.slot_inputs and self.mask_token_id is None):
            # The anchor's and the mask token's embeddings have the target's width: such a drafter can take in the
            # anchor only through anchor_proj (a slot input) and needs a mask vector of its own width.
            raise HyflashError(f"bad drafter config: hidden_size {hidden} differs from the target's "
                               f"{self.target_hidden_size}, which needs slot_inputs and a learned mask "
                               "(mask_token_id None)")
        if self.num_heads == 0:
            self.head_dim = min(self.head_dim, hidden - hidden % 2)
            self.num_heads = max(1, hidden // self.head_dim)
        if self.intermediate_size == 0:
            self.intermediate_size = max(64, -(-8 * hidden // 3 // 64) * 64)
        if self.draft_vocab_size is not None and self.draft_vocab_size > self.target_vocab_size:
            raise HyflashError(
                f"bad drafter config: draft_vocab_size {self.draft_vocab_size} exceeds the target's "
                f"vocabulary of {self.target_vocab_size}"
            )
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DrafterConfig":
        if not isinstance(data, dict):
            raise HyflashError("bad drafter config: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise HyflashError(f"bad drafter config: unknown fields {unknown} (written by a newer hyflash?)")
        try:
            return cls(**data)
        except TypeError as exc:
            raise HyflashError(f"bad drafter config: {exc}") from exc
