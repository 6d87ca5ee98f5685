"""`hyflash data`: the user's prompt files, the varied prompt source, and batched generation on llama.cpp (the
shipped SmolLM2 GGUF): batched text and features equal the target's own one-sequence passes, shards are
checksummed and regenerated when corrupt or missing."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hyflash.errors import HyflashError
from hyflash.corpora import Prompt, build_prompts
from hyflash.training.user_prompts import read_prompt_file, write_prompt_file
from hyflash.training.varied_prompts import _HELDOUT, _TRAIN, build_varied, plant_bug, varied_prompts

MODULE = '''"""A module."""


def clamp(value, low, high):
    """Return value limited to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value


def total(items, start=0):
    """Sum the items, starting from start."""
    result = start
    for item in items:
        result = result + item
    return result
'''


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prompt_file_formats_are_detected_and_conversations_kept(tmp_path):
    openai = _write(tmp_path / "a.jsonl", [
        json.dumps({"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Sort a list"},
                                 {"role": "assistant", "content": "sorted(x)"}]}),
        "",
        json.dumps({"messages": [{"role": "user", "content": "One turn"}]}),
    ])
    first, second = read_prompt_file(openai)
    # The trailing assistant answer is dropped (the target writes its own); earlier turns and the system stay.
    assert (first.text, first.history, first.system) == ("Sort a list", ("Hi", "Hello!"), "Be terse.")
    assert first.chat and first.kind == "user" and first.module.endswith("a.jsonl:1")
    assert second.module.endswith("a.jsonl:3") and second.history == ()
    sharegpt = _write(tmp_path / "b.jsonl", [json.dumps({"conversations": [
        {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]})])
    assert [(p.text, p.history) for p in read_prompt_file(sharegpt)] == [("Q2", ("Q1", "A1"))]
    plain = _write(tmp_path / "c.txt", ["Write a haiku", "", "  Explain tuples  "])
    assert [(p.text, p.history, p.chat) for p in read_prompt_file(plain)] == [
        ("Write a haiku", (), True), ("Explain tuples", (), True)]
    # The JSONL writer is read back as written.
    written = tmp_path / "round.jsonl"
    assert write_prompt_file(written, [first, Prompt("code", "m", "def f(")]) == 1  # raw continuations have no chat form
    assert read_prompt_file(written)[0] == Prompt("user", f"{written}:1", "Sort a list", ("Hi", "Hello!"), "Be terse.")


@pytest.mark.parametrize("lines, message", [
    (['{"messages": [{"role": "user", "content": "ok"}]}', '{"messages": [ broken'], r"b\.jsonl:2: not valid JSON"),
    (['{"prompt": "x"}'], r"b\.jsonl:1: an object with one of the keys 'messages' or 'conversations'"),
    (['{"conversations": [{"from": "robot", "value": "x"}]}'], r"b\.jsonl:1: turn 1 has the unknown speaker 'robot'"),
    (['{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}'],
     r"b\.jsonl:1: turns must alternate .*\(turn 2 is 'user'"),
    (['{"messages": [{"role": "assistant", "content": "a"}]}'], r"b\.jsonl:1: the conversation has no user turn"),
    (['{"messages": [{"role": "user"}]}'], r"b\.jsonl:1: turn 1 needs a 'role' and a string 'content'"),
    (["", "  "], r"holds no prompts"),
])
def test_bad_prompt_files_name_the_line_and_the_formats(tmp_path, lines, message):
    path = _write(tmp_path / "b.jsonl", lines)
    with pytest.raises(HyflashError, match=message) as err:
        read_prompt_file(path)
    assert "\n" not in str(err.value)
    if "holds no" in message or "not valid" in message or "keys" in message:
        assert "ShareGPT" in str(err.value) and "plain text" in str(err.value)
    with pytest.raises(HyflashError, match="no prompt file at"):
        read_prompt_file(tmp_path / "missing.txt")


@pytest.fixture
def source_tree(tmp_path):
    root = tmp_path / "lib"
    for i in range(40):
        (root / f"pkg{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / f"pkg{i % 4}" / f"mod{i}.py").write_text(MODULE.replace("clamp", f"clamp{i}"))
    return root


def test_varied_prompts_are_deterministic_split_by_file_and_phrased_apart(source_tree):
    train = varied_prompts("train", seed=3, root=source_tree, packages=False)
    held = varied_prompts("heldout", seed=3, root=source_tree, packages=False)
    assert train and held and varied_prompts("train", seed=3, root=source_tree, packages=False) == train
    assert varied_prompts("train", seed=4, root=source_tree, packages=False) != train
    assert not {p.module for p in train} & {p.module for p in held}
    assert {p.kind for p in train} <= {"task", "dialogue"} and all(p.chat for p in train)
    assert any(p.history for p in train)  # multi-turn conversations are in
    # Held-out phrasings share no template with training ones, so no prompt of one split is a template of the other.
    assert not {t for ts in _TRAIN.values() for t in ts} & {t for ts in _HELDOUT.values() for t in ts}
    assert set(_HELDOUT) == set(_TRAIN)
    # The built-in source adds raw continuations from the stdlib builder.
    mixed = build_varied("train", seed=3, root=source_tree, packages=False, prose_per_package=0, long_chars=0)
    assert {p.kind for p in mixed} >= {"task", "code"}
    raw = [p for p in build_prompts("train", seed=3, per_module=2, root=source_tree, long_chars=0) if not p.chat]
    key = lambda p: (p.module, p.text)  # noqa: E731
    assert sorted((p for p in mixed if not p.chat), key=key) == sorted(raw, key=key)


def test_planted_bugs_change_one_operator():
    import random

    buggy = plant_bug(MODULE, random.Random(0))
    assert buggy != MODULE and len(buggy.splitlines()) == len(MODULE.splitlines())
    changed = [(a, b) for a, b in zip(MODULE.splitlines(), buggy.splitlines()) if a != b]
    assert len(changed) == 1 and not changed[0][0].lstrip().startswith(("def", '"'))
    assert plant_bug("def f():\n    pass\n", random.Random(0)) is None


# ----- llama.cpp: the shipped SmolLM2 GGUF (Q4_1) -------------------------------------------------------------

PROMPTS = ["Write a Python function that reverses a string.", "Explain photosynthesis in two sentences.",
           "List three prime numbers.", "What is the capital of France? Answer briefly.", "Sort a list in Python."]


@pytest.fixture(scope="module")
def lcpp():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make venv)")
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    from hyflash.targets.llamacpp import LlamaCppTarget

    return LlamaCppTarget.load("smollm2-135m", n_threads=1)


def _one_at_a_time(target, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding through the target's own passes (prefill, then score one token at a time), with the
    features of every fed position and a zero row for the last token."""
    from hyflash.sampling import argmax

    out = target.prefill(ids, features=True)
    feats, tokens = [out.features], [int(argmax(out.logits[-1]))]
    while len(tokens) < n and tokens[-1] not in target.eos_token_ids:
        step = target.score([tokens[-1]], features=True)
        feats.append(step.features)
        tokens.append(int(argmax(step.logits[-1])))
    f = torch.cat(feats)
    return tokens, torch.cat([f, f.new_zeros(1, *f.shape[1:])])


def test_batched_generation_equals_the_targets_own_passes(lcpp):
    """Greedy text and features of 3 slots refilled 5 times equal one sequence at a time, bit for bit (Q4_1,
    flash attention, q8_0 K: each stream's cells are laid out as in the target's own cache)."""
    from hyflash.sampling import SamplingConfig
    from hyflash.training.llamacpp_data import BatchedGenerator, Request

    ids = [lcpp.encode_prompt(p) for p in PROMPTS]
    gen = BatchedGenerator(lcpp, 3, 256, True, torch.float32, SamplingConfig())
    try:
        got = gen.generate([Request(p, 20) for p in ids])
    finally:
        gen.close()
    for p, r in zip(ids, got):
        tokens, feats = _one_at_a_time(lcpp, p, 20)
        assert r.tokens == tokens
        assert torch.equal(r.feature_rows[0], feats)


def test_sampled_continuations_do_not_depend_on_the_batch(lcpp):
    from hyflash.sampling import SamplingConfig
    from hyflash.training.llamacpp_data import BatchedGenerator, Request

    ids = [lcpp.encode_prompt(p) for p in PROMPTS[:4]]
    sampling = SamplingConfig(temperature=0.8, top_p=0.95)

    def run(slots):
        gen = BatchedGenerator(lcpp, slots, 256, False, torch.float32, sampling)
        try:
            return [r.tokens for r in gen.generate([Request(p, 16, torch.Generator().manual_seed(i))
                                                    for i, p in enumerate(ids)])]
        finally:
            gen.close()

    batched = run(4)
    assert batched == run(1)
    assert batched != [_one_at_a_time(lcpp, p, 16)[0] for p in ids]  # it did sample


def test_llamacpp_data_folder_resumes_and_regenerates_bad_shards(lcpp, tmp_path, monkeypatch, capsys):
    """Shards are checksummed: an interrupted run resumes after its last finished shard, a corrupt or missing
    shard is generated again (the same bytes), and features land where a llama.cpp training run reads them."""
    from hyflash.training import data as data_module
    from hyflash.training.data import DataConfig, TokenDataset, build_dataset, read_manifest
    from hyflash.training.features import FeatureCache

    prompts = _write(tmp_path / "p.txt", PROMPTS)
    cfg = DataConfig(prompts=str(prompts), backend="llama.cpp", num_prompts=0, max_new_tokens=8, batch_size=2,
                     shard_prompts=2, sampled_fraction=0.5)
    out, fc = tmp_path / "data", tmp_path / "fc"
    real = data_module.make_shard
    calls = []

    def dies_on_shard_1(target, chunk, first, config, *args):
        calls.append(first)
        if first == 2:
            raise KeyboardInterrupt  # a kill mid-run
        return real(target, chunk, first, config, *args)

    monkeypatch.setattr(data_module, "make_shard", dies_on_shard_1)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(cfg, out, target=lcpp, progress=False, feature_cache=fc)
    said = capsys.readouterr().out
    assert "tok/s decoding 2 sequences per batch" in said and "with every slot busy" in said  # speed and ETA
    assert "shard 1 of 3 written (2 of 5 prompts" in said  # the pace, before the kill
    assert [s["index"] for s in read_manifest(out)["shards"]] == [0]
    monkeypatch.setattr(data_module, "make_shard", real)
    build_dataset(cfg, out, target=lcpp, progress=False, feature_cache=fc)
    manifest = read_manifest(out)
    assert [s["index"] for s in manifest["shards"]] == [0, 1, 2] and manifest["complete"]
    shard0 = out / manifest["shards"][0]["file"]
    good = shard0.read_bytes()
    shard0.write_bytes(good[:-3] + b"xyz")
    (out / manifest["shards"][2]["file"]).unlink()
    build_dataset(cfg, out, target=lcpp, progress=False, feature_cache=fc)
    said = capsys.readouterr().out
    assert "shard-00000.safetensors is corrupt" in said and "shard-00002.safetensors is missing" in said
    # Without a bar, each shard says the pace it measured: the resumed run counts only its own prompts.
    assert "shard 2 of 3 written (4 of 5 prompts" in said
    last = [line for line in said.splitlines() if line.startswith("shard 3 of 3 written (5 of 5 prompts")]
    assert last and all(line.endswith(" this run)") for line in last)  # nothing left: no "rest" clause
    assert "shard 1 of 3 written (4 of 5 prompts" in said and "the rest takes ~0m00s at this pace" in said
    assert shard0.read_bytes() == good and read_manifest(out)["complete"]
    # Features are filed under the key `hyflash train --feature-backend llama.cpp` uses (bfloat16 training).
    data = TokenDataset(out)
    cache = FeatureCache(fc, lcpp, torch.bfloat16)
    for i in range(len(data)):
        seq = torch.from_numpy(data.sequences[i])
        feats = cache.get(data.keys[i], len(seq))
        whole = lcpp.prefill(seq, features=True).features.to(torch.bfloat16)
        assert torch.equal(feats[:-1], whole[:-1])
    with pytest.raises(HyflashError, match="changed since"):
        _write(prompts, PROMPTS[:2])
        build_dataset(cfg, out, target=lcpp, progress=False)
