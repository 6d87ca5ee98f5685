"""`hyflash prompts --self-instruct N`: user requests the model writes itself, given its chat template up to a user
turn (hyflash/training/self_instruct.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hyflash import decoding
from hyflash.decoding import GenerationResult
from hyflash.errors import HyflashError
from hyflash.training.self_instruct import SYSTEMS, SelfInstructConfig, self_instruct, user_turn_prefix
from hyflash.training.user_prompts import read_prompt_file


def test_generation_starts_where_a_real_user_turn_begins(smollm2_fp32):
    """The prefix is, token for token, how the template begins any conversation with that system message, so a
    sample from it is a user turn's content, which the template then closes as it would a person's."""
    target = smollm2_fp32
    for system in SYSTEMS[:2]:
        prefix = user_turn_prefix(target, system)
        whole = target.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                      {"role": "user", "content": "How do I reverse a list?"}],
                                                     add_generation_prompt=False, tokenize=True)
        whole = whole["input_ids"] if hasattr(whole, "keys") else whole
        assert list(whole[: len(prefix)]) == prefix and len(whole) > len(prefix)
        assert target.tokenizer.decode(prefix).endswith("<|im_start|>user\n")


class ScriptedModel:
    """generate() as a model that writes, for attempt k (its seed), script[k]: (text, finished)."""

    def __init__(self, target, script):
        self.target, self.script, self.calls = target, script, []

    def __call__(self, target, prompt_ids, drafter, max_new_tokens, sampling, seed):
        attempt = seed % 1_000_003
        self.calls.append(attempt)
        assert sampling.temperature == 1.0 and drafter is None
        text, finished = self.script[attempt]
        ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        eos = sorted(target.eos_token_ids)[0]
        return GenerationResult(tokens=list(ids) + ([eos] if finished else []), prompt_tokens=len(prompt_ids))


SCRIPT = [("How do I read a CSV file with pandas?", True),
          ("Fix this", True),  # too short to be a request
          ("how do I read a CSV   file with pandas?", True),  # the first again, written differently
          ("Explain what a Python decorator does and when to use one", False),  # cut off: a runaway
          ("Write a function that merges two sorted lists", True),
          ("assistant: Sure, here is the code", True),  # the model answered instead of asking
          ("What does git rebase do, compared with git merge?", True),
          ("Can you review my SQL query for performance problems?", True)]


def test_keeps_finished_usable_new_requests_and_resumes_as_if_never_stopped(smollm2_fp32, tmp_path, monkeypatch):
    model = ScriptedModel(smollm2_fp32, SCRIPT)
    monkeypatch.setattr(decoding, "generate", model)
    whole = tmp_path / "whole.jsonl"
    kept = self_instruct(smollm2_fp32, whole, SelfInstructConfig(num=4), progress=False)
    assert [p.text for p in kept] == [SCRIPT[i][0] for i in (0, 4, 6, 7)]
    assert [p.system for p in kept] == [SYSTEMS[i] for i in (0, 4, 6, 7)]  # each with the system it was asked under
    assert [p.text for p in read_prompt_file(whole)] == [p.text for p in kept]  # what `hyflash data --prompts` reads

    model.calls.clear()
    part = tmp_path / "part.jsonl"
    self_instruct(smollm2_fp32, part, SelfInstructConfig(num=2), progress=False)
    self_instruct(smollm2_fp32, part, SelfInstructConfig(num=4), progress=False)  # the same command, a larger N
    assert model.calls == [0, 1, 2, 3, 4, 5, 6, 7]  # each attempt once: the file is the checkpoint
    assert part.read_text() == whole.read_text()


def test_a_model_that_writes_no_usable_requests_stops_with_what_it_has(smollm2_fp32, tmp_path, monkeypatch):
    monkeypatch.setattr(decoding, "generate", ScriptedModel(smollm2_fp32, [("ok", True)] * 8))
    with pytest.raises(HyflashError, match="only 0 usable prompts in 8 attempts"):
        self_instruct(smollm2_fp32, tmp_path / "p.jsonl", SelfInstructConfig(num=2), progress=False)
    (tmp_path / "other.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(HyflashError, match="not a self-instruct prompt written by hyflash"):
        self_instruct(smollm2_fp32, tmp_path / "other.jsonl", SelfInstructConfig(num=2), progress=False)


def test_a_model_without_a_chat_template_is_refused(llama_target):
    with pytest.raises(HyflashError, match="no chat template"):
        user_turn_prefix(llama_target, SYSTEMS[0])


def test_the_varied_sources_flags_are_refused_with_self_instruct(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hyflash.cli", "prompts", "--self-instruct", "5", "--split", "train",
                           "--out", str(tmp_path / "p.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--split is for the varied source" in done.stderr


def test_the_default_model_writes_requests_people_could_have_written(smollm2_fp32, tmp_path):
    """End to end on SmolLM2-135M-Instruct: real sampled requests, each a finished user turn of a few words."""
    out = tmp_path / "real.jsonl"
    kept = self_instruct(smollm2_fp32, out, SelfInstructConfig(num=3, max_new_tokens=96), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(kept) == len(rows) == 3 and len({p.text for p in kept}) == 3
    assert all(len(p.text.split()) >= 3 and "<|im" not in p.text for p in kept)
    assert [r["messages"][0]["role"] for r in rows] == ["system"] * 3


def test_on_llama_cpp_with_its_own_tokenizer_too(tmp_path):
    """A bare .gguf (a user's Qwen file) brings no Hugging Face tokenizer: llama.cpp's own renders the template and
    parses its special tokens, and generation starts where its user turn begins."""
    from conftest import import_llama_cpp

    import_llama_cpp()
    from hyflash.targets import gguf_path
    from hyflash.targets.llamacpp import LlamaCppTarget, LlamaCppTokenizer

    target = LlamaCppTarget(gguf_path("smollm2-135m"), record_features=False, n_ctx=256)
    assert isinstance(target.tokenizer, LlamaCppTokenizer)
    prefix = user_turn_prefix(target, SYSTEMS[1])
    whole = target.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEMS[1]},
                                                  {"role": "user", "content": "How do I reverse a list?"}],
                                                 add_generation_prompt=False, tokenize=True)
    assert whole[: len(prefix)] == prefix and len(whole) > len(prefix)
    assert target.tokenizer.piece(prefix[-3]) == "<|im_start|>"  # parsed as the special token, not as text


def test_batched_on_llama_cpp_writes_what_one_generation_per_attempt_writes(tmp_path):
    """The llama.cpp path samples `batch_size` attempts per batch (continuous batching, a generator per attempt),
    the plain path one `generate` each. On the shipped SmolLM2 Q4_1 GGUF, whose batched passes give one-sequence
    passes' logits bit for bit, the two write the same file, byte for byte; so does a batched run stopped early
    and continued."""
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make venv)")
    from hyflash.targets.llamacpp import LlamaCppTarget

    target = LlamaCppTarget.load("smollm2-135m", n_threads=1)  # 1 thread: exactness needs it (test_llamacpp_target)
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("plain", "batched", "resumed")}
    self_instruct(target, paths["plain"], SelfInstructConfig(num=3, max_new_tokens=96, batch_size=1), progress=False)
    self_instruct(target, paths["batched"], SelfInstructConfig(num=3, max_new_tokens=96, batch_size=4),
                  progress=False)
    for num in (1, 3):
        self_instruct(target, paths["resumed"], SelfInstructConfig(num=num, max_new_tokens=96, batch_size=4),
                      progress=False)
    texts = {name: path.read_text() for name, path in paths.items()}
    assert len(texts["plain"].splitlines()) == 3
    assert texts["batched"] == texts["plain"] and texts["resumed"] == texts["plain"]
