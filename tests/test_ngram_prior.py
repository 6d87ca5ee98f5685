"""The n-gram lookup's prior acceptance (measured by match length and slot), the offline replay that compares
policy settings without timing noise, and the measurement behind the prior (experiments/never_slower/)."""

from __future__ import annotations

import torch

from experiments.never_slower.ngram_prior import count
from experiments.never_slower.replay import ReplayTarget, TimedLookup, replay
from hyflash.costs import CostCurve
from hyflash.drafters.ngram import ACCEPTANCE_PRIOR, NgramDrafter
from hyflash.policy import PolicyConfig
from hyflash.sampling import SamplingConfig
from hyflash.training.data import write_dataset


def _drafted(history: list[int], last: int, k: int = 7):
    lookup = NgramDrafter()
    lookup.ingest(torch.tensor(history))
    return lookup.draft(last, k, SamplingConfig())


def test_the_lookups_prior_reads_the_measured_table_by_match_length_and_slot():
    # ... 5 6 | 9 ... 5 6 -> a 2-token match: its first slot is the weak one, the later ones follow the table.
    two = _drafted([5, 6, 9, 10, 11, 12, 13, 14, 15, 1, 5], 6)
    assert two.tokens.tolist() == [9, 10, 11, 12, 13, 14, 15]
    assert two.confidence.tolist() == torch.tensor(ACCEPTANCE_PRIOR[1]).tolist()
    assert two.confidence[0] < 0.5 < two.confidence[1]
    # A long repeated run matches 12 tokens or more: the last row, and slots past the table read its last column.
    run = list(range(20, 40))
    long = _drafted(run + run[:-1], run[-1], k=9)
    assert long.tokens.tolist() == run[:9]
    assert long.confidence.tolist() == torch.tensor([ACCEPTANCE_PRIOR[-1][0]] * 9).tolist()
    assert NgramDrafter().max_ngram == len(ACCEPTANCE_PRIOR)


def test_the_measurement_counts_each_slot_reached_and_accepted_by_match_length(tmp_path):
    # Prompt 1 2 3 4 1 2; the target wrote 3 4 7. At 2: the 2-token match "1 2" drafts 3 4 1: slots 1-2
    # accepted, slot 3 reached and rejected (7). Then at 7: no earlier 7, nothing drafted.
    write_dataset(tmp_path, [[1, 2, 3, 4, 1, 2, 3, 4, 7]], [6], {"vocab_size": 16})
    reached, accepted, sequences = count(tmp_path, max_ngram=4)
    assert sequences == 1
    assert dict(reached) == {(2, 0): 1, (2, 1): 1, (2, 2): 1}
    assert dict(+accepted) == {(2, 0): 1, (2, 1): 1}


def _flat_then_steep(plain: float = 10.0) -> CostCurve:
    return CostCurve("m", "q4", [0], [[plain, 16.0, 19.0, 22.0, 25.0, 28.0, 31.0, 34.0]], None, 0.0, {"cpu": "test"},
                     None, [plain])


def test_the_replay_follows_the_greedy_path_and_times_passes_by_the_curve():
    curve = _flat_then_steep()
    prompt, truth = list(range(1, 30)), list(range(1, 30))  # the continuation repeats the prompt: copyable
    clock = [0.0]
    target = ReplayTarget(prompt, truth, curve, clock, vocab=64, loop_ms=0.0)
    out = target.prefill(torch.tensor(prompt))
    assert int(out.logits[-1].argmax()) == truth[0]
    scored = target.score(torch.tensor([truth[0], truth[1], 99]), features=False)
    assert scored.logits.argmax(-1).tolist() == truth[1:4] and clock[0] == 19.0
    result = replay(prompt, truth, curve, lambda clock, ms: TimedLookup(clock, ms), PolicyConfig(), vocab=64,
                    loop_ms=0.0, lookup_ms=0.0)
    assert result.plain_ms == 10.0 * (len(truth) - 1)  # one plain pass a token after the first
    assert result.tau > 2 and result.speedup > 1.5  # the lookup copies the repeat
