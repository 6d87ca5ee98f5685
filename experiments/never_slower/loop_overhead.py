"""The decode loop's own time per target pass, plain against `--drafter default`, with the target's passes taken
out: each generation runs against a replay of the prompt's greedy decode (`hyflash.bench.replay.ReplayTarget`,
which answers a pass from the recording), so what is timed is the loop, the policy, the n-gram lookup and the
drafter's bookkeeping (issue 36: what the default costs per step where nothing pays).

    python -m experiments.never_slower.loop_overhead [ITEM_ID ...] [--repeats 30] [--profile]

ITEM_ID: prompts of the never-slower set (default: the code and chat prompts at 54-128 tokens). Prints the median
over repeats of (decode time / target passes) per method, and with --profile the default's hottest functions.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import time

from hyflash import engine
from hyflash.bench.datasets import load_set
from hyflash.bench.replay import ReplayTarget, record_greedy
from hyflash.decoding import generate
from hyflash.machine import set_torch_threads

DEFAULT_ITEMS = ("code:hypothesis/hypothesis/extra/redis.py:128", "chat:0")


def per_pass_ms(target, prompt_ids: list[int], drafter, policy, repeats: int, max_new_tokens: int):
    """Median ms of loop time per target pass over `repeats` generations, each from the same policy state."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = generate(target, prompt_ids, drafter, max_new_tokens=max_new_tokens,
                          policy=copy.deepcopy(policy) if policy is not None else None)
        times.append((time.perf_counter() - start - result.prefill_time) / max(1, result.target_passes))
    return 1000 * statistics.median(times), result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="*", default=list(DEFAULT_ITEMS))
    parser.add_argument("--backend", default="llama.cpp")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    set_torch_threads()
    target, drafter, policy, _ = engine.load("smollm2-135m", "auto", "default", backend=args.backend)
    prompts = {p.item_id: p for p in load_set("never-slower", target, 3, args.max_new_tokens)}
    for item in args.items:
        ids = list(prompts[item].ids)
        recording, _ = record_greedy(target, ids, args.max_new_tokens)
        replay = ReplayTarget(target, recording)
        plain_ms, _ = per_pass_ms(replay, ids, None, None, args.repeats, args.max_new_tokens)
        default_ms, result = per_pass_ms(replay, ids, drafter, policy, args.repeats, args.max_new_tokens)
        print(f"{item}: loop time per pass: plain {plain_ms:.3f} ms, default {default_ms:.3f} ms "
              f"(tau {result.tau:.2f}, drafts verified by source {result.policy.get('draft_sources')})")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            per_pass_ms(replay, ids, drafter, policy, 10, args.max_new_tokens)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
