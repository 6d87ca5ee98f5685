"""Replay greedy generations offline: the real decode loop, policy and n-gram lookup against a target that already
knows its greedy continuation, timed by a calibrated cost curve instead of the wall clock (issue 36).

The suite's timings move by 6-9% from run to run on these machines, as much as the margin the bar leaves, so two
policy settings cannot be told apart by timing them. Greedy decoding has one continuation whatever the drafts, so
a generation can be replayed exactly from its plain text: `ReplayTarget` scores a block by putting the known next
token at each row's argmax, and advances a fake clock by c(q) at the cache's length (`hyflash calibrate`'s curve:
the same numbers the policy plans with). What the replay measures is the policy's own arithmetic: which drafts it
verifies, how many are rejected, the guard's fall-backs and pauses; what it leaves out is the noise, and the
n-gram lookup's own time (a constant per step: --lookup-ms, measured ~0.05 ms at 6k tokens).

    python -m experiments.never_slower.replay --curve RESULTS.json --data data/smollm2-135m/train-v3 [--max 200]
    python -m experiments.never_slower.replay --curve RESULTS.json --suite RESULTS.json

--curve: a bench's results.json (its cost curve, meta.cost_curve). --data: target-written training sequences
(greedy ones: their prompt and first --max-new-tokens generated tokens); --suite: a never-slower bench's plain
greedy runs (prompts re-encoded from the set). Prints, per n-gram prior, the speed-up over plain decoding
(total plain time / total time), its minimum and median over sequences, and τ.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from hyflash import decoding
from hyflash.bench.replay import greedy_logits
from hyflash.costs import CostCurve
from hyflash.decoding import generate
from hyflash.drafters.ngram import NgramDrafter
from hyflash.policy import PolicyConfig, SpeculationPolicy
from hyflash.targets.base import TargetOutput
from hyflash.training.data import TokenDataset


class ReplayTarget:
    """A target whose greedy continuation of `prompt` is `truth` (rows from `greedy_logits`, as hyflash bench
    --replay's target answers). Its passes cost c(q) of `curve` at the cache's length (plain(ctx) for a one-token
    pass without features) on `clock`."""

    def __init__(self, prompt: list[int], truth: list[int], curve: CostCurve, clock: list[float], vocab: int,
                 loop_ms: float):
        self.sequence = torch.tensor(list(prompt) + list(truth))
        self.curve, self.clock, self.vocab, self.loop_ms = curve, clock, vocab, loop_ms
        self.device = torch.device("cpu")
        self.max_context = len(self.sequence) + 64
        self.eos_token_ids: set[int] = set()
        self.tokenizer = None
        self.cache_length = 0
        self.reused_tokens = 0  # a replay keeps no prompt between generations

    def prefill(self, prompt, on_features=None, features=True, feature_free=False, resumable=None) -> TargetOutput:
        n = len(prompt)
        if on_features is not None:
            on_features(torch.as_tensor(prompt), None)
        self.cache_length = n
        return TargetOutput(greedy_logits(self.sequence, torch.as_tensor(prompt)[-1:], n - 1, self.vocab), None)

    def score(self, block: torch.Tensor, features: bool = True, tree=None) -> TargetOutput:
        q, context = len(block), self.cache_length
        self.clock[0] += self.curve.score_ms(q, context, features) + self.loop_ms
        self.cache_length += q
        return TargetOutput(greedy_logits(self.sequence, torch.as_tensor(block), context, self.vocab), None)

    def keep(self, position: int, kept: list[int]) -> None:
        self.cache_length = position + len(kept)

    def drop_features_ms(self) -> float:
        return 0.0

    def drop_features(self) -> None:
        pass


class TimedLookup(NgramDrafter):
    """The n-gram lookup, charging `lookup_ms` of the fake clock per proposal."""

    def __init__(self, clock: list[float], lookup_ms: float, **kw):
        super().__init__(**kw)
        self.clock, self.lookup_ms = clock, lookup_ms

    def propose(self, *args, **kw):
        self.clock[0] += self.lookup_ms
        return super().propose(*args, **kw)


class GeometricLookup(TimedLookup):
    """The lookup as it was before 2026-12-05: prior acceptance 1 - 0.6^n in every slot (matches up to 3 tokens)."""

    @staticmethod
    def confidence(n: int, length: int) -> torch.Tensor:
        return torch.full((length,), 1 - 0.6**n)


@dataclass
class Replayed:
    plain_ms: float
    ms: float
    tau: float
    policy: dict

    @property
    def speedup(self) -> float:
        return self.plain_ms / self.ms


def replay(prompt: list[int], truth: list[int], curve: CostCurve, make_drafter, config: PolicyConfig,
           vocab: int, loop_ms: float = 0.15, lookup_ms: float = 0.05, policy: SpeculationPolicy | None = None,
           forget: float = 0.0) -> Replayed:
    """One greedy generation of len(truth) tokens, plain and with the drafter make_drafter(clock) returns; with
    `policy`, the speculative one carries on with that policy (what it learned about acceptance so far), as the
    bench and a server do, else with a fresh one, as `hyflash generate` does; `forget`: the share of that policy's
    acceptance counts dropped before the generation (0: all kept, as the library does)."""
    times, tau, stats = [], 1.0, {}
    for with_drafter in (False, True):
        clock = [0.0]
        decoding._clock = lambda: clock[0] / 1000
        try:
            target = ReplayTarget(prompt, truth, curve, clock, vocab, loop_ms)
            drafter = make_drafter(clock, lookup_ms) if with_drafter else None
            used = policy if policy is not None and with_drafter else SpeculationPolicy(curve, config)
            if used is policy and forget:  # keep 1 - forget of what earlier generations taught the calibrator
                for counts in (used.calibrator.accepted, used.calibrator.reached):
                    for key in counts:
                        counts[key] *= 1 - forget
            result = generate(target, prompt, drafter, max_new_tokens=len(truth), stop_at_eos=False, policy=used)
        finally:
            decoding._clock = decoding.time.perf_counter
        if result.tokens != list(truth):
            raise AssertionError("the replay left the greedy path: the loop or the target is wrong")
        times.append(1000 * (result.total_time - result.prefill_time))
        tau, stats = (result.tau, result.policy) if with_drafter else (tau, stats)
    return Replayed(times[0], times[1], tau, stats)


def data_sequences(folder: Path, new_tokens: int, limit: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, first new_tokens greedy target-written tokens) of a `hyflash data` folder's unsampled sequences."""
    data = TokenDataset(folder)
    out = []
    for sequence, start, sampled in zip(data.sequences, data.gen_start, data.sampled):
        if not sampled and len(sequence) - start >= new_tokens:
            out.append((sequence[:start].tolist(), sequence[start : start + new_tokens].tolist()))
        if len(out) >= limit:
            break
    return out


def suite_sequences(results: Path) -> list[tuple[str, list[int], list[int]]]:
    """(item id, prompt ids, plain greedy tokens) of a never-slower bench's greedy plain runs."""
    from hyflash.bench.datasets import load_set
    from hyflash.targets import load_target

    data = json.loads(results.read_text())
    runs = [r for r in data["runs"] if r["method"] == "plain" and r["temperature"] == 0.0]
    target = load_target(data["meta"]["config"]["model"], "auto", backend="llama.cpp")
    items = {i.item_id: i for i in load_set("never-slower", target, 3, data["meta"]["config"]["max_new_tokens"])}
    return [(r["item_id"], list(items[r["item_id"]].ids), r["tokens"]) for r in runs]


# name -> (lookup class, its settings): the prior before 2026-12-05, and the measured one (the default now).
PRIORS = {"geometric-3": (GeometricLookup, dict(max_ngram=3)), "geometric-12": (GeometricLookup, {}),
          "measured-3": (TimedLookup, dict(max_ngram=3)), "measured-12": (TimedLookup, {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curve", type=Path, required=True, help="a bench results.json whose cost curve to use")
    parser.add_argument("--data", type=Path, help="a `hyflash data` folder of the same target")
    parser.add_argument("--suite", type=Path, help="a never-slower bench results.json (its greedy plain runs)")
    parser.add_argument("--max", type=int, default=200, help="sequences from --data")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--priors", default=",".join(PRIORS), help=f"which of {', '.join(PRIORS)}")
    parser.add_argument("--carry", action="store_true",
                        help="one policy through all sequences, in order (as the bench runs them), not one each")
    parser.add_argument("--uncapped", action="store_true",
                        help="drafts not bounded by the loss budget left (the policy before 2026-12-05)")
    parser.add_argument("--start-tokens", type=int, default=PolicyConfig.loss_budget_start_tokens,
                        help="the guard's start budget in tokens' worth (PolicyConfig.loss_budget_start_tokens)")
    parser.add_argument("--loss-budget", type=float, default=PolicyConfig.loss_budget,
                        help="the guard's loss budget, a share of plain time (PolicyConfig.loss_budget)")
    parser.add_argument("--forget", type=float, default=0.0,
                        help="--carry: the share of the acceptance counts dropped before each sequence (0: none)")
    parser.add_argument("--worst", type=int, default=3, help="--data: show this many slowest sequences")
    parser.add_argument("--loop-ms", type=float, default=0.15, help="the loop's own time a step")
    parser.add_argument("--lookup-ms", type=float, default=0.05, help="the n-gram lookup's time a proposal")
    args = parser.parse_args()
    if not 0 <= args.forget <= 1:
        parser.error(f"--forget is a share of the counts, from 0 to 1; got {args.forget}")
    if args.forget and not args.carry:
        parser.error("--forget drops what a carried policy learned: add --carry (a fresh policy has nothing to forget)")
    if args.uncapped:
        SpeculationPolicy.affordable_length = lambda self, pass_cost, limit: limit
    curve = CostCurve.from_dict(json.loads(args.curve.read_text())["meta"]["cost_curve"])
    if args.suite:
        named = suite_sequences(args.suite)
    else:
        named = [(str(i), p, t) for i, (p, t) in enumerate(data_sequences(args.data, args.max_new_tokens, args.max))]
    vocab = 1 + max(max(p + t) for _, p, t in named)
    print(f"{len(named)} sequences; curve {curve.model} {curve.machine.get('backend', '')} c(1..4) at "
          f"{curve.contexts[0]}: {[round(curve.cost(q, curve.contexts[0]), 2) for q in range(1, 5)]}")
    for name in args.priors.split(","):
        kind, settings = PRIORS[name]
        config = PolicyConfig(loss_budget=args.loss_budget, loss_budget_start_tokens=args.start_tokens)
        carried = SpeculationPolicy(curve, config) if args.carry else None
        rows = [replay(p, t, curve, lambda clock, ms: kind(clock, ms, **settings), config,
                       vocab, args.loop_ms, args.lookup_ms, carried, args.forget) for _, p, t in named]
        total = sum(r.plain_ms for r in rows) / sum(r.ms for r in rows)
        speedups = [r.speedup for r in rows]
        print(f"{name:14s} total {total:.3f}x  min {min(speedups):.3f}x  median {statistics.median(speedups):.3f}x  "
              f"below 0.97: {sum(s < 0.97 for s in speedups)}  tau {statistics.mean(r.tau for r in rows):.2f}")
        shown = zip(named, rows) if args.suite else sorted(zip(named, rows), key=lambda x: x[1].speedup)[:args.worst]
        for (item, _, _), r in shown:
            print(f"   {item:60s} {r.speedup:.3f}x  tau {r.tau:.2f}  lengths {r.policy['draft_lengths']}  "
                  f"guard {r.policy['guard']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
