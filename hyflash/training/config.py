"""The one dataclass that configures a drafter training run (every field is a `hyflash train` flag)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hyflash.credit import CreditConfig
from hyflash.errors import HyflashError
from hyflash.training.onpolicy import OnPolicyConfig

# Fields that do not change what is computed: they may differ between a run and its resumption.
BOOKKEEPING = ("out", "save_every", "keep_checkpoints", "log_every", "eval_every", "eval_prompts",
               "eval_new_tokens", "eval_at", "eval_seed", "threads", "feature_cache", "feature_compute_dtype",
               "plot")


@dataclass
class TrainConfig:
    data: list[str] = field(default_factory=list)  # data folders written by `hyflash data`
    out: str = "runs/drafter"
    model: str = "smollm2-135m"
    dtype: str = "bfloat16"  # the target's dtype for features (and held-out tau)
    # ----- the drafter -----
    kind: str = "hyflash"
    num_layers: int = 1
    hidden_size: int = 0  # the drafter's width; 0 = the target's (narrower: fewer parameters, cheaper steps)
    num_heads: int = 0  # 0 = hidden_size // 64
    intermediate_size: int = 0  # MLP width; 0 = 8/3 hidden_size rounded up to a multiple of 64
    block_size: int = 8
    window: int = 64
    chunk_size: int = 16
    memory_rule: str = "gated_delta"
    draft_vocab_size: int = 16384  # most frequent target-written tokens; 0 = the full vocabulary
    init: str = ""  # a drafter folder to start from (e.g. to continue training a shipped drafter)
    init_from_target: bool = False  # decoder layers start as copies of the target's last layers (not random)
    # A copy input (hyflash.drafters.copy) of suffix matches up to this long; 0 = none. With --init, a drafter
    # without one gains it, starting at zero (so at step 0 it drafts exactly as before).
    copy_ngram: int = 0
    copy_gate: bool = False  # the copy input's learned bonus on each candidate's logit (grown at zero with --init)
    # ----- optimisation -----
    steps: int = 1000
    batch_size: int = 8  # sequences per step, all processes together
    anchors: int = 48  # blocks per sequence
    max_length: int = 2048  # longer sequences keep their last max_length tokens
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss: str = "ce"  # ce: position-weighted cross-entropy | kl: KL to the target's distribution
    gamma: float = 4.0  # slot weights exp(-(k-1)/gamma); DFlash uses 7 for B=16
    slot_weights: str = "exp"  # exp: exp(-(k-1)/gamma) | survival: running estimate of P(block survives to k)
    # bf16 autocast for the drafter's forward/backward (fp32 master weights). None: where bf16 is fast, on a GPU
    # or a CPU whose bf16 matrix products beat float32's (AMX), measured at the start (`calibration.bf16_matmul_pays`).
    autocast: bool | None = None
    seed: int = 0
    # ----- acceptance-aware on-policy term (hyflash/training/onpolicy.py); weight 0 = off -----
    onpolicy_weight: float = 0.0  # loss = CE (or KL) + weight * REOPOLD policy-gradient on sampled drafts
    onpolicy_temperature: float = 1.0  # decoding temperature whose acceptance is optimised
    reward_floor: float = -2.0  # REOPOLD reward clipping floor (None-like values: use a very negative one)
    entropy_top_fraction: float = 1.0  # keep this fraction of draft tokens by drafter entropy (phase II)
    switch_step: int = 0  # steps of REOPOLD phase I (only tokens with reward >= floor count)
    onpolicy_objective: str = "reopold"  # reopold: sampled credit | acceptance: exact sum_v min(p, q) per slot
    # ----- where the features come from -----
    feature_backend: str = "transformers"  # transformers | llama.cpp: the backend the drafter will run on
    feature_gguf: str = ""  # with llama.cpp: the .gguf whose features to train on ("" = the model's own file)
    # Compute the features with the target loaded in this dtype, then cast them to `dtype` ("" = `dtype` itself).
    # float32 for a bfloat16 run on a CPU without native bf16 (AVX2 only): 6x faster there. Bookkeeping, not
    # recipe: the cache files both under `dtype`'s key, as `hyflash data --feature-dtype` does.
    feature_compute_dtype: str = ""
    # ----- bookkeeping -----
    feature_cache: str = ""  # folder to cache target features in; "" = compute them every step
    save_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 0  # held-out tau by real speculative decoding every N steps (0 = only at the end)
    eval_at: str = ""  # comma list of further steps to evaluate at (e.g. log-spaced, for a scaling curve)
    eval_prompts: int = 6
    eval_seed: int = 1  # picks the held-out prompts; fixed, so runs with other --seed values are comparable
    eval_new_tokens: int = 64
    save_dtype: str = "bfloat16"  # dtype of the exported drafter weights
    threads: int = 0  # torch threads per process; 0 = torch's default
    plot: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise HyflashError(f"bad training config: {message}")

        need(self.loss in ("ce", "kl"), f"loss must be ce or kl, got {self.loss!r}")
        need(self.slot_weights in ("exp", "survival"), f"slot_weights must be exp or survival, got {self.slot_weights!r}")
        need(not (self.init and self.init_from_target),
             "--init (a trained drafter) and --init-from-target (the target's layers) exclude each other")
        need(not (self.init and (self.hidden_size or self.num_heads or self.intermediate_size)),
             "--hidden-size, --num-heads and --intermediate-size shape a new drafter: an --init drafter keeps its own")
        need(self.steps >= 1 and self.batch_size >= 1 and self.anchors >= 1, "steps, batch_size, anchors must be >= 1")
        need(self.block_size >= 2, f"block_size must be >= 2, got {self.block_size}")
        need(self.max_length > self.block_size, "max_length must exceed block_size")
        need(0 <= self.warmup_steps, "warmup_steps must be >= 0")
        need(self.onpolicy_weight >= 0, "onpolicy_weight must be >= 0")
        need(self.onpolicy_temperature > 0, "onpolicy_temperature must be > 0")
        need(self.onpolicy_objective in ("reopold", "acceptance"),
             f"onpolicy_objective must be reopold or acceptance, got {self.onpolicy_objective!r}")
        need(self.feature_backend in ("transformers", "llama.cpp"),
             f"feature_backend must be transformers or llama.cpp, got {self.feature_backend!r}")
        need(self.feature_backend == "transformers" or self.loss == "ce",
             "--loss kl needs the target's logits at every slot, which training computes with the transformers "
             "backend only: use --loss ce with --feature-backend llama.cpp")
        need(self.feature_compute_dtype in ("", "float32", "bfloat16", "float16"),
             f"feature_compute_dtype must be float32, bfloat16 or float16, got {self.feature_compute_dtype!r}")
        need(not self.feature_compute_dtype or (self.feature_backend == "transformers" and self.loss == "ce"),
             "--feature-compute-dtype is for the transformers backend's features with --loss ce (--loss kl takes "
             "the target's logits from its own pass)")
        need(not self.feature_gguf or self.feature_backend == "llama.cpp",
             "--feature-gguf is a llama.cpp file: add --feature-backend llama.cpp")
        need(self.copy_ngram >= 0, f"copy_ngram must be >= 0, got {self.copy_ngram}")
        need(not (self.copy_ngram or self.copy_gate) or (self.loss == "ce" and self.onpolicy_weight == 0),
             "--copy-ngram and --copy-gate train with --loss ce and no on-policy term: the pointer's column has "
             "no target distribution (kl) and on-policy sampling does not reach it yet")
        need(not self.copy_gate or self.copy_ngram or self.init,
             "--copy-gate is part of the copy input: add --copy-ngram N (or --init a drafter that has one)")
        need(self.save_dtype in ("bfloat16", "float32", "float16"), f"unknown save_dtype {self.save_dtype!r}")
        try:
            steps = self.eval_steps()
        except ValueError:
            steps = [-1]
        need(all(s >= 1 for s in steps), f"--eval-at must be a comma list of steps >= 1, got {self.eval_at!r}")

    def eval_steps(self) -> set[int]:
        return {int(s) for s in self.eval_at.split(",") if s.strip()}

    def fingerprint(self) -> dict:
        """What a checkpoint must agree with to be resumed: everything that shapes the trajectory."""
        out = asdict(self)
        for name in BOOKKEEPING:
            out.pop(name)
        return out

    def onpolicy(self):
        """The on-policy settings as the objective's own config (None when the mode is off)."""
        if self.onpolicy_weight <= 0:
            return None

        credit = CreditConfig(self.reward_floor, self.entropy_top_fraction, self.switch_step)
        return OnPolicyConfig(self.onpolicy_weight, self.onpolicy_temperature, credit,
                              objective=self.onpolicy_objective)

    def drafter_overrides(self) -> dict:
        return {
            "kind": self.kind,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "block_size": self.block_size,
            "window": self.window,
            "chunk_size": self.chunk_size,
            "memory_rule": self.memory_rule,
            "draft_vocab_size": self.draft_vocab_size or None,
            "copy_ngram": self.copy_ngram,
            "copy_gate": self.copy_gate,
        }
