"""Plain autoregressive decoding and lossless speculative decoding, in one short explicit loop.

One iteration = one target pass. The token `next_token` is verified (it was chosen by the target) but not yet
run through the target. The drafter proposes drafts after it; the policy (policy.py) picks one and how many of
its tokens, k, are worth verifying on this machine; the target scores [next_token, d1..dk] in one pass; the
rejection rule keeps a prefix d1..dn and yields one more token (a correction, or the bonus token when all k
survive); the cache is rolled back to the verified prefix; the drafter ingests the newly verified tokens with
their features. Plain decoding is the same loop with k = 0.

Acceptance length tau = tokens committed per target pass, bonus/correction included (DFlash/EAGLE convention).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from hyflash.costs import StepTimes
from hyflash.drafters.base import Draft, Drafter
from hyflash.policy import SpeculationPolicy
from hyflash.sampling import SamplingConfig, logits_to_probs, sample, verify_block
from hyflash.targets import HFTarget
from hyflash.tree import DraftTree, verify_tree

_clock = time.perf_counter  # a module attribute, so tests can run the loop on a clock of their own


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str = ""
    prompt_tokens: int = 0
    target_passes: int = 0  # verification / decode passes after the prefill
    committed_per_pass: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)  # passes in which slot k was drafted
    accepted_by_position: list[int] = field(default_factory=list)  # ... and accepted
    prefill_time: float = 0.0
    cached_prompt_tokens: int = 0  # prompt tokens the prefill took from the target's cache (target.reused_tokens)
    draft_time: float = 0.0  # proposing and ingesting (the drafter's whole share)
    verify_time: float = 0.0  # target passes and the rejection rule
    total_time: float = 0.0
    draft_memory_bytes: int = 0  # at the end of generation (peak for every drafter we ship)
    policy: dict = field(default_factory=dict)  # which draft source was verified how often, draft lengths
    # The best speed-up over plain steps the measured pass costs allow a drafter of the measured acceptance
    # (policy.ceiling); None without a cost curve.
    speedup_ceiling: float | None = None

    @property
    def tau(self) -> float:
        return sum(self.committed_per_pass) / max(1, len(self.committed_per_pass))

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def tokens_per_second(self) -> float:
        # Decode speed: output tokens over time after the prefill, the part speculative decoding speeds up.
        decode_time = self.total_time - self.prefill_time
        return len(self.tokens) / decode_time if decode_time > 0 else float("nan")

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            tau=self.tau,
            acceptance_by_position=self.acceptance_by_position,
            tokens_per_second=self.tokens_per_second,
            new_tokens=len(self.tokens),
        )
        return out


def summarize(results: list[GenerationResult]) -> dict:
    """Totals over several generations: tau, acceptance by position, decode speed, draft time and memory."""
    committed = sum(sum(r.committed_per_pass) for r in results)
    passes = sum(len(r.committed_per_pass) for r in results)
    drafted = [sum(x) for x in zip(*[r.drafted_by_position for r in results if r.drafted_by_position])] or [0]
    accepted = [sum(x) for x in zip(*[r.accepted_by_position for r in results if r.accepted_by_position])] or [0]
    tokens = sum(len(r.tokens) for r in results)
    decode_time = sum(r.total_time - r.prefill_time for r in results)
    return {
        "tau": committed / max(1, passes),
        "acceptance_by_position": [round(a / d, 4) if d else 0.0 for a, d in zip(accepted, drafted)],
        "tokens": tokens,
        "decode_seconds": decode_time,
        "tokens_per_second": tokens / decode_time if decode_time > 0 else float("nan"),
        "draft_seconds": sum(r.draft_time for r in results),
        "draft_memory_bytes": max((r.draft_memory_bytes for r in results), default=0),
    }


def _record_acceptance(result: GenerationResult, drafted: int, accepted: int) -> None:
    while len(result.drafted_by_position) < drafted:
        result.drafted_by_position.append(0)
        result.accepted_by_position.append(0)
    for k in range(drafted):
        result.drafted_by_position[k] += 1
        result.accepted_by_position[k] += int(k < accepted)


def _depth(plan: Draft | DraftTree | None) -> int:
    if plan is None:
        return 0
    return max(plan.depths, default=0) if isinstance(plan, DraftTree) else len(plan.tokens)


def _target_rows(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """What the rejection rule reads. Greedy reads only the argmax: raw logits serve, without warping them into
    one-hot rows of the whole vocabulary (~0.2 ms a row on 49k tokens, 3% of a llama.cpp Q4_1 step)."""
    return logits if sampling.greedy else logits_to_probs(logits, sampling)


def _verify(target: HFTarget, next_token: int, plan, sampling: SamplingConfig, generator, features: bool):
    """One target pass over [next_token] + the plan's tokens. Returns (block, scored, accepted draft tokens,
    indices of the block to keep (0 = next_token), the correction or bonus token, the rows the rejection rule
    read)."""
    device = target.device
    if isinstance(plan, DraftTree):
        block = torch.tensor([next_token] + plan.tokens, device=device)
        scored = target.score(block, features=features, tree=(plan.ancestor_mask(), plan.position_offsets()))
        rows = _target_rows(scored.logits, sampling)
        path, nxt = verify_tree(plan, rows, sampling.greedy, generator)
        return block, scored, [plan.tokens[i] for i in path], [0] + [1 + i for i in path], nxt, rows
    tokens = plan.tokens.to(device) if plan is not None else torch.empty(0, dtype=torch.long, device=device)
    q = None if plan is None or plan.probs is None else plan.probs.to(device)
    block = torch.cat([torch.tensor([next_token], device=device), tokens])
    scored = target.score(block, features=features)
    rows = _target_rows(scored.logits, sampling)
    n, nxt = verify_block(rows, tokens, q, sampling, generator)
    return block, scored, tokens[:n].tolist(), list(range(n + 1)), nxt, rows


def _drafting(drafter: Drafter | None, policy: SpeculationPolicy) -> tuple[Drafter | None, bool]:
    """(what drafts now, whether the target must compute features): the drafter, or what is left of it while
    the policy has its expensive part retired (a hybrid's n-gram lookup; nothing for a network alone)."""
    active = drafter.without_expensive() if drafter is not None and policy.retire_expensive else drafter
    return active, active is not None and active.needs_features


def generate(
    target: HFTarget,
    prompt_ids: list[int] | torch.Tensor,
    drafter: Drafter | None = None,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    on_tokens: Callable[[list[int]], None] | None = None,
    stop_at_eos: bool = True,
    policy: SpeculationPolicy | None = None,
) -> GenerationResult:
    """Generate up to max_new_tokens after the prompt; speculative when a drafter is given.

    Greedy: every token is the argmax of the target's logits in the pass that verified it, so the text is plain
    decoding's wherever a multi-token pass gives bit for bit the logits of one-token passes, and otherwise may
    take the other side of a near-tie and diverge from there. Which targets are bit-identical is measured, not
    assumed (docs/engine.md, "Exactness": SmolLM2's Q4_1 on llama.cpp is; bf16 and K-quant GGUFs such as
    Qwen2.5-Coder's Q4_K_M are not); `hyflash calibrate` checks a given file. Sampling: the output is distributed
    as plain decoding's, exactly. `policy` decides draft source and length (default: verify every draft in
    full, on a flat cost curve).
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).view(-1)
    device = target.device
    generator = torch.Generator(device=device).manual_seed(seed)  # samples on the device the logits live on
    policy = policy or SpeculationPolicy()
    expensive = drafter is not None and drafter.is_expensive
    policy.start_run(reads_features=drafter is not None and drafter.needs_features, context=len(prompt),
                     max_draft=drafter.block_size - 1 if expensive else 0, temperature=sampling.temperature)
    active, want_features = _drafting(drafter, policy)
    # Never run past the model's context: the last committed token needs no target pass of its own.
    max_new_tokens = min(max_new_tokens, target.max_context - len(prompt))
    result = GenerationResult(tokens=[], prompt_tokens=len(prompt))

    start = _clock()
    if drafter is not None:
        drafter.reset()
    if want_features:  # the drafter takes the prompt in piece by piece: its features are never all held at once
        out = target.prefill(prompt, on_features=active.ingest, resumable=active)
    else:
        out = target.prefill(prompt, features=False, feature_free=True)
        if active is not None:
            active.ingest(prompt, None)
    recording = want_features  # the sequence may still be asked for features
    next_token = int(sample(logits_to_probs(out.logits[-1], sampling), generator))
    result.prefill_time = _clock() - start
    result.cached_prompt_tokens = target.reused_tokens
    committed = [next_token]
    if on_tokens:
        on_tokens([next_token])

    while len(committed) < max_new_tokens and not (stop_at_eos and next_token in target.eos_token_ids):
        # k drafts: bounded by the block, by the tokens still wanted and by the model's context; a tree's
        # nodes all take a cache position in its pass, so their count is bounded by the context too.
        context_room = target.max_context - target.cache_length - 1
        room = min(max_new_tokens - len(committed) - 1, context_room)
        position = target.cache_length  # where next_token sits
        t0 = _clock()
        plan = None  # a chain Draft, a DraftTree, or None (a plain step)
        # Once the expensive drafter has not paid this generation, its cheap part (if any) drafts on, and the
        # target stops computing features nobody reads (and, on llama.cpp, moves to its context without them).
        active, want_features = _drafting(drafter, policy)
        if recording and not want_features:
            recording = False
            if policy.worth_dropping_features(max_new_tokens - len(committed), target.drop_features_ms(), position):
                target.drop_features()
        if active is not None and room > 0 and policy.drafting():
            k_max = min(active.block_size - 1, room)
            candidates = active.propose(next_token, k_max, sampling, generator, expensive=policy.wants_draft())
            plan = policy.plan(candidates, position)
            if isinstance(plan, DraftTree):
                plan = plan.first(context_room)
        t1 = _clock()

        block, scored, accepted, kept, next_token, rows = _verify(target, next_token, plan, sampling, generator,
                                                                  want_features)
        target.keep(position, kept)  # the cache keeps the root and the accepted path only
        n_accepted = len(accepted)
        t2 = _clock()
        if active is not None:
            verified_features = None if scored.features is None else scored.features[kept]
            active.ingest(block[kept], verified_features)
        t3 = _clock()

        new = accepted + [next_token]
        if stop_at_eos:
            for i, tok in enumerate(new):
                if tok in target.eos_token_ids:
                    new = new[: i + 1]
                    next_token = tok
                    break
        new = new[: max_new_tokens - len(committed)]
        committed.extend(new)
        result.target_passes += 1
        result.committed_per_pass.append(len(new))
        _record_acceptance(result, _depth(plan), n_accepted)
        if active is not None:  # a plain step drafts nothing: its bookkeeping is not draft time
            result.draft_time += (t1 - t0) + (t3 - t2)
        result.verify_time += t2 - t1
        # The policy corrects its costs by what this step took, and its guard judges whether speculating pays.
        times = StepTimes(1000 * (t1 - t0), 1000 * (t2 - t1), 1000 * (t3 - t2), 1000 * (_clock() - t0))
        policy.observe(plan, n_accepted, position, times, first_row=rows[0])
        if on_tokens:
            on_tokens(new)

    result.total_time = _clock() - start
    result.tokens = committed
    if drafter is not None:
        result.draft_memory_bytes = drafter.memory_bytes()
        result.policy = policy.stats()
        result.speedup_ceiling = policy.ceiling(result.acceptance_by_position)
    if target.tokenizer is not None:
        result.text = target.decode(committed)
    return result
