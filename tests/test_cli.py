"""Command line: errors are one clear line (no traceback), and the real default model works end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
    for command in ("generate", "demo", "drafter", "data", "train", "bench", "distill"):
        assert command in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--prompt", "   "], "prompt is empty"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature"),
        (["--prompt", "hi", "--top-p", "0"], "top-p"),
        (["--prompt", "hi", "--top-p", "1.5"], "top-p"),
        (["--prompt", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_cheap_bad_input(capsys, argv, needle):
    assert needle in _error_line(capsys, ["generate", *argv])


@pytest.mark.slow
def test_prompt_longer_than_context(capsys, smollm2_fp32):
    err = _error_line(capsys, ["generate", "--prompt", "word " * 9000, "--drafter", "none"])
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
