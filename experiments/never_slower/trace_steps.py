"""Where a `--drafter default` generation loses to plain decoding, step by step (issue 36).

Runs plain and default generations of the prompts (of the never-slower set unless `--set` names another) named on
the command line, twice each, with a fresh policy per generation as `hyflash generate` has (`--shared-policy`: one
policy for all, as the bench and the server keep it), and prints per default generation the time of its steps by
kind (speculative: a draft verified; probe: the loop drafted but verified nothing; plain: the guard's plain steps),
each split into drafting, the target pass, and the drafter's ingest, plus its first 30 steps as
(draft length, accepted, draft ms, verify ms, ingest ms, step ms, drafter retired, guard's plain steps left).

    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.trace_steps [--backend llama.cpp] \
        prose:sortedcontainers:128 chat:0          (--temperature 0.7: sampled, plain and default with one seed a pair)
    ../shared/bin/heavy .venv/bin/python -m experiments.never_slower.trace_steps --model qwen2.5-coder-1.5b \
        --set chat-wild --n 12 terse-dedupe
"""

from __future__ import annotations

import argparse

from hyflash import engine
from hyflash.bench.datasets import load_set
from hyflash.decoding import generate
from hyflash.machine import set_torch_threads
from hyflash.policy import PolicyConfig, SpeculationPolicy
from hyflash.sampling import SamplingConfig


def traced_policy(curve, keep_drafter: bool = False) -> tuple[SpeculationPolicy, list[tuple]]:
    policy, trace = SpeculationPolicy(curve, PolicyConfig.for_run(keep_drafter=keep_drafter)), []
    observe = policy.observe

    def recording(plan, n_accepted, context=0, times=None, **rest):
        trace.append((0 if plan is None else len(plan.tokens), n_accepted, round(times.draft, 2),
                      round(times.verify, 2), round(times.ingest, 2), round(times.total, 2),
                      policy.retired_at is not None, policy.guard.idle_left if policy.guard else None))
        return observe(plan, n_accepted, context, times, **rest)

    policy.observe = recording
    return policy, trace


def by_kind(trace: list[tuple]) -> dict[str, list[float]]:
    """steps, draft, verify, ingest and total ms per kind of step."""
    kinds: dict[str, list[float]] = {}
    for k, _, draft, verify, ingest, total, _, _ in trace:
        kind = "speculative" if k else ("probe" if draft > 0.05 else "plain")
        row = kinds.setdefault(kind, [0, 0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((1, draft, verify, ingest, total)):
            row[i] += value
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="+", help="item ids of the set, e.g. chat:0")
    parser.add_argument("--set", default="never-slower", help="the bench set the prompts come from (chat-wild: "
                        "issue 37's hand-written requests)")
    parser.add_argument("--n", type=int, default=3,
                        help="prompts the set is built with (issue 37 benched chat-wild with 12)")
    parser.add_argument("--backend", default="llama.cpp")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto", help="float32 for the suite's transformers runs")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=30, help="steps of each default generation to print")
    parser.add_argument("--keep-drafter", action="store_true", help="as generate --keep-drafter: never retire it")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the suite runs 0 and 0.7)")
    parser.add_argument("--shared-policy", action="store_true",
                        help="one policy for all default generations, as the bench and the server have (what one "
                        "generation learns and retires carries into the next)")
    args = parser.parse_args()
    set_torch_threads()
    target, drafter, _, choice = engine.load(args.model, args.dtype, "default", backend=args.backend)
    items = {item.item_id: item for item in load_set(args.set, target, args.n, args.max_new_tokens)}
    missing = [p for p in args.prompts if p not in items]
    if missing:
        parser.error(f"not in the {args.set} set built with --n {args.n}: {missing}; it has {sorted(items)}")
    shared = traced_policy(choice.curve, args.keep_drafter) if args.shared_policy else None
    for item_id in args.prompts:
        for seed, (name, used) in enumerate((("plain", None), ("default", drafter)) * 2):
            policy, trace = shared if shared and used else traced_policy(choice.curve, args.keep_drafter)
            trace.clear()  # (a shared policy's trace holds the generation before)
            result = generate(target, list(items[item_id].ids), used, max_new_tokens=args.max_new_tokens,
                              sampling=SamplingConfig(temperature=args.temperature), seed=seed // 2, policy=policy)
            decode_s = result.total_time - result.prefill_time
            print(f"== {item_id} {name}: decode {1000 * decode_s:.0f} ms, {result.target_passes} passes, "
                  f"{len(result.tokens) / decode_s:.1f} tok/s")
            if used is not None:
                for kind, (steps, draft, verify, ingest, total) in by_kind(trace).items():
                    print(f"   {kind}: {steps:.0f} steps, draft {draft:.1f} + pass {verify:.1f} + ingest {ingest:.1f}"
                          f" = {total:.1f} ms")
                print(f"   first {args.steps} steps:", trace[:args.steps])
                print("   policy:", result.policy)
                print(f"   idle drafter share of a step at the end: {policy.idle_drafter_share():.4f} (ingest of a "
                      f"one-token step {policy.live.idle_ingest_ms():.2f} ms, features "
                      f"{choice.curve.feature_ms or 0.0:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
