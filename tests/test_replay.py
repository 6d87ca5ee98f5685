"""Acceptance replay (hyflash/bench/replay.py): a drafter replayed against one recorded greedy decode commits and
accepts exactly what real speculative decoding with it does, while the replay's target does no work."""

from __future__ import annotations

import json

import pytest
import torch
from test_drafter_model import make

from hyflash.bench.replay import ReplayTarget, record_greedy
from hyflash.decoding import generate
from hyflash.drafters.base import Draft
from hyflash.drafters.ngram import NgramDrafter
from hyflash.drafters.oracle import TargetGreedyDrafter
from hyflash.drafters.state import DrafterState
from hyflash.errors import HyflashError


class SometimesWrong(TargetGreedyDrafter):
    """The target's greedy continuation with some drafted tokens changed (accepted runs of 0-2 tokens); which
    ones depends on the sign of the newest feature row, so features off by a row change what is accepted."""

    needs_features = True

    def __init__(self, model, block_size: int = 6):
        super().__init__(model, block_size)

    def reset(self) -> None:
        super().reset()
        self.calls, self.sign = 0, 0

    def ingest(self, tokens, features=None) -> None:
        assert features is not None and features.shape[0] == tokens.shape[0]
        super().ingest(tokens)
        self.sign = int(features[-1].float().sum() > 0)

    def draft(self, last_token, num_tokens, sampling, generator=None) -> Draft:
        tokens = super().draft(last_token, num_tokens, sampling, generator).tokens.clone()
        self.calls += 1
        wrong = (self.calls * (1 + self.sign) + torch.arange(len(tokens))) % 3 == 0
        tokens[wrong] = (tokens[wrong] + 1) % self.model.config.vocab_size
        return Draft(tokens=tokens)


def _prompt(target, n=24, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, target.vocab_size, (n,), generator=g).tolist()


def _drafters(target):
    return {
        "sometimes-wrong": lambda: SometimesWrong(target.model),
        "ngram": lambda: NgramDrafter(block_size=6),
        "network": lambda: DrafterState(make(target, dtype=torch.float32, seed=1)),
    }


@pytest.mark.parametrize("name", ["sometimes-wrong", "ngram", "network"])
def test_replay_commits_and_accepts_what_real_speculative_decoding_does(llama_target, name):
    prompt = _prompt(llama_target)
    recording, plain = record_greedy(llama_target, prompt, max_new_tokens=40)
    assert recording.tokens == generate(llama_target, prompt, None, max_new_tokens=40).tokens == plain.tokens

    real = generate(llama_target, prompt, _drafters(llama_target)[name](), max_new_tokens=40)
    replayed = generate(ReplayTarget(llama_target, recording), prompt, _drafters(llama_target)[name](),
                        max_new_tokens=40)
    assert replayed.tokens == real.tokens == recording.tokens
    assert replayed.committed_per_pass == real.committed_per_pass
    assert replayed.accepted_by_position == real.accepted_by_position
    assert replayed.drafted_by_position == real.drafted_by_position
    if name == "sometimes-wrong":  # partial acceptance: the replay is not trivially all-accept or all-reject
        assert 1.3 < replayed.tau < 5.5
        # ... and the features matter: the same replay with every feature row one position late differs
        late = type(recording)(recording.prompt, recording.tokens, torch.roll(recording.features, 1, 0))
        shifted = generate(ReplayTarget(llama_target, late), prompt, SometimesWrong(llama_target.model),
                           max_new_tokens=40)
        assert shifted.committed_per_pass != real.committed_per_pass


def test_recorded_features_are_the_targets_features(llama_target):
    prompt = _prompt(llama_target, n=10)
    recording, _ = record_greedy(llama_target, prompt, max_new_tokens=8)
    sequence = torch.tensor(recording.sequence[:-1])
    full = llama_target.prefill(sequence, features=True).features
    assert recording.features.shape == full.shape
    assert torch.allclose(recording.features, full, atol=1e-4)


def test_replay_refuses_what_it_cannot_answer(llama_target):
    prompt = _prompt(llama_target)
    recording, _ = record_greedy(llama_target, prompt, max_new_tokens=8)
    replay = ReplayTarget(llama_target, recording)
    with pytest.raises(HyflashError, match="not the recorded one"):
        replay.prefill(prompt[:-1])
    with pytest.raises(HyflashError, match="left its recording"):  # a longer generation than the recording
        generate(replay, prompt, NgramDrafter(block_size=4), max_new_tokens=20)
    replay.prefill(prompt)
    with pytest.raises(HyflashError, match="chains only"):
        replay.score(torch.tensor([recording.tokens[0], 1]), tree=(torch.ones(2, 2, dtype=torch.bool), torch.arange(2)))
    wrong_root = (recording.tokens[0] + 1) % llama_target.vocab_size
    with pytest.raises(HyflashError, match="left its recording"):  # sampling can leave the greedy text
        replay.score(torch.tensor([wrong_root]))


def test_bench_replay_measures_what_the_real_bench_measures(tmp_path):
    """`hyflash bench --replay` gives every drafter the tau and acceptance of a real greedy bench on the same
    prompts, reports no speeds, skips other libraries' loops, and refuses settings a replay cannot honour."""
    from bench_fixtures import word_target

    from hyflash.bench.report import write_report
    from hyflash.bench.run import BenchConfig, run_bench
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel

    target = word_target()
    torch.manual_seed(0)
    folder = DrafterModel(DrafterConfig.for_target(target, kind="hyflash", window=16), target).save_pretrained(
        tmp_path / "d")
    settings = dict(sets=("prose", "code"), n=2, max_new_tokens=24, temperatures=(0.0,), adaptive=False,
                    methods=("plain", "ngram", "hf-plain"), drafters={"d": str(folder)}, memory_contexts=())
    real = run_bench(BenchConfig(**settings), target=target, log=lambda _: None)
    replayed = run_bench(BenchConfig(**settings, replay=True), target=target, out_dir=tmp_path / "replay",
                         log=lambda _: None)

    assert replayed["skipped"] == {"hf-plain": "--replay runs hyflash's own loop only"}
    rows = {(r["set"], r["method"]): r for r in real["summary"]}
    assert {(r["set"], r["method"]) for r in replayed["summary"]} == {k for k in rows if k[1] != "hf-plain"}
    assert any(rows[(s, "ngram")]["tau"] > 1.2 for s in ("prose", "code"))  # something to replay
    for r in replayed["summary"]:
        assert r["tau"] == rows[(r["set"], r["method"])]["tau"]
        assert r["acceptance_by_position"] == rows[(r["set"], r["method"])]["acceptance_by_position"]
        assert r["tokens_per_second"] is None and r["speedup"] is None and r["draft_share"] is None
    assert all(r["replayed"] and "identical_to_plain" not in r for r in replayed["runs"])
    assert json.loads((tmp_path / "replay" / "results.json").read_text())["meta"]["config"]["replay"] is True
    written = [p.name for p in write_report(replayed, tmp_path / "replay")]  # the report takes a speedless bench
    assert "table.md" in written and "speedup.png" not in written
    assert "Acceptance replay" in (tmp_path / "replay" / "table.md").read_text()

    with pytest.raises(HyflashError, match="--temperatures 0 .*--no-adaptive"):
        BenchConfig(sets=("prose",), temperatures=(0.0, 1.0), replay=True)


def test_greedy_logits_point_at_the_known_text_and_reject_past_its_end():
    from hyflash.bench.replay import greedy_logits

    sequence = torch.tensor([1, 2, 3, 4])
    assert greedy_logits(sequence, torch.tensor([1, 2, 3]), 0, 10).argmax(-1).tolist() == [2, 3, 4]
    # from position 2 only one next token (4) is known: the draft tokens checked after it (7, then the last row's
    # own) are rejected, whatever they are
    rows = greedy_logits(sequence, torch.tensor([3, 4, 7]), 2, 10)
    assert rows.argmax(-1).tolist() == [4, 8, 8] and rows.shape == (3, 10)
    assert greedy_logits(sequence, torch.tensor([4, 9, 9]), 3, 10).argmax(-1).tolist() == [0, 0, 0]  # 9 + 1 wraps
