"""Command line: errors are one clear line (no traceback), and the real default model works end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hyflash.cli import main


def _error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyflash: error:") and "\n" not in err, err
    return err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("generate", "demo", "drafter", "data", "train", "bench", "distill", "serve"):
        assert command in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--prompt", "   "], "prompt is empty"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature"),
        (["--prompt", "hi", "--top-p", "0"], "top-p"),
        (["--prompt", "hi", "--top-p", "1.5"], "top-p"),
        (["--prompt", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--prompt", "hi", "--backend", "llama.cpp", "--dtype", "float32"], "does not apply to the llama.cpp"),
        (["--prompt", "hi", "--cache-type-k", "f16"], "--cache-type-k applies to the llama.cpp backend only"),
        (["--prompt", "hi", "--backend", "llama.cpp", "--tree", "33"], "--tree 33 is more nodes than the llama.cpp"),
    ],
)
def test_cheap_bad_input(capsys, argv, needle):
    assert needle in _error_line(capsys, ["generate", *argv])


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi", "--tree", "40"], ["bench", "--trees", "4,40"]])
def test_a_tree_beyond_llamacpps_leaf_limit_is_refused_before_loading(capsys, monkeypatch, command):
    """A tree of N nodes may have N leaves, one llama.cpp sequence each: past the limit it would fail mid-run."""
    import hyflash.targets

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before --tree was checked")

    monkeypatch.setattr(hyflash.targets, "load_target", no_load)
    monkeypatch.setattr("hyflash.engine.load_target", no_load)
    err = _error_line(capsys, [*command, "--backend", "llama.cpp"])
    assert "--tree 40" in err and "limit of 32" in err


@pytest.mark.slow
def test_prompt_longer_than_context(capsys, smollm2_fp32):
    # An explicit dtype: with --dtype auto an empty calibration cache would first announce a measurement.
    err = _error_line(capsys, ["generate", "--prompt", "word " * 9000, "--drafter", "none", "--dtype", "float32"])
    assert "reads at most 8192" in err


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["/no/such/drafter", "corrupt"])
def test_bad_drafter_files(capsys, tmp_path, smollm2_fp32, drafter):
    if drafter == "corrupt":
        (tmp_path / "config.json").write_text("{not json")
        (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
        drafter = str(tmp_path)
    err = _error_line(capsys, ["generate", "--prompt", "hi", "--drafter", drafter, "--dtype", "float32"])
    assert "drafter" in err


@pytest.mark.slow
def test_drafter_for_another_target(capsys, tmp_path, smollm2_fp32):
    # A drafter made for Gemma-3 (hidden 640, 262k vocabulary) must be refused by SmolLM2.
    assert main(["drafter", "new", "--kind", "hyflash", "--model", "gemma3-270m", "--out", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    err = _error_line(capsys, ["generate", "--prompt", "hi", "--drafter", str(tmp_path / "d")])
    assert "hidden" in err or "vocab" in err


def _generate_json(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "hyflash.cli", "generate", "--json", "--max-new-tokens", "40", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_generate_speculative_equals_plain_fp32_real_model(smollm2_fp32):
    prompt = "Write a Python function that returns the squares of a list of numbers."
    plain = _generate_json("--prompt", prompt, "--drafter", "none", "--dtype", "float32")
    for drafter in ("ngram", "default"):
        spec = _generate_json("--prompt", prompt, "--drafter", drafter, "--dtype", "float32")
        assert spec["tokens"] == plain["tokens"], drafter
        assert spec["text"] == plain["text"]
        assert spec["tau"] >= 1.0 and spec["target_passes"] <= plain["target_passes"]
    assert {"tokens_per_second", "acceptance_by_position", "draft_time", "verify_time"} <= spec.keys()


@pytest.mark.slow
def test_generate_streams_text_and_summary(capsys, smollm2_fp32):
    assert main(["generate", "--prompt", "Say hello.", "--max-new-tokens", "12", "--drafter", "ngram"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "tau" in out and "draft memory" in out


@pytest.mark.slow
def test_demo_runs_side_by_side(capsys, smollm2_fp32):
    argv = ["demo", "--prompts", "1", "--max-new-tokens", "16", "--drafter", "ngram", "--dtype", "float32"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| HumanEval/0 |" in out and "same text as plain: yes" in out


@pytest.mark.parametrize(
    "option, value",
    [
        ("--num-prompts", "-1"),
        ("--batch-size", "0"),
        ("--long-batch-size", "0"),
        ("--max-new-tokens", "0"),
        ("--sampled-fraction", "1.5"),
        ("--sampled-fraction", "-0.1"),
        ("--temperature", "-1"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--shard-prompts", "0"),
        ("--per-module", "0"),
        ("--long-per-module", "-1"),
        ("--multiturn-every", "-1"),
        ("--prose-per-package", "-1"),
    ],
)
def test_data_refuses_nonsense_numbers_before_loading(capsys, tmp_path, monkeypatch, option, value):
    from hyflash.targets import HFTarget

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(HFTarget, "load", classmethod(no_load))
    out = tmp_path / "out"
    err = _error_line(capsys, ["data", option, value, "--out", str(out), "--no-progress"])
    assert option in err and value in err
    assert not out.exists() or not any(out.iterdir())


def test_data_num_prompts_minus_one_exits_2_in_a_fresh_process(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "hyflash.cli", "data", "--num-prompts", "-1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hyflash: error: --num-prompts must be >= 0 (0 = every prompt), got -1"
    assert not out.exists()


def test_drafter_info_weight_bytes_include_the_head_copy(capsys, tmp_path, monkeypatch, llama_target):
    from hyflash.drafters.loading import read_weights
    from hyflash.targets import HFTarget

    monkeypatch.setattr(HFTarget, "load", classmethod(lambda cls, *args, **kwargs: llama_target))
    folder = tmp_path / "d"
    assert main(["drafter", "new", "--kind", "hyflash", "--draft-vocab", "40", "--model", "tiny",
                 "--out", str(folder)]) == 0
    capsys.readouterr()
    assert main(["drafter", "info", str(folder), "--context", "16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    saved = sum(t.numel() * t.element_size() for t in read_weights(folder).values())
    head = llama_target.model.get_output_embeddings().weight
    head_copy = 40 * head.shape[1] * head.element_size()  # the 40 draft-vocabulary rows, in the head's dtype
    assert info["weight_bytes_detail"] == {"saved_tensors": saved, "head_copy": head_copy}
    assert info["weight_bytes"] == saved + head_copy
    assert set(info["draft_memory_bytes"]) == {"16"}  # context state is reported apart
    assert main(["drafter", "info", str(folder), "--context", "16"]) == 0
    assert "MiB is its copy of the target's LM-head rows" in capsys.readouterr().out


def test_drafter_info_default_resolves_like_generate(capsys):
    from hyflash.drafters.cli import resolve_info_path
    from hyflash.drafters.registry import shipped_drafter_path

    shipped = str(shipped_drafter_path("smollm2-135m"))
    assert resolve_info_path("default", None) == (shipped, "smollm2-135m")
    assert resolve_info_path("default", "smollm2-135m") == (shipped, "smollm2-135m")
    assert resolve_info_path("some/dir", None) == ("some/dir", None)
    err = _error_line(capsys, ["drafter", "info", "default", "--model", "gemma3-270m"])
    assert "no default drafter ships for 'gemma3-270m'" in err


@pytest.mark.slow
def test_drafter_info_default_real_model(capsys, smollm2_fp32):
    assert main(["drafter", "info", "default", "--context", "64", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == "smollm2-135m" and info["dtype"] == "bfloat16"
    from hyflash.drafters.loading import read_config
    from hyflash.drafters.registry import shipped_drafter_path

    rows = read_config(shipped_drafter_path("smollm2-135m")).draft_vocab_size
    head_copy = rows * 576 * 2  # the draft vocabulary's rows of the bf16 head
    assert info["weight_bytes_detail"]["head_copy"] == head_copy
    assert info["weight_bytes"] == info["weight_bytes_detail"]["saved_tensors"] + head_copy
    assert info["draft_memory_bytes"]["64"] < info["weight_bytes"]


def test_drafter_trim_keeps_the_most_frequent_ids_and_drafts_the_same_where_they_win(capsys, tmp_path, llama_target):
    from hyflash.drafters.loading import read_config, read_weights
    from hyflash.drafters.registry import load_drafter
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel

    model = DrafterModel(DrafterConfig.for_target(llama_target, draft_vocab_size=40), llama_target)
    model.set_draft_vocab(torch.randperm(llama_target.vocab_size, generator=torch.Generator().manual_seed(0))[:40])
    model.save_pretrained(tmp_path / "d")
    assert main(["drafter", "trim", str(tmp_path / "d"), "--draft-vocab", "12", "--out", str(tmp_path / "t")]) == 0
    assert read_config(tmp_path / "t").draft_vocab_size == 12
    kept = read_weights(tmp_path / "t")["draft_vocab_ids"]
    assert torch.equal(kept, model.draft_vocab_ids[:12])
    full, trimmed = (load_drafter(tmp_path / name, llama_target, int8=False) for name in ("d", "t"))
    g = torch.Generator().manual_seed(1)
    features = torch.randn(20, len(llama_target.feature_layers), llama_target.hidden_size, generator=g)
    tokens = torch.randint(0, llama_target.vocab_size, (20,), generator=g)
    for state in (full, trimmed):
        state.ingest(tokens, features)
    logits_full = full.model.logits(full.block_hidden(3))
    logits_trim = trimmed.model.logits(trimmed.block_hidden(3))
    torch.testing.assert_close(logits_trim, logits_full[:, :12])  # the same rows of the same head
    for name, size, wanted in ((tmp_path / "d", 40, "between 1 and 39"), (tmp_path / "d", 0, "between 1 and 39")):
        assert wanted in _error_line(capsys, ["drafter", "trim", str(name), "--draft-vocab", str(size),
                                              "--out", str(tmp_path / "x")])
    DrafterModel(DrafterConfig.for_target(llama_target), llama_target).save_pretrained(tmp_path / "fullvocab")
    err = _error_line(capsys, ["drafter", "trim", str(tmp_path / "fullvocab"), "--draft-vocab", "5",
                               "--out", str(tmp_path / "x")])
    assert "full vocabulary" in err and not (tmp_path / "x").exists()


def test_calibrate_draws_its_plot_beside_the_cache_not_into_the_working_directory(tmp_path, monkeypatch):
    """`hyflash calibrate` used to write calibration.png into whatever folder it ran in (often a repository)."""
    import hyflash.calibration as calibration
    from hyflash.costs import CostCurve

    drawn = []
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(calibration, "calibrate", lambda model, dtype, *a, **k: (
        CostCurve(model, dtype, [0], [[10.0, 14.0]]), False))
    monkeypatch.setattr(calibration, "plot", lambda curves, path: drawn.append(path))
    assert main(["calibrate", "--dtype", "float32"]) == 0
    assert drawn == [tmp_path / "cache" / "calibration" / "smollm2-135m-transformers.png"]
    assert main(["calibrate", "--dtype", "float32", "--plot", ""]) == 0
    assert len(drawn) == 1 and not list(tmp_path.glob("*.png"))
