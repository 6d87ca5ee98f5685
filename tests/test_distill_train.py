"""Distillation on tiny random models: tasks, rollouts, teacher scoring (same and cross vocabulary), every
method's training step, checkpoint + exact resume, and the CLI."""

from __future__ import annotations

import functools
import itertools
import json

import pytest
import torch
from conftest import tiny_llama

from hyflash.corpora import humaneval_problems
from hyflash.distill import rollout, tasks
from hyflash.distill.student import char_tokenizer, save_model, truncate_layers
from hyflash.distill.trainer import METHODS, DistillConfig, Trainer
from hyflash.errors import HyflashError


@pytest.fixture(scope="module")
def models():
    teacher = tiny_llama(seed=0, vocab=97, layers=4)
    student = truncate_layers(teacher, 2)
    return teacher, student, char_tokenizer()


# ----- tasks ----------------------------------------------------------------------------------------------
def test_arithmetic_splits_are_disjoint_and_answers_check():
    train = tasks.arithmetic_split("train", 300, seed=1)
    test_a = tasks.arithmetic_split("test", 80, seed=1)
    test_b = tasks.arithmetic_split("test", 80, seed=2)
    assert not {p.question for p in train} & ({p.question for p in test_a} | {p.question for p in test_b})
    assert [p.question for p in test_a] != [p.question for p in test_b]  # the seed picks the problems
    assert test_a == tasks.arithmetic_split("test", 80, seed=1)  # and is deterministic
    assert {p.level for p in train} == {1, 2, 3}
    for p in train[:50]:
        assert eval(p.question) == p.answer  # the question is a plain Python expression
        assert tasks.is_correct(p, p.solution) and p.prompt.startswith(tasks.FEW_SHOT)
        assert not tasks.is_correct(p, p.solution.replace(str(p.answer), str(p.answer + 1)))
    assert tasks.extract_answer(" 3 + 4 = 7. Answer: 7\nQ: 1 + 1\nA: Answer: 2") == 7
    assert tasks.extract_answer(" no answer here") is None
    with pytest.raises(HyflashError):
        tasks.arithmetic_split("dev", 3, 0)


def test_humaneval_runs_in_a_limited_subprocess():
    problem = humaneval_problems()["HumanEval/0"]
    run = functools.partial(tasks.check_humaneval, problem, allow_code_execution=True)
    assert run(problem["canonical_solution"]).status == "passed"
    assert run("    return False\n").status == "failed"
    assert run("    while True:\n        pass\n", timeout=1.0).status == "timeout"
    hog = "    x = bytearray(2 << 30)\n    return False\n"  # 2 GiB: over the memory limit
    assert run(hog, memory_mb=256).status == "failed"


def test_humaneval_pass_at_1_pipeline(models):
    from hyflash.distill.trainer import evaluate_humaneval

    _, student, tok = models
    scores = evaluate_humaneval(student, tok, limit=2, max_new_tokens=4, allow_code_execution=True)
    assert scores == {"pass@1": 0.0, "problems": 2}


def test_humaneval_pass_at_1_scores_canonical_solutions_1_and_wrong_ones_0(monkeypatch):
    """The scorer itself: a "model" that writes each problem's canonical solution passes all of them, and one
    that gets every other problem wrong scores 0.5 (the random-model test above would pass a scorer that
    fails everything)."""
    from types import SimpleNamespace

    from hyflash.distill import trainer

    problems = humaneval_problems()
    by_prompt = {p["prompt"]: p["canonical_solution"] for p in problems.values()}
    wrong = set()

    def writes_solutions(model, tokenizer, prompts, *args, **kwargs):
        return SimpleNamespace(texts=[("    return None\n" if p in wrong else by_prompt[p]) + "\ndef unrelated():\n"
                                      for p in prompts])  # text past a stop sequence is cut off

    monkeypatch.setattr(trainer.rollout, "sample", writes_solutions)
    tok = SimpleNamespace(eos_token_id=None)
    assert trainer.evaluate_humaneval(None, tok, limit=6, allow_code_execution=True) == {"pass@1": 1.0, "problems": 6}
    wrong.update(p["prompt"] for p in list(problems.values())[1:4:2])
    assert trainer.evaluate_humaneval(None, tok, limit=4, allow_code_execution=True) == {"pass@1": 0.5, "problems": 4}


# ----- rollouts and teacher scoring ------------------------------------------------------------------------
def test_rollout_log_probs_match_the_training_pass(models):
    """Sampling (cached, step by step, left-padded) and the training pass (one batched forward) must agree
    on positions and padding: the sampled tokens' log-probs are the same."""
    _, student, tok = models
    prompts = [p.prompt for p in tasks.arithmetic_split("train", 4, 0)]
    gen = torch.Generator().manual_seed(0)
    r = rollout.sample(student, tok, prompts, max_new_tokens=10, temperature=1.0, generator=gen)
    assert len({len(tok(p)["input_ids"]) for p in prompts}) > 1  # the batch really has padding
    with torch.no_grad():
        logits = rollout.response_logits(student, r.ids, r.attention_mask, r.prompt_len)
    logp = torch.log_softmax(logits, -1).gather(-1, r.response[..., None]).squeeze(-1)
    torch.testing.assert_close(logp[r.valid], r.sampling_logp[r.valid], rtol=1e-4, atol=1e-4)
    for row, text in enumerate(r.texts):
        assert text == tok.decode(r.response[row][r.valid[row]].tolist(), skip_special_tokens=True)
        assert "\n" not in text[:-1]  # stops at the first newline


def test_credit_by_spans():
    student = [(0, 2), (2, 3), (3, 7)]
    assert rollout.credit_by_spans(student, [1, 2, 3, 5, 7], [1, 2, 4, 8, 16]) == [3, 4, 24]
    assert rollout.credit_by_spans(student, [0, 9], [1, 2]) == [1, 0, 2]  # out-of-range ends are kept


def test_cross_vocab_scoring(models):
    teacher, student, tok = models
    prompts = [p.prompt for p in tasks.arithmetic_split("train", 3, 5)]
    r = rollout.sample(student, tok, prompts, 8, temperature=1.0, generator=torch.Generator().manual_seed(1))
    # Same tokenizer through the text path: identical to direct scoring up to the first special token (it
    # decodes to no text, so no teacher can score it, and the text context differs after it).
    direct, _ = rollout.teacher_scores(teacher, r)
    via_text = rollout.teacher_scores_cross_vocab(teacher, tok, tok, r)
    special = r.response < 3
    clean = r.valid & (special.long().cumsum(1) == 0)
    assert special[r.valid].any() and clean.sum() > 8  # both cases occur in this batch
    torch.testing.assert_close(via_text[clean], direct[clean], rtol=1e-4, atol=1e-4)
    assert torch.all(via_text[special] == 0)
    # A pair tokenizer: credit summed per student token equals the teacher's log-prob of the whole text.
    pair_tok = char_tokenizer(width=2)
    pair_teacher = tiny_llama(seed=3, vocab=len(pair_tok), layers=2)
    credited = rollout.teacher_scores_cross_vocab(pair_teacher, pair_tok, tok, r)
    for row in range(len(prompts)):
        p_ids = pair_tok(prompts[row])["input_ids"]
        t_ids = pair_tok(r.texts[row], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = pair_teacher(torch.tensor([p_ids + t_ids])).logits[0, len(p_ids) - 1 : -1]
        total = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t_ids)[:, None]).sum()
        assert float(credited[row].sum()) == pytest.approx(float(total), rel=1e-4, abs=1e-4)
        assert torch.all(credited[row][~r.valid[row]] == 0)


# ----- training ---------------------------------------------------------------------------------------------
def _config(tmp_path, method, **kw):
    base = dict(method=method, out=str(tmp_path / method), steps=2, batch_size=3, max_new_tokens=6,
                eval_every=2, eval_size=4, checkpoint_every=2, lr=1e-3, switch_step=1, train_pool=40)
    base.update(kw)
    return DistillConfig(**base)


def _trainer(models, config, **kw):
    import copy

    teacher, student, tok = models
    return Trainer(config, copy.deepcopy(student), tok, teacher, tok, **kw)


def _one_right_per_three(monkeypatch):
    """A checker that passes every third answer it is asked about: each group of three consecutive samples
    has exactly one reward, so every GRPO group is informative (a random tiny model never answers right)."""
    calls = itertools.count()
    monkeypatch.setattr(tasks, "is_correct", lambda problem, response: next(calls) % 3 == 0)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_and_logs(models, tmp_path, method, monkeypatch):
    if method == "grpo":
        _one_right_per_three(monkeypatch)
    trainer = _trainer(models, _config(tmp_path, method, grpo_group_size=3))
    before = [p.detach().clone() for p in trainer.student.parameters() if p.requires_grad]
    evals = trainer.run(progress=False)
    after = [p for p in trainer.student.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    log = [json.loads(l) for l in (tmp_path / method / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and [r["samples"] for r in log] == [3, 6]
    for key in {"sft": ("loss", "entropy"), "grpo": ("loss", "entropy", "kl")}.get(method, ("loss", "entropy",
                                                                                      "reward_q50")):
        assert all(torch.isfinite(torch.tensor(r[key])) for r in log)
    if method == "reopold":
        assert log[0]["phase"] == 1 and log[1]["phase"] == 2
        assert {"kept_fraction", "clipped_fraction", "reward_q05"} <= set(log[1])
    assert [e["samples"] for e in evals] == [0, 6]


def test_every_method_has_its_own_colour_in_the_plots():
    """A method without one is drawn in matplotlib's next colour, its seed mean in another than its seeds (the
    GRPO runs' mean was drawn in REOPOLD's red)."""
    from hyflash.distill.plots import COLORS

    assert set(METHODS) <= set(COLORS) and len(set(COLORS.values())) == len(COLORS)


def test_a_group_is_drawn_in_one_colour_on_both_panels(tmp_path, monkeypatch):
    """Groups not named after a method (an extension, a reference run) each keep one colour for their seeds, mean
    and entropy lines (matplotlib's cycle gave each line another)."""
    import matplotlib.figure

    from hyflash.distill.plots import plot_runs

    groups = {}
    for name in ("self", "cross-vocab", "reopold"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "eval.jsonl").write_text("".join(json.dumps({"samples": 16 * i, "accuracy": 0.1 * i}) + "\n"
                                                   for i in range(3)))
        (folder / "train.jsonl").write_text("".join(json.dumps({"samples": i, "entropy": 0.5}) + "\n"
                                                    for i in range(6)))
        groups[name] = [str(folder)]
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    plot_runs(groups, str(tmp_path / "plot.png"))
    colours = {}
    for ax in figures[0].axes:
        for line in ax.get_lines():
            name = (line.get_label() or "").split(" (")[0]
            if name in groups:
                colours.setdefault(name, set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()) and len(colours) == 3
    assert len({c.pop() for c in colours.values()}) == 3


def test_checkpoint_and_exact_resume(models, tmp_path):
    kw = dict(steps=4, updates_per_rollout=2, checkpoint_every=2, eval_every=10)
    straight = _trainer(models, _config(tmp_path / "a", "reopold", **kw))
    straight.run(progress=False)
    half = _trainer(models, _config(tmp_path / "b", "reopold", **dict(kw, steps=2)))
    half.run(progress=False)
    with pytest.raises(HyflashError):  # an existing run is never silently overwritten
        _trainer(models, _config(tmp_path / "b", "reopold", **kw))
    resumed = _trainer(models, _config(tmp_path / "b", "reopold", **kw), resume=True)
    assert resumed.step == 2 and resumed.samples_seen == 6
    resumed.run(progress=False)
    for (name, a), (_, b) in zip(straight.student.state_dict().items(), resumed.student.state_dict().items()):
        assert torch.equal(a, b), name
    strip = lambda path: [{k: v for k, v in json.loads(l).items() if k != "seconds"}
                          for l in path.read_text().splitlines()]
    # The weights above are bit-identical; logged statistics may differ in the last float bits (a mean over the
    # rebuilt bf16 sampling copy can reduce in another order after a reload, seen after other test files ran).
    for x, y in zip(strip(tmp_path / "a/reopold/train.jsonl"), strip(tmp_path / "b/reopold/train.jsonl"), strict=True):
        assert x.keys() == y.keys() and x == pytest.approx(y, rel=1e-6, abs=1e-9), \
            {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)}
    assert not (tmp_path / "b/reopold/checkpoint.tmp").exists()


def test_grpo_groups_reference_and_exact_resume(models, tmp_path, monkeypatch):
    """GRPO: G consecutive samples per prompt, no teacher, KL exactly 0 before the first update and > 0 after
    it, and a run stopped and resumed ends bit-identical to a straight one (the KL reference stays the
    starting student, not the checkpoint the run resumed from)."""
    kw = dict(steps=4, batch_size=6, grpo_group_size=3, checkpoint_every=2, eval_every=10, kl_coef=0.5)
    # A checker that depends on the answer only (as the real one does), so a resumed run sees the same rewards.
    monkeypatch.setattr(tasks, "is_correct", lambda problem, response: sum(map(ord, response)) % 2 == 0)
    straight = _trainer(models, _config(tmp_path / "a", "grpo", **kw))
    assert straight.teacher is None and straight.reference is not None
    problems, _ = straight._batch(0)
    assert [p.question for p in problems[:3]] == [problems[0].question] * 3 != [p.question for p in problems[3:]]
    straight.run(progress=False)
    half = _trainer(models, _config(tmp_path / "b", "grpo", **dict(kw, steps=2)))
    half.run(progress=False)
    resumed = _trainer(models, _config(tmp_path / "b", "grpo", **kw), resume=True)
    resumed.run(progress=False)
    for (name, a), (_, b) in zip(straight.student.state_dict().items(), resumed.student.state_dict().items()):
        assert torch.equal(a, b), name
    log = [json.loads(l) for l in (tmp_path / "b/grpo/train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and log[-1]["samples"] == 24
    assert log[0]["kl"] == pytest.approx(0, abs=1e-7)
    assert log[0]["informative_groups"] > 0 and all(r["kl"] > 0 for r in log[1:])  # moved after the 1st update
    no_kl = _trainer(models, _config(tmp_path / "c", "grpo", **dict(kw, kl_coef=0.0)))
    assert no_kl.reference is None and "kl" not in no_kl.train_step()
    with pytest.raises(HyflashError, match="group"):
        _config(tmp_path, "grpo", batch_size=4, grpo_group_size=3)


def test_linear_lr_decay_is_a_function_of_the_step(models, tmp_path):
    """lr_decay linear: step k (0-based) updates at lr * (1 - 0.9 k / steps), also after a resume with more
    steps than the run started with (how the cpu REOPOLD teacher was continued)."""
    kw = dict(steps=2, checkpoint_every=1, eval_every=10, lr_decay="linear")
    first = _trainer(models, _config(tmp_path, "sft", sft_source="ground-truth", **kw))
    first.run(progress=False)
    assert first.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.9 * 1 / 2))
    more = _trainer(models, _config(tmp_path, "sft", sft_source="ground-truth", **dict(kw, steps=4)), resume=True)
    more.run(progress=False)
    assert more.step == 4 and more.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.9 * 3 / 4))
    with pytest.raises(HyflashError, match="lr-decay"):
        _config(tmp_path, "sft", lr_decay="cosine")


def test_full_distribution_methods_refuse_another_vocabulary(models, tmp_path):
    teacher, student, tok = models
    pair_tok = char_tokenizer(width=2)
    pair_teacher = tiny_llama(seed=3, vocab=len(pair_tok), layers=2)
    with pytest.raises(HyflashError, match="reopold or opd"):
        Trainer(_config(tmp_path, "gkd"), student, tok, pair_teacher, pair_tok)
    trainer = Trainer(_config(tmp_path, "reopold"), student, tok, pair_teacher, pair_tok)
    assert trainer.cross_vocab
    assert torch.isfinite(torch.tensor(trainer.train_step()["loss"]))


def test_cli_distill_end_to_end(models, tmp_path):
    from hyflash.cli import main

    teacher, student, tok = models
    save_model(teacher, tok, tmp_path / "teacher")
    save_model(student, tok, tmp_path / "student")
    out = tmp_path / "run"
    argv = ["distill", "--method", "opd", "--teacher", str(tmp_path / "teacher"), "--student",
            str(tmp_path / "student"), "--out", str(out), "--steps", "2", "--batch-size", "2",
            "--max-new-tokens", "5", "--eval-every", "1", "--eval-size", "4", "--teacher-dtype", "float32"]
    assert main(argv) == 0
    assert (out / "accuracy.png").exists() and (out / "checkpoint" / "model.safetensors").exists()
    assert len((out / "eval.jsonl").read_text().splitlines()) == 3
    assert main(argv) == 2  # exists: needs --resume
    assert main(argv[:-6] + ["--steps", "3", "--eval-every", "1", "--eval-size", "4", "--resume",
                             "--teacher-dtype", "float32"]) == 0
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3


def test_cli_grpo_passes_its_settings(models, tmp_path):
    from hyflash.cli import main

    _, student, tok = models
    save_model(student, tok, tmp_path / "student")
    out = tmp_path / "run"
    argv = ["distill", "--method", "grpo", "--student", str(tmp_path / "student"), "--out", str(out), "--steps", "1",
            "--batch-size", "4", "--group-size", "2", "--kl-coef", "0.1", "--max-new-tokens", "4", "--eval-every", "1",
            "--eval-size", "2", "--no-plot"]
    assert main(argv) == 0  # no teacher is loaded (the default teacher is a built-in the test never fetches)
    config = json.loads((out / "checkpoint" / "state.json").read_text())["config"]
    assert (config["method"], config["grpo_group_size"], config["kl_coef"]) == ("grpo", 2, 0.1)
    bad = [str(tmp_path / "bad") if a == str(out) else "3" if a == "2" else a for a in argv]
    assert main(bad) == 2  # a group size that does not divide the batch: one clear error
