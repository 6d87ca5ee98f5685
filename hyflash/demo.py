"""`hyflash demo`: plain decoding and speculative decoding side by side on held-out prompts.

The prompts are HumanEval problems in chat format: never used for training, so the drafter sees them fresh.
"""

from __future__ import annotations

import sys

from hyflash import engine
from hyflash.bench.datasets import build_humaneval
from hyflash.decoding import generate
from hyflash.drafters.ngram import NgramDrafter
from hyflash.sampling import SamplingConfig


def run_demo(model: str, drafter_spec: str = "default", prompts: int = 3, max_new_tokens: int = 96,
             backend: str = "transformers", dtype: str = "auto", adaptive: bool = True, tree: int = 0,
             keep_drafter: bool = False, target_options: dict | None = None) -> int:
    """Plain and speculative decoding of `prompts` HumanEval prompts, printed side by side (engine.load's
    arguments otherwise)."""
    print(f"loading {model} on {backend} ...", flush=True)
    target, drafter, policy, choice = engine.load(model, dtype, drafter_spec, adaptive, tree, backend=backend,
                                                  keep_drafter=keep_drafter, target_options=target_options)
    print(f"dtype {choice.dtype} ({choice.reason}); draft length: "
          f"{'adaptive, from the measured cost curve' if adaptive else 'the whole block'}", flush=True)
    dtype = choice.dtype
    name = "n-gram" if isinstance(drafter, NgramDrafter) else drafter_spec
    greedy = SamplingConfig()
    rows = []
    for i, item in enumerate(build_humaneval(target, prompts, max_new_tokens)):
        ids = list(item.ids)
        generate(target, ids[:16], None, max_new_tokens=4)  # warm-up: first calls pay one-off costs
        plain = generate(target, ids, None, max_new_tokens=max_new_tokens, sampling=greedy)
        spec = generate(target, ids, drafter, max_new_tokens=max_new_tokens, sampling=greedy, policy=policy)
        same = plain.tokens == spec.tokens
        speedup = spec.tokens_per_second / plain.tokens_per_second
        rows.append((item.item_id, plain, spec, same, speedup))
        print(f"\n=== prompt {i + 1}: {item.item_id} ({len(ids)} prompt tokens) ===")
        print(spec.text.strip()[:600])
        sources = ", ".join(f"{k} {v}" for k, v in spec.policy.get("draft_sources", {}).items()) or "none"
        print(
            f"--- plain {plain.tokens_per_second:.1f} tok/s | {name} {spec.tokens_per_second:.1f} tok/s "
            f"(x{speedup:.2f}), tau {spec.tau:.2f}, draft memory {spec.draft_memory_bytes / 1024:.1f} KiB, "
            f"same text as plain: {'yes' if same else 'NO'}; drafts verified by source: {sources}"
        )
        if not same:
            diverge = next((j for j, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b),
                           min(len(plain.tokens), len(spec.tokens)))
            print(f"    first difference at token {diverge} (expected in {dtype}: multi-token passes "
                  "round differently; in float32, and on llama.cpp, the outputs are identical)")
    print("\n| prompt | plain tok/s | speculative tok/s | speed-up | tau | draft memory | identical |")
    print("|---|---|---|---|---|---|---|")
    for item_id, plain, spec, same, speedup in rows:
        print(f"| {item_id} | {plain.tokens_per_second:.1f} | {spec.tokens_per_second:.1f} | "
              f"{speedup:.2f}x | {spec.tau:.2f} | {spec.draft_memory_bytes / 1024:.1f} KiB | {same} |")
    sys.stdout.flush()
    return 0
