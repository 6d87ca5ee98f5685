"""experiments/gpu-recipe/recipe.sh (the H200 data + training + bench recipe) end to end at TINY size on the CPU: a tiny
random Llama with SmolLM2's tokenizer goes through every stage (data, training with held-out tau, bench,
scaling plot), a rerun resumes without redoing finished stages, and bad input stops with a clear message.

It reads the real SmolLM2 tokenizer (converted once into the user cache, like test_training_pipeline's data
test), not the real model's weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu-recipe" / "recipe.sh"


def _env(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TINY", "DATA_SECONDS", "STEPS", "PYTHON")}
    # The tiny model's calibration goes to a cache of its own, which sees the converted SmolLM2 through a link.
    env.update(OMP_NUM_THREADS="1", HYFLASH_CACHE=str(cache), PYTHON=sys.executable, **extra)
    return env


def _run(out: Path, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cache(tmp_path) -> Path:
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set (the TINY run borrows the SmolLM2 tokenizer)")
    from hyflash.targets import resolve_model_path

    folder = tmp_path / "cache"
    (folder / "models").mkdir(parents=True)
    (folder / "models" / "smollm2-135m").symlink_to(resolve_model_path("smollm2-135m"), target_is_directory=True)
    return folder


def _stages(out: Path) -> list[str]:
    return [line.split("\t")[0] for line in (out / "stage_seconds.tsv").read_text().splitlines()]


def test_tiny_recipe_runs_every_stage_and_resumes(tmp_path, cache):
    out = tmp_path / "out"
    done = _run(out, _env(cache, TINY="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # Data: a new folder of target-written shards.
    manifest = json.loads((out / "data-seed2" / "manifest.json").read_text())
    assert manifest["shards"] and manifest["config"]["seed"] == 2 and manifest["config"]["dtype"] == "float32"
    # Training: the drafter, the log with held-out tau at the listed step and the end, the curves.
    drafter = json.loads((out / "train" / "drafter" / "config.json").read_text())
    assert drafter["target_hidden_size"] == 32 and drafter["block_size"] == 8 and drafter["draft_vocab_size"] == 8192
    assert (out / "train" / "drafter" / "model.safetensors").stat().st_size > 0
    log = [json.loads(line) for line in (out / "train" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval" in r] == [1, 2]
    assert (out / "train" / "curves.png").stat().st_size > 0
    # Bench: the new drafter beside plain and n-gram on the four sets, greedy float32 text equal to plain.
    results = json.loads((out / "bench" / "results.json").read_text())
    assert not results["errors"] and results["meta"]["config"]["dtype"] == "float32"
    rows = {(r["set"], r["method"]): r for r in results["summary"]}
    assert set(rows) == {(s, m) for s in ("chat", "humaneval", "code", "prose") for m in ("plain", "ngram", "new")}
    assert all(r["identical_to_plain"] == r["prompts"] for r in rows.values())
    assert (out / "bench" / "table.md").exists()
    # Scaling: one curve, held-out tau at increasing token counts.
    scaling = json.loads((out / "scaling.json").read_text())
    [points] = scaling.values()
    assert [p["step"] for p in points] == [1, 2] and 0 < points[0]["tokens_seen"] < points[1]["tokens_seen"]
    assert (out / "scaling.png").stat().st_size > 0
    first = _stages(out)
    assert {"preflight", "data", "train", "bench", "scaling", "total"} <= set(first)

    # A rerun with the same OUTDIR skips the finished stages and redraws the curve.
    again = _run(out, _env(cache, TINY="1"))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _stages(out)[len(first):] == ["preflight", "scaling", "total"]


def test_bad_input_is_refused_with_a_clear_message(tmp_path, cache):
    usage = subprocess.run(["bash", str(SCRIPT)], env=_env(cache), capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage: experiments/gpu-recipe/recipe.sh OUTDIR" in usage.stderr
    bad = _run(tmp_path / "bad", _env(cache, TINY="yes"), timeout=30)
    assert bad.returncode == 1 and "TINY must be 0 or 1" in bad.stderr
    import torch

    if torch.cuda.is_available():
        return  # without TINY the real run would start
    real = _run(tmp_path / "real", _env(cache), timeout=60)
    assert real.returncode == 1 and "sees no CUDA device" in real.stderr
    assert not (tmp_path / "real" / "train").exists()
