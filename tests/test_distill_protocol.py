"""The decisive REOPOLD experiment: the chain task's exact checker and disjoint splits, samples-to-reach on
smoothed curves and the verdict on synthetic curves, the summary's fields, the trainer pieces the protocol
added (early stop, valid-token normalisation, robust logs), and a tiny end-to-end run that is killed and
resumed to the same summary."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.reopold import reach
from experiments.reopold.__main__ import main as reopold_main
from experiments.reopold.protocol import best_learning_rate, grid_score, pick_layers, rate_past_the_edge
from experiments.reopold.report import build_summary, results_table
from experiments.reopold.scales import SCALES, get_scale
from hyflash import credit
from hyflash.distill import losses, tasks
from hyflash.errors import HyflashError

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ("teacher_accuracy", "start_accuracy", "eval_size", "seeds_per_method", "curves",
            "opd_improved_over_start", "samples_to_reach_ratio", "samples_to_reach_ratio_ci", "within_one_third")


# ----- the task ---------------------------------------------------------------------------------------------
def test_chain_checker_is_exact():
    problems = tasks.chain_split("test", 200, seed=0, levels=(1, 2, 3))
    assert {p.level for p in problems} == {1, 2, 3}
    for p in problems:
        assert eval(p.question) == p.answer and len(p.steps) == p.level  # the question is plain Python
        for step in p.steps:  # every worked step is right, and the last one ends at the answer
            lhs, rhs = step.split("=")
            assert eval(lhs) == int(rhs) >= 0
        assert p.steps[-1].endswith(f"={p.answer}")
        assert p.check(p.solution) and tasks.is_correct(p, p.solution)
        for wrong in (p.answer + 1, p.answer - 1):
            assert not p.check(p.solution.replace(f"Answer: {p.answer}", f"Answer: {wrong}"))
    p = problems[0]
    assert p.check(f" anything. Answer: {p.answer}")  # only the final answer is graded
    assert not p.check(f" Answer: {p.answer}0")  # a longer number is another number
    assert not p.check(f" Answer: {p.answer}.5")
    assert not p.check(f" Answer: {p.answer} or so")
    assert not p.check(f" no answer\nAnswer: {p.answer}")  # only the first line counts
    assert not p.check("")


def test_chain_splits_are_disjoint_and_deterministic():
    train = tasks.chain_split("train", 5000, seed=0)
    val, test = tasks.chain_split("val", 500, seed=0), tasks.chain_split("test", 600, seed=0)
    other_test = tasks.chain_split("test", 600, seed=7)
    q = lambda ps: {p.question for p in ps}  # noqa: E731
    assert len(q(train)) == 5000 and len(q(test)) == 600  # distinct within a split
    assert not q(train) & (q(val) | q(test) | q(other_test)) and not q(val) & q(test)
    assert test == tasks.chain_split("test", 600, seed=0) and q(test) != q(other_test)
    assert all(tasks.chain_split_of(p.question) == "test" for p in other_test)
    assert tasks.chain_split("train", 100, seed=0) == train[:100]  # the runs' pool is part of the teacher's
    with pytest.raises(HyflashError, match="unknown split"):
        tasks.chain_split("dev", 3, 0)
    with pytest.raises(HyflashError, match="unknown task"):
        tasks.task_split("sorting", "test", 3, 0, (1,))


# ----- samples-to-reach and the verdict ---------------------------------------------------------------------
XS = [64 * i for i in range(33)]  # 2,048 samples, an evaluation every 64


def _ramp(samples_to_full: float, start: float = 0.1, gain: float = 0.5) -> list[float]:
    return [min(1.0, start + gain * x / samples_to_full) for x in XS]


def _seeds(curve: list[float], spread: float = 0.04) -> list[list[float]]:
    return [[v * (1 + e) for v in curve] for e in (-spread, 0.0, spread)]


def test_smoothing_keeps_linear_trends_and_damps_spikes():
    line = [0.1 + 0.01 * i for i in range(10)]
    assert reach.smooth(line, 5) == pytest.approx(line)  # centred: no shift of a trend
    spiky = [0.1] * 10
    spiky[3] = 0.7
    smoothed = reach.smooth(spiky, 3)
    assert smoothed[0] == 0.1 and max(smoothed) == pytest.approx(0.3)


def test_samples_to_reach_reads_the_smoothed_curve():
    """A single lucky evaluation must not count as reaching a level: the raw curve crosses 0.5 at its spike
    (128 samples), the smoothed one only where the real rise is."""
    curve = [0.1 + 0.5 * max(0.0, x - 1024) / 1024 for x in XS]
    curve[2] = 0.65
    assert reach.samples_to_reach(XS, curve, 0.5) == pytest.approx(128 - 64 * 0.15 / 0.55)
    at = reach.samples_to_reach(XS, reach.smooth(curve, 3), 0.5)
    assert at > 1500
    out = reach.compare(XS, {"opd": [curve] * 3, "reopold": [curve] * 3}, eval_size=1000)
    assert out["methods"]["opd"]["samples_to_reach"] > 1500  # compare() smooths before reading


def test_three_times_sooner_gives_ratio_three_with_an_interval():
    opd, fast = _ramp(2048), _ramp(2048 / 3)  # REOPOLD gains as much in a third of the samples
    out = reach.compare(XS, {"opd": _seeds(opd), "reopold": _seeds(fast), "sft": [opd] * 3}, eval_size=1000)
    assert out["opd_improved_over_start"] is True
    assert out["level"] == pytest.approx(0.1 + 0.9 * 0.5)
    assert out["reopold_vs_opd"]["ratio"] == pytest.approx(3.0)
    lo, hi = out["reopold_vs_opd"]["ci"]
    assert lo < 3.0 < hi and hi - lo > 0.05  # the seeds' spread shows in the interval
    assert out["within_one_third"] is False and out["direction"] == "confirmed"
    assert out["methods"]["sft"]["ratio_vs_opd"] == pytest.approx(1.0)
    assert out["methods"]["opd"]["samples_to_reach"] == pytest.approx(0.9 * 2048)


def test_one_seed_gives_no_direction_however_far_apart():
    """Resampling a single seed gives an interval of zero width: three times sooner on one seed each is a ratio,
    not a direction."""
    opd, fast = _ramp(2048), _ramp(2048 / 3)
    out = reach.compare(XS, {"opd": [opd], "reopold": [fast], "grpo": _seeds(opd)}, eval_size=1000)
    assert out["reopold_vs_opd"]["ratio"] == pytest.approx(3.0) and out["direction"] == "too few seeds"
    assert out["pairs"]["reopold_vs_grpo"]["direction"] == "too few seeds"
    two = reach.compare(XS, {"opd": _seeds(opd)[:2], "reopold": _seeds(fast)[:2]}, eval_size=1000)
    assert two["direction"] == "confirmed"


def test_identical_curves_are_within_one_third():
    out = reach.compare(XS, {"opd": _seeds(_ramp(2048)), "reopold": _seeds(_ramp(2048))}, eval_size=1000)
    assert out["reopold_vs_opd"]["ratio"] == pytest.approx(1.0)
    lo, hi = out["reopold_vs_opd"]["ci"]
    assert lo <= 1.0 <= hi
    assert out["within_one_third"] is True and out["direction"] == "within noise"


def test_slower_and_undefined_verdicts():
    never = [0.1] * len(XS)
    slow = reach.compare(XS, {"opd": _seeds(_ramp(2048)), "reopold": [never] * 3}, eval_size=1000)
    assert slow["reopold_vs_opd"]["ratio"] == 0.0 and slow["methods"]["reopold"]["samples_to_reach"] is None
    assert slow["within_one_third"] is False and slow["direction"] == "refuted"
    # OPD within noise of its start: no level, no ratio, no verdict.
    flat = reach.compare(XS, {"opd": [[0.1 + 0.005 * (i % 2) for i in range(len(XS))]] * 3, "reopold": [never] * 3},
                         eval_size=500)
    assert flat["opd_improved_over_start"] is False
    assert flat["within_one_third"] is None and flat["reopold_vs_opd"] is None
    assert reach.compare(XS, {"reopold": [never]}, eval_size=500)["opd_improved_over_start"] is None


def test_probe_and_grid_choices():
    layers, rule = pick_layers({4: 0.05, 8: 0.22, 12: 0.41}, 0.3)
    assert layers == 8 and rule.startswith("deepest")  # the most capacity that still starts low
    assert pick_layers({4: 0.35, 8: 0.5}, 0.3)[0] == 4  # none starts low enough: the shallowest
    # With a floor: the deepest that can learn (reached it) without starting too high.
    assert pick_layers({4: 0.05, 8: 0.12, 12: 0.41}, 0.3, 0.08) == (8, "deepest student in [0.08, 0.3] after the warm-up")
    layers, rule = pick_layers({4: 0.01, 8: 0.02}, 0.3, 0.08)
    assert layers == 8 and rule.startswith("no candidate reached 0.08")
    assert grid_score([0.1, 0.2, 0.3, 0.4], 1) == pytest.approx(0.3)
    assert best_learning_rate({3e-5: 0.2, 1e-4: 0.4, 3e-4: 0.4}) == 1e-4  # ties: first in grid order
    # A best rate at the grid's edge extends the grid one step past it; a best inside does not.
    assert rate_past_the_edge({3e-5: 0.4, 1e-4: 0.2, 3e-4: 0.1}) == pytest.approx(9e-6)
    assert rate_past_the_edge({3e-5: 0.1, 1e-4: 0.2, 3e-4: 0.3}) == pytest.approx(9e-4)
    assert rate_past_the_edge({3e-5: 0.1, 1e-4: 0.3, 3e-4: 0.2}) is None
    assert rate_past_the_edge({3e-5: 0.0, 1e-4: 0.0, 3e-4: 0.0}) is None  # nothing learned: no direction


@pytest.mark.parametrize("name", ["cpu", "cpu-long", "gpu"])
def test_real_scales_meet_the_issue_bar_by_construction(name):
    # Issue 15's bar: >= 500 held-out problems, >= 3 seeds per method, >= 2,000 student samples per run, a
    # learning-rate grid on its own seed; a preset that cannot meet it wastes hours of CPU before anyone notices.
    scale = get_scale(name)
    assert scale.eval_size >= 500 and len(scale.seeds) >= 3 and scale.samples_per_run >= 2000
    assert {"reopold", "opd"} <= set(scale.methods) and scale.grid_seed not in scale.seeds
    assert len(scale.lr_grid) >= 2 and scale.base == "smollm2-135m"
    assert scale.steps % scale.eval_every == 0 and scale.switch_step < scale.steps
    # GRPO sees the same student samples per run: batch_size samples a step, in whole groups
    assert "grpo" in scale.methods and scale.batch_size % scale.grpo_group_size == 0 and scale.grpo_group_size >= 2


def test_a_method_added_to_an_experiment_is_tuned_and_run_into_its_folder(tmp_path, monkeypatch):
    """A folder written before GRPO existed (its scale without grpo or the grpo settings) is continued, not
    refused: the finished grid entries stay and only the new method is tuned. Any other change is refused."""
    from experiments.reopold.protocol import Experiment, extends

    scale = get_scale("tiny")
    new = json.loads(json.dumps(scale.as_dict()))
    old = {k: v for k, v in new.items() if not k.startswith(("grpo_", "cross_vocab", "self_"))}
    old["methods"] = [m for m in new["methods"] if m != "grpo"]
    assert extends(old, new) and not extends(dict(old, steps=99), new) and not extends(new, old)
    (tmp_path / "scale.json").write_text(json.dumps(old))
    done = {m: {"scores": {"0.001": 0.1}, "chosen_lr": 0.001} for m in old["methods"]}
    (tmp_path / "grid.json").write_text(json.dumps({"seed": 1000, "methods": done}))
    (tmp_path / "probe.json").write_text(json.dumps({"warm_start": "probe/layers-2/checkpoint"}))
    trained = []
    monkeypatch.setattr(Experiment, "_train", lambda self, config, prune=True: trained.append(
        (config.method, config.lr, config.grpo_group_size, config.kl_coef)) or [{"accuracy": 0.0}] * 3)
    experiment = Experiment(tmp_path, scale, progress=False)
    experiment._check_scale()
    assert json.loads((tmp_path / "scale.json").read_text()) == new
    experiment.learning_rate_grid()
    assert trained == [("grpo", lr, 2, scale.grpo_kl_coef) for lr in scale.lr_grid]
    grid = json.loads((tmp_path / "grid.json").read_text())["methods"]
    assert list(grid) == [*old["methods"], "grpo"] and grid["opd"] == done["opd"]
    (tmp_path / "scale.json").write_text(json.dumps(dict(new, steps=99)))
    with pytest.raises(HyflashError, match="other settings"):
        experiment._check_scale()


def test_a_folder_written_in_bf16_goes_on_where_auto_picks_float32(tmp_path, monkeypatch):
    """cpu-long's folder was begun on CPUs with native bf16; its scale now says "auto", so on an AVX2 machine
    (bf16 emulated, several times slower) it continues in float32, and each run's lineage says which."""
    from experiments.reopold.protocol import Experiment, extends
    from hyflash import machine

    monkeypatch.setattr(machine, "bf16_matmul_pays", lambda device: False)
    scale = dataclasses.replace(get_scale("tiny"), rollout_dtype="auto", teacher_dtype="auto")
    new = json.loads(json.dumps(scale.as_dict()))
    old = dict(new, rollout_dtype="bfloat16", teacher_dtype="bfloat16")
    assert extends(old, new) and not extends(new, old)  # a dtype is made "auto", never fixed again
    assert not extends(dict(old, steps=99), new)  # with another change it is still another experiment
    (tmp_path / "scale.json").write_text(json.dumps(old))
    experiment = Experiment(tmp_path, scale, progress=False)
    experiment._check_scale()
    assert json.loads((tmp_path / "scale.json").read_text()) == new
    for name in ("teacher_eval.json", "start_eval.json"):
        (tmp_path / name).write_text(json.dumps({"weights": "abc", "accuracy": 0.5}))
    experiment._write_lineage(tmp_path / "runs" / "opd-seed0")
    lineage = json.loads((tmp_path / "runs" / "opd-seed0" / "lineage.json").read_text())
    assert lineage["dtypes"] == {"rollout_dtype": "float32", "teacher_dtype": "float32"}
    assert experiment._config(method="opd").rollout_dtype == "auto"


def test_extensions_run_at_tiny_scale(tmp_path):
    """Cross-vocabulary (a student over character pairs, the teacher over characters) and self-distillation
    (the teacher is the warm start's own later checkpoint) each run once from the experiment's own stages;
    a second invocation finds both finished and writes the same result."""
    from experiments.reopold.extensions import extensions_table
    from experiments.reopold.extensions import main as extensions_main
    from hyflash.distill.student import load_model, same_vocabulary

    assert extensions_main(["--out", str(tmp_path), "--scale", "tiny", "--no-progress"]) == 0
    result = json.loads((tmp_path / "extensions.json").read_text())
    scale = get_scale("tiny")
    for name in ("cross-vocab", "self"):
        r = result[name]
        assert r["samples"] == [i * scale.eval_every * scale.batch_size for i in range(scale.steps + 1)]
        assert len(r["accuracy"]) == scale.steps + 1 and r["samples_per_run"] == scale.samples_per_run
    ext = tmp_path / "extensions"
    _, student_tok = load_model(str(ext / "cross-vocab" / "warmup" / "checkpoint"))
    _, teacher_tok = load_model(str(tmp_path / "teacher" / "checkpoint"))
    assert not same_vocabulary(student_tok, teacher_tok)
    cross_log = [json.loads(l) for l in (ext / "cross-vocab" / "reopold" / "train.jsonl").read_text().splitlines()]
    assert len(cross_log) == scale.steps and all(r["reward_q05"] < 0 for r in cross_log)  # the teacher scored
    self_config = json.loads((ext / "self" / "reopold" / "config.json").read_text())
    assert self_config["teacher"] == str(ext / "self" / "teacher" / "checkpoint")
    warm_start = tmp_path / json.loads((tmp_path / "probe.json").read_text())["warm_start"]
    assert self_config["student"] == str(warm_start)
    warmed = result["cross-vocab"]["warmup_val_curve"][-1]
    assert f"| cross-vocab | tiny-pairs, warmed up by supervised KD to {warmed:.3f} of validation |" in (
        tmp_path / "extensions.md").read_text()
    assert (tmp_path / "extensions.png").stat().st_size > 0
    # The comparison's REOPOLD run of the same seed, where it exists, is the table's reference row; a gain within
    # two standard errors of one evaluation says so.
    same_vocab = tmp_path / "runs" / "reopold-seed0"
    same_vocab.mkdir(parents=True)
    (same_vocab / "eval.jsonl").write_text(json.dumps({"samples": 0, "accuracy": 0.1}) + "\n"
                                           + json.dumps({"samples": 12, "accuracy": 0.9}) + "\n")
    assert extensions_main(["--out", str(tmp_path), "--scale", "tiny", "--no-progress", "--only", "self"]) == 0
    assert json.loads((tmp_path / "extensions.json").read_text()) == result
    table = (tmp_path / "extensions.md").read_text()
    assert "| reference: the comparison's REOPOLD, seed 0 | the warm start |" in table
    assert "| 0.100 → 0.900 | +0.800 |" in table
    start = result["self"]["start_accuracy"]
    flat = f"| {start:.3f} → {start:.3f} | +0.000 (within noise) |"
    result["self"]["final_accuracy"] = result["self"]["start_accuracy"]
    assert flat in extensions_table(result, tmp_path, scale.eval_size)


def _write_curve(folder: Path, samples: list[int], accuracy: list[float], finished_at: int | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "eval.jsonl").write_text("".join(json.dumps({"samples": x, "accuracy": a}) + "\n"
                                              for x, a in zip(samples, accuracy)))
    if finished_at is not None:  # the checkpoint state of a finished run, which the comparison's report reads
        (folder / "checkpoint").mkdir()
        (folder / "checkpoint" / "state.json").write_text(json.dumps({"step": finished_at}))


def test_grpo_past_the_budget_reads_where_it_reaches_the_comparisons_level(tmp_path):
    """GRPO rising linearly to the level at 4,000 samples, REOPOLD at 1,000 and OPD at 2,000 (linear curves,
    which the centred smoothing keeps): ratios 4 and 2, and a GRPO that never gets there is unbounded."""
    from experiments.reopold.grpo_long import reach_report, results_markdown

    (tmp_path / "summary.json").write_text(json.dumps({"level": 0.5}))
    scale = get_scale("tiny")
    short = [0, 500, 1000, 1500, 2000]
    for seed, wobble in enumerate((-0.01, 0.01)):
        _write_curve(tmp_path / "runs" / f"reopold-seed{seed}", short, [x / 2000 + wobble for x in short], scale.steps)
        _write_curve(tmp_path / "runs" / f"opd-seed{seed}", short, [x / 4000 + wobble for x in short], scale.steps)
        long = list(range(0, 10001, 1000))
        _write_curve(tmp_path / "grpo-long" / f"grpo-seed{seed}", long, [x / 8000 + wobble for x in long])
    r = reach_report(tmp_path, scale)
    assert r["grpo_samples_to_reach"] == pytest.approx(4000) and r["grpo_seeds"] == 2
    assert r["ratios"]["reopold"]["ratio"] == pytest.approx(4.0) and r["ratios"]["opd"]["ratio"] == pytest.approx(2.0)
    lo, hi = r["ratios"]["reopold"]["ci"]
    assert lo < 4.0 < hi < 5  # the seeds' spread, from resampling both sides
    assert "| reopold | 1,000 | 2 | 4.00 [" in results_markdown(r)
    for seed in (0, 1):  # GRPO that stays at the start for all its samples
        _write_curve(tmp_path / "grpo-long-flat" / f"grpo-seed{seed}", long, [0.0 for _ in long])
    (tmp_path / "grpo-long").rename(tmp_path / "grpo-long-rising")
    (tmp_path / "grpo-long-flat").rename(tmp_path / "grpo-long")
    flat = reach_report(tmp_path, scale)
    assert flat["grpo_samples_to_reach"] is None and flat["ratios"]["opd"]["ratio_unbounded"]
    table = results_markdown(flat)
    assert "reached at **never** samples" in table and "| opd | 2,000 | 2 | ∞ [" in table


def test_grpo_past_the_budget_runs_at_tiny_scale(tmp_path):
    """The runs go on from the comparison's warm start and rate for twice its samples; the report says where the
    comparison defines no level (the tiny scale's OPD may gain nothing) instead of inventing one."""
    from experiments.reopold.grpo_long import main as grpo_long_main
    from hyflash.files import read_jsonl

    assert grpo_long_main(["--out", str(tmp_path), "--scale", "tiny", "--no-progress"]) == 2  # no comparison yet
    assert reopold_main(["--out", str(tmp_path), "--scale", "tiny", "--no-progress"]) == 0
    scale = get_scale("tiny")
    rc = grpo_long_main(["--out", str(tmp_path), "--scale", "tiny", "--no-progress", "--budget", "2", "--seeds", "0"])
    assert rc == (0 if json.loads((tmp_path / "summary.json").read_text())["level"] is not None else 2)
    evals = read_jsonl(tmp_path / "grpo-long" / "grpo-seed0" / "eval.jsonl")
    assert evals[-1]["samples"] == 2 * scale.samples_per_run
    config = json.loads((tmp_path / "grpo-long" / "grpo-seed0" / "config.json").read_text())
    assert config["method"] == "grpo" and config["eval_split"] == "test"


def test_a_stage_stopped_by_an_error_still_counts_its_time(tmp_path):
    from experiments.reopold.protocol import Experiment

    experiment = Experiment(tmp_path, get_scale("tiny"), progress=False)

    def interrupted():
        time.sleep(0.05)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        experiment._stage("grid", interrupted)
    experiment._stage("grid", lambda: None)  # the resumed invocation adds to it
    assert json.loads((tmp_path / "timing.json").read_text())["grid"] >= 0.05


# ----- the losses are normalised alike ----------------------------------------------------------------------
def test_valid_normalisation_only_drops_terms():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 6), generator=g)
    valid = torch.ones(3, 6, dtype=torch.bool)
    valid[1, 4:] = False
    teacher_logp = torch.log_softmax(torch.randn(3, 6, 11, generator=g), -1).gather(-1, tokens[..., None])[..., 0]
    logp, entropy = losses.token_logp_entropy(logits, tokens)
    plain = credit.CreditConfig()
    as_opd = losses.reopold_loss(logp, entropy, teacher_logp, valid, 0, plain, normalize="valid").loss
    torch.testing.assert_close(as_opd, losses.opd_loss(logp, teacher_logp, valid))
    masked = credit.CreditConfig(floor=-1.0, entropy_top_fraction=0.25)
    kept = losses.reopold_loss(logp, entropy, teacher_logp, valid, 0, masked, normalize="kept")
    by_valid = losses.reopold_loss(logp, entropy, teacher_logp, valid, 0, masked, normalize="valid")
    # Same terms, other denominator: "kept" divides by the 25% kept, "valid" by every response token.
    torch.testing.assert_close(by_valid.loss, kept.loss * kept.stats["kept_fraction"])
    with pytest.raises(HyflashError, match="normalization"):
        losses.reopold_loss(logp, entropy, teacher_logp, valid, 0, plain, normalize="tokens")


# ----- the summary on synthetic runs ------------------------------------------------------------------------
def _fake_run(folder: Path, curve: list[float], samples: list[int], steps: int) -> None:
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "checkpoint" / "state.json").write_text(json.dumps({"step": steps}))
    (folder / "eval.jsonl").write_text("".join(
        json.dumps({"step": i, "samples": x, "accuracy": a, "mean_tokens": 20.0}) + "\n"
        for i, (x, a) in enumerate(zip(samples, curve))))
    (folder / "train.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "samples": x, "entropy": 0.3}) + "\n" for i, x in enumerate(samples[1:])))


def test_summary_fields_and_verdict_on_synthetic_runs(tmp_path):
    scale = dataclasses.replace(get_scale("gpu"), steps=32, eval_every=1, batch_size=64, bootstrap=300)
    samples = XS
    for method, curve in (("opd", _ramp(2048)), ("reopold", _ramp(2048 / 3)), ("gkd", _ramp(2048)),
                          ("sft", _ramp(4096)), ("grpo", _ramp(4096))):
        for seed, seeded in zip(scale.seeds, _seeds(curve)):
            _fake_run(tmp_path / "runs" / f"{method}-seed{seed}", seeded, samples, scale.steps)
    (tmp_path / "runs" / "gkd-seed2" / "checkpoint" / "state.json").write_text(json.dumps({"step": 5}))  # unfinished
    (tmp_path / "teacher_eval.json").write_text(json.dumps({"accuracy": 0.86}))
    (tmp_path / "start_eval.json").write_text(json.dumps({"accuracy": 0.1}))
    summary = build_summary(tmp_path, scale)
    assert set(REQUIRED) <= set(summary)
    assert summary["seeds_per_method"] == {"reopold": [0, 1, 2], "opd": [0, 1, 2], "grpo": [0, 1, 2], "gkd": [0, 1],
                                           "sft": [0, 1, 2]}
    assert summary["samples_to_reach_ratio"] == pytest.approx(3.0)
    lo, hi = summary["samples_to_reach_ratio_ci"]
    assert lo < 3 < hi and summary["within_one_third"] is False and summary["direction"] == "confirmed"
    assert summary["reach"]["methods"]["sft"]["ratio_vs_opd"] < 1  # SFT learns slower here
    # GRPO never reaches the level (its curve gains half of OPD's by the end): infinitely many samples, so both
    # ratios and their intervals are unbounded above; the pairs come from the same resamples as the verdict
    pairs = summary["pairs"]
    assert set(pairs) == {"reopold_vs_opd", "reopold_vs_grpo", "opd_vs_grpo"}
    assert pairs["reopold_vs_opd"]["ratio"] == summary["samples_to_reach_ratio"]
    assert pairs["reopold_vs_opd"]["ci"] == summary["samples_to_reach_ratio_ci"]
    assert summary["reach"]["methods"]["grpo"]["samples_to_reach"] is None
    for pair in ("reopold_vs_grpo", "opd_vs_grpo"):
        assert pairs[pair]["ratio"] is None and pairs[pair]["ratio_unbounded"] and pairs[pair]["ci_upper_unbounded"]
        assert pairs[pair]["direction"] == "confirmed"
        # censored at the budget (GRPO counted as reaching at the last sample): a finite lower bound that can be
        # set beside the paper's 6.7-12x, with its interval from the same resamples
        method = pair.split("_vs_")[0]
        reached = summary["reach"]["methods"][method]["samples_to_reach"]
        assert pairs[pair]["censored"] == "baseline" and pairs[pair]["censored_at"] == XS[-1]
        assert pairs[pair]["ratio_censored"] == pytest.approx(XS[-1] / reached)
        low, high = pairs[pair]["ci_censored"]
        assert 1 < low <= pairs[pair]["ratio_censored"] <= high < math.inf
    # at GRPO's own final accuracy (0.35, half of OPD's gain): GRPO took all 2,048 samples, REOPOLD (three times
    # OPD's pace) a sixth of them, OPD half
    at_final = {pair: pairs[pair]["at_baseline_final"] for pair in ("reopold_vs_grpo", "opd_vs_grpo")}
    assert at_final["reopold_vs_grpo"]["level"] == pytest.approx(0.35, abs=1e-9)
    assert at_final["reopold_vs_grpo"]["ratio"] == pytest.approx(6.0, rel=0.02)
    assert at_final["opd_vs_grpo"]["ratio"] == pytest.approx(2.0, rel=0.02)
    for at in at_final.values():
        assert at["ci"][0] < at["ratio"] < at["ci"][1] and at["direction"] == "confirmed"
    assert pairs["reopold_vs_opd"]["censored"] is None
    assert pairs["reopold_vs_opd"]["ratio_censored"] == pytest.approx(pairs["reopold_vs_opd"]["ratio"])
    table = results_table(summary)  # the page's table: one row per method, the interval to two decimals
    assert table.count("\n| ") == 7 + 5
    grpo_row = next(line for line in table.splitlines() if line.startswith("| grpo |"))
    assert "| never (within the budget) | — |" in grpo_row  # not a ratio of 0 to OPD
    censored = pairs["reopold_vs_grpo"]
    assert (f"| reopold vs grpo (samples of grpo / samples of reopold) | ∞ [∞, ∞] | "
            f"≥ {censored['ratio_censored']:.2f} [{censored['ci_censored'][0]:.2f}, {censored['ci_censored'][1]:.2f}] "
            f"| confirmed | {at_final['reopold_vs_grpo']['ratio']:.2f} ") in table
    assert f"CI [{lo:.2f}, {hi:.2f}]" in table and "bar met: True" in table
    # a run where no level was reached (as the tiny scale gives) records no ratio, and the page still renders
    undecided = dict(summary, reach=dict(summary["reach"], reopold_vs_opd=None), samples_to_reach_ratio=None)
    assert "ratio —, CI" in results_table(undecided)


# ----- the trainer pieces the protocol relies on ------------------------------------------------------------
def test_early_stop_and_safetensors_optimizer(tmp_path, monkeypatch):
    from hyflash.distill import trainer as trainer_module
    from experiments.reopold.experiment import run_finished
    from hyflash.distill.student import load_model, save_tiny_model

    base = save_tiny_model(tmp_path / "base", layers=2)
    calls = []

    def fake_evaluate(model, tokenizer, problems, max_new_tokens, batch=32):
        calls.append(len(problems))
        return {"accuracy": 0.9 if len(calls) >= 3 else 0.0, "mean_tokens": 1.0}

    monkeypatch.setattr(trainer_module, "evaluate", fake_evaluate)
    config = trainer_module.DistillConfig(
        method="sft", sft_source="ground-truth", student=str(base), out=str(tmp_path / "run"), steps=10,
        batch_size=2, max_new_tokens=4, task="chain", levels=(1,), train_pool=20, eval_split="val", eval_size=4,
        eval_every=1, checkpoint_every=100, stop_at_accuracy=0.85, lr=1e-3)
    trainer = trainer_module.Trainer(config)
    assert trainer.teacher is None  # ground-truth SFT loads no teacher
    trainer.run(progress=False)
    assert trainer.step == 2 and trainer.stopped_early and run_finished(tmp_path / "run", 10)
    ckpt = tmp_path / "run" / "checkpoint"
    assert (ckpt / "optimizer.safetensors").exists() and not list(ckpt.glob("*.pt"))
    resumed = trainer_module.Trainer(config, resume=True)
    assert resumed.step == 2 and resumed.stopped_early
    for key, value in trainer.optimizer.state_dict()["state"][0].items():
        assert torch.equal(value, resumed.optimizer.state_dict()["state"][0][key])
    resumed.run(progress=False)
    assert resumed.step == 2  # an early-stopped run stays stopped
    model, _ = load_model(str(ckpt))
    assert model.config.num_hidden_layers == 2


def test_logs_and_cache_survive_a_line_cut_by_a_kill(tmp_path):
    from hyflash.distill.trainer import TeacherSamples

    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" + '{"prompt": "c", "resp')
    cache = TeacherSamples(path, None, None, 4)
    assert cache.cache == {"a": "b"} and path.read_text().count("\n") == 1


# ----- end to end -------------------------------------------------------------------------------------------
def _strip(summary: dict) -> dict:
    return json.loads(json.dumps(summary))


def _train_logs(out: Path) -> dict:
    logs = {}
    for path in sorted(out.glob("**/train.jsonl")):
        logs[str(path.relative_to(out))] = [{k: v for k, v in json.loads(l).items() if k != "seconds"}
                                            for l in path.read_text().splitlines()]
    return logs


def test_tiny_run_killed_and_resumed_gives_the_same_summary(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert reopold_main(["--out", str(straight), "--scale", "tiny", "--no-progress"]) == 0
    reference = json.loads((straight / "summary.json").read_text())
    assert set(REQUIRED) <= set(reference)
    assert reference["seeds_per_method"] == {m: [0, 1, 2] for m in SCALES["tiny"].methods}
    assert set(reference["curves"]) == set(SCALES["tiny"].methods) and reference["eval_size"] == 8
    assert (straight / "accuracy_entropy.png").stat().st_size > 0 and "| reopold | 3 |" in (
        straight / "results.md").read_text()
    assert json.loads((straight / "task.json").read_text())["overlap"] == {
        k: 0 for k in json.loads((straight / "task.json").read_text())["overlap"]}

    # Kill a second run (SIGKILL, no clean-up) once its comparison runs have checkpointed, then resume it.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.reopold", "--out", str(killed),
                             "--scale", "tiny", "--no-progress"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "runs" / "reopold-seed0" / "checkpoint" / "state.json"
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists() and not (killed / "summary.json").exists(), "the run was not killed midway"
    # A kill between a log append and the next checkpoint leaves logs ahead of it, the last line cut short:
    # made certain here (the kill above lands wherever it lands), the resumed run must drop both.
    step = json.loads(marker.read_text())["step"]
    with (marker.parent.parent / "train.jsonl").open("a") as f:
        f.write(json.dumps({"step": step + 1, "samples": 0, "entropy": 9.0}) + "\n" + '{"step": ')
    assert reopold_main(["--out", str(killed), "--scale", "tiny", "--no-progress"]) == 0
    assert _strip(json.loads((killed / "summary.json").read_text())) == _strip(reference)
    assert _train_logs(killed) == _train_logs(straight)
    # A finished experiment reruns as a no-op, and another scale in the same folder is refused.
    assert reopold_main(["--out", str(killed), "--scale", "tiny", "--no-progress"]) == 0
    assert reopold_main(["--out", str(killed), "--scale", "cpu", "--no-progress"]) == 2


def _as_git_keeps_it(out: Path) -> None:
    """Delete what .gitignore leaves out of a committed experiment folder (weights, the teacher's answers)."""
    tracked = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, capture_output=True,
                             text=True, input="\n".join(f"experiments/reopold/x/{p.relative_to(out)}"
                                                        for p in out.rglob("*") if p.is_file()))
    for line in tracked.stdout.splitlines():
        (out / Path(line).relative_to("experiments/reopold/x")).unlink()
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):  # git holds no empty folders
            folder.rmdir()


def test_a_committed_folder_on_a_new_machine_remakes_only_the_weights_it_needs(tmp_path, monkeypatch):
    """Git keeps a finished run's logs and state but no weights. On a new machine the experiment goes on: a
    finished run is not trained again, an unfinished one starts over, and the teacher and warm start it needs
    are made again; a teacher that comes out different is evaluated again, the record it replaces is kept in
    history.json and its cached answers are remade, and each run's lineage names the weights it learned from."""
    from experiments.reopold import protocol

    out = tmp_path / "x"
    assert reopold_main(["--out", str(out), "--scale", "tiny", "--no-progress"]) == 0
    finished = (out / "runs" / "reopold-seed0" / "train.jsonl").read_text()
    lineage = json.loads((out / "runs" / "reopold-seed0" / "lineage.json").read_text())
    first_teacher = json.loads((out / "teacher_eval.json").read_text())
    assert lineage["teacher"]["weights"] == first_teacher["weights"] and lineage["cpu"]
    assert lineage["warm_start"]["weights"] == json.loads((out / "start_eval.json").read_text())["weights"]
    # One run was cut short (its state at step 1), then the folder went through git to a new machine.
    unfinished = out / "runs" / "opd-seed2"
    state = json.loads((unfinished / "checkpoint" / "state.json").read_text())
    (unfinished / "checkpoint" / "state.json").write_text(json.dumps(dict(state, step=1)))
    (out / "summary.json").unlink()
    _as_git_keeps_it(out)
    assert not (out / "teacher" / "checkpoint").exists() and not (out / "teacher_samples.jsonl").exists()
    assert (unfinished / "checkpoint" / "state.json").exists() and protocol.weights_gone(unfinished)

    # The new machine's teacher differs (as another CPU's would): another seed stands in for it.
    monkeypatch.setattr(protocol, "TEACHER_SEED", protocol.TEACHER_SEED + 1)
    assert reopold_main(["--out", str(out), "--scale", "tiny", "--no-progress"]) == 0
    assert (out / "runs" / "reopold-seed0" / "train.jsonl").read_text() == finished
    teacher = json.loads((out / "teacher_eval.json").read_text())
    assert teacher["weights"] != first_teacher["weights"]
    assert json.loads((out / "history.json").read_text())["teacher_eval"] == [first_teacher]
    assert (out / "teacher_samples.jsonl").exists() and (out / "summary.json").exists()
    assert [json.loads(l)["step"] for l in (unfinished / "train.jsonl").read_text().splitlines()] == list(
        range(1, get_scale("tiny").steps + 1))
    assert json.loads((unfinished / "lineage.json").read_text())["teacher"]["weights"] == teacher["weights"]
    assert json.loads((out / "runs" / "reopold-seed0" / "lineage.json").read_text()) == lineage
    made = json.loads((out / "summary.json").read_text())["lineage"]  # the report says the runs are replicates
    assert made["teachers"] == 2 and made["warm_starts"] == 2 and made["runs"]["reopold-seed0"] == lineage
    assert "learned from 2 teachers and 2 warm starts" in (out / "results.md").read_text()


def test_the_old_hyflash_command_names_the_new_one(tmp_path, capsys):
    """`hyflash reopold-experiment` left the library with the experiment: it runs nothing and says where it went."""
    from hyflash.cli import main

    assert main(["reopold-experiment", "--out", str(tmp_path), "--scale", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "python -m experiments.reopold --out" in err and "--scale tiny" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiny_run_on_cuda(tmp_path):
    assert reopold_main(["--out", str(tmp_path), "--scale", "tiny", "--device", "cuda",
                 "--no-progress"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["scale"]["device"] == "cuda" and summary["seeds_per_method"]["opd"] == [0, 1, 2]


def test_a_raised_accuracy_target_continues_a_run_that_stopped_early(tmp_path):
    """The teacher stopped at its old target (0.85 of validation) counts as unfinished once the target is
    0.9; a run that reached the new target, or its last step, stays finished."""
    import json

    from experiments.reopold.experiment import run_finished

    (tmp_path / "checkpoint").mkdir()
    state = tmp_path / "checkpoint" / "state.json"
    state.write_text(json.dumps({"step": 600, "samples_seen": 9600, "stopped_early": True}))
    (tmp_path / "eval.jsonl").write_text(json.dumps({"step": 600, "accuracy": 0.859}) + "\n")
    assert run_finished(tmp_path, 1200)  # no target given: stopped early is finished
    assert run_finished(tmp_path, 1200, stop_at=0.85)
    assert not run_finished(tmp_path, 1200, stop_at=0.9)
    assert run_finished(tmp_path, 600, stop_at=0.9)  # its last step counts whatever the target
    state.write_text(json.dumps({"step": 600, "samples_seen": 9600, "stopped_early": False}))
    assert not run_finished(tmp_path, 1200, stop_at=0.85)


@pytest.mark.parametrize("pays", [True, False])
def test_teacher_dtype_auto_scores_in_bf16_only_where_bf16_products_pay(tmp_path, monkeypatch, pays):
    # bf16 is emulated on AVX2 CPUs (several times slower there), native with AMX: the default follows the
    # machine's measurement, and a dtype given explicitly is kept whatever the machine.
    from hyflash import machine
    from hyflash.distill import trainer as trainer_module
    from hyflash.distill.student import save_tiny_model

    monkeypatch.setattr(machine, "bf16_matmul_pays", lambda device: pays)
    base = save_tiny_model(tmp_path / "base", layers=2)

    def teacher_dtype(**kw) -> torch.dtype:
        config = trainer_module.DistillConfig(method="opd", teacher=str(base), student=str(base),
                                              out=str(tmp_path / "run" / kw.get("teacher_dtype", "auto")), steps=1,
                                              batch_size=1, max_new_tokens=2, **kw)
        return next(trainer_module.Trainer(config).teacher.parameters()).dtype

    assert trainer_module.DistillConfig().teacher_dtype == "auto"
    assert teacher_dtype() == (torch.bfloat16 if pays else torch.float32)
    assert teacher_dtype(teacher_dtype="float32") == torch.float32
    assert teacher_dtype(teacher_dtype="bfloat16") == torch.bfloat16
    with pytest.raises(HyflashError, match="teacher-dtype"):
        trainer_module.DistillConfig(teacher_dtype="half")

    # The rollout copy follows the same rule under "auto"; a float32 copy is the student itself (on-policy).
    config = trainer_module.DistillConfig(method="opd", teacher=str(base), student=str(base), steps=1, batch_size=1,
                                          max_new_tokens=2, out=str(tmp_path / "rollout"), rollout_dtype="auto")
    trainer = trainer_module.Trainer(config)
    assert next(trainer.fast.parameters()).dtype == (torch.bfloat16 if pays else torch.float32)
    assert (trainer.fast is trainer.student) == (not pays) and trainer._off_policy == pays


def test_bf16_pays_on_an_accelerator_and_auto_resolves_only_auto():
    from hyflash.machine import auto_dtype, bf16_matmul_pays

    assert bf16_matmul_pays(torch.device("cuda")) is True  # decided without touching the device
    assert isinstance(bf16_matmul_pays(torch.device("cpu")), bool)
    assert auto_dtype("float32", torch.device("cuda")) == "float32"
    assert auto_dtype("auto", torch.device("cuda")) == "bfloat16"
