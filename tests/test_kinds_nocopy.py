"""Issue 41's no-copy kinds grid: the ctx sets (shared cut points), the device script's commands (a dry run), and
experiments/kinds/kinds_nocopy_gpu.sh end to end at TINY size on the CPU (data, training, per-set benches, the summary with
its claims and bootstrap), with a drafter exported from a checkpoint equal to training's own export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "kinds" / "kinds_nocopy_gpu.sh"
RUNS = "hyflash-d1-s0 full-d1-s0 hyflash-d1-s1 full-d1-s1"


def _script(out: Path, copy: Path | None = None, **env) -> subprocess.CompletedProcess:
    args = ["bash", str(SCRIPT), str(out)] + ([str(copy)] if copy else [])
    return subprocess.run(args, env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env},
                          capture_output=True, text=True, timeout=600)


def test_ctx_sets_share_cut_points_and_differ_only_in_context(smollm2_fp32):
    from hyflash.bench.datasets import CUT_CONTEXT_TOKENS, DEFAULT_SETS, load_set

    sets = {name: load_set(name, smollm2_fp32, 3, 16) for name in ("ctx-1k", "ctx-8k")}
    assert [p.item_id for p in sets["ctx-1k"]] == [p.item_id for p in sets["ctx-8k"]]  # the same cut points
    for short, long in zip(sets["ctx-1k"], sets["ctx-8k"]):
        assert len(short.ids) == 1024 and len(long.ids) == 8192 - 16 - 1  # clamped to the 8k context
        assert long.ids[-1024:] == short.ids  # the same text before the cut: only the context differs
    assert not set(CUT_CONTEXT_TOKENS) & set(DEFAULT_SETS)  # a plain `hyflash bench` does not run them


def _cpu_script(work: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "experiments/kinds/nocopy_cpu.sh"), str(work)],
                          env={**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", **env}, capture_output=True,
                          text=True, timeout=60)


def test_cpu_script_trains_without_the_copy_input_and_benches_by_replay(tmp_path):
    """experiments/kinds/nocopy_cpu.sh (the multi-session CPU path): the commands of its four stages."""
    done = _cpu_script(tmp_path / "o", RESULTS=str(tmp_path / "results"))
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    data, *train, bench, summary = commands
    assert "--kinds long" in data and "--num-prompts 192" in data and "--dtype float32" in data
    assert "--out data/smollm2-135m/long-v2" in data  # token ids in the checkout: they outlive the machine
    assert len(train) == 12 and all("SCALE=cpu" in t and "COPY_NGRAM=0" in t and "AUTOCAST=off" in t for t in train)
    assert "long-v1" in train[0] and "long-v2" in train[0] and "RUNS=hyflash-d1-s0" in train[0]
    assert "--replay" in bench and "--no-adaptive" in bench and "--temperatures 0" in bench
    assert bench.count("--drafter ") == 12 and "ctx-1k,ctx-2k,ctx-4k,ctx-6k,ctx-8k --n 12" in bench
    assert f"--out {tmp_path / 'results'}/bench-" in bench
    assert "summarize_nocopy.py" in summary
    for bad_env, message in (({"BENCH_N": "some"}, "BENCH_N must be"), ({"UNTIL": "9pm"}, "UNTIL must be HH:MM")):
        bad = _cpu_script(tmp_path / "o", **bad_env)
        assert bad.returncode == 2 and message in bad.stderr


def test_cpu_script_on_a_new_machine_trains_only_runs_no_complete_bench_holds(tmp_path):
    """The weights die with the machine; a run whose replay is in a complete committed bench is never trained
    again, and one in a bench left unfinished (no .complete) is, since its bench cannot go on without weights."""
    results = tmp_path / "results"
    for folder, names, complete in (("bench-20261206-0900", ["plain", "hyflash-d1-s0", "full-d1-s0"], True),
                                    ("bench-20261207-0900", ["plain", "hyflash-d1-s1"], False)):
        (results / folder).mkdir(parents=True)
        (results / folder / "results.json").write_text(json.dumps({"meta": {}, "runs": [{"method": m} for m in names]}))
        if complete:
            (results / folder / ".complete").touch()
    done = _cpu_script(tmp_path / "o", RESULTS=str(results))
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    trained = [c.split("RUNS=")[1].split()[0] for c in commands if "grid.sh" in c]
    assert trained[:2] == ["hyflash-d1-s1", "full-d1-s1"] and len(trained) == 10
    assert "hyflash-d1-s0: in a committed bench, skipped" in done.stdout
    bench = next(c for c in commands if "hyflash.cli bench" in c)
    assert bench.count("--drafter ") == 10 and "hyflash-d1-s0=" not in bench


def test_dry_run_shows_every_stage_without_the_copy_input(tmp_path):
    done = _script(tmp_path / "o", DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    trains = [line for line in lines if " -m hyflash.cli train " in line]
    assert len(trains) == 12 and not any("--copy-ngram" in line for line in trains)
    assert all("--steps 240 --batch-size 16 --anchors 64 " in line and "--max-length 4096" in line for line in trains)
    benches = [line for line in lines if " -m hyflash.cli bench " in line]
    assert len(benches) == 10 and all("--device cuda --dtype float32 --no-adaptive" in line for line in benches)
    assert sum("--memory-contexts 1024,2048,4096,6144,8192" in line for line in benches) == 1
    assert any("hyflash.cli data" in line and "--dtype bfloat16" in line for line in lines)
    assert "summarize_nocopy.py" in lines[-2]
    assert _script(tmp_path / "o", DRY_RUN="1", DEADLINE_S="soon").returncode == 2


@pytest.mark.slow  # ~3 min on 2 cores: data, 4 tiny trainings, 4 benches, the summary
def test_tiny_grid_runs_every_stage_and_reports(tmp_path):
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set (the tiny model borrows the real model's tokenizer)")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_kinds_grid import _tiny_model_and_data

    model, _ = _tiny_model_and_data(tmp_path)
    out, copy = tmp_path / "out", tmp_path / "copy"
    done = _script(out, copy, TINY="1", MODEL=str(model), RUNS=RUNS, BENCH_SETS="ctx-1k,ctx-8k")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stages = [line.split("\t")[0] for line in (out / "stage_seconds.tsv").read_text().splitlines()]
    assert {"preflight", "data", "train", "bench-ctx-1k-t0", "bench-ctx-8k-t1", "summary", "total"} <= set(stages)
    assert json.loads((out / "data-long-gpu" / "manifest.json").read_text())["shards"]
    for run in RUNS.split():
        assert json.loads((out / "grid/runs" / run / "drafter/config.json").read_text())["copy_ngram"] == 0
    report = json.loads((out / "claims.json").read_text())
    greedy = report["grids"]["no copy input"]["greedy"]
    assert greedy["sets"] == ["ctx-1k", "ctx-8k"] and set(greedy["tau"]) == {"full-d1", "hyflash-d1"}
    rows = {r["claim"][:3]: r for r in greedy["claims"]}
    assert rows["(a)"]["verdict"] != "not measured" and rows["(a)"]["bootstrap_prompts"] == 2
    assert rows["(b)"]["verdict"] == "not measured"  # no depth-2 runs in this grid
    assert "copy input" in report["grids"]  # the committed copy grid beside it
    # greedy by acceptance replay: every drafter's text is the recorded one by construction (bench --replay)
    assert report["outputs"]["ctx-8k"]["replayed"] == report["outputs"]["ctx-8k"]["drafter_runs"] == 8
    assert set(report["draft_memory_bytes"]) == {"full-d1", "hyflash-d1"}
    assert sorted(p.name for p in copy.iterdir()) == sorted(
        ["anchor_context.json", "claims.json", "claims.md", "log.txt", "results.tgz", "stage_seconds.tsv",
         "summary.json", "tau_vs_context_nocopy.png"])

    # The deadline fallback's export: step 2 of every run is training's own final export, weight for weight.
    export = subprocess.run([sys.executable, str(ROOT / "experiments/kinds/export_checkpoint.py"),
                             *(str(out / "grid/runs" / r) for r in ("hyflash-d1-s0", "full-d1-s0"))],
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0 and export.stdout.strip() == "2", export.stderr
    final = load_file(str(out / "grid/runs/hyflash-d1-s0/drafter/model.safetensors"))
    trained = load_file(str(out / "grid/runs/hyflash-d1-s0/checkpoints/step-000002/model.safetensors"))
    assert all(torch.equal(final[k], v.to(final[k].dtype)) for k, v in trained.items())
    missing = subprocess.run([sys.executable, str(ROOT / "experiments/kinds/export_checkpoint.py"), str(out / "grid/runs/x")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no checkpoint step is shared" in missing.stderr


@pytest.mark.slow  # ~2 min on 2 cores: tiny data, three tiny trainings over two "sessions", two benches, the summary
def test_cpu_script_goes_on_over_sessions_on_new_machines(tmp_path):
    """The CPU path for real at tiny size: a session writes the data, trains, benches into a committed folder and
    summarises; the next, on a "new machine" (the work folder gone), trains only the run no bench holds, benches it
    into a folder of its own, and the summary pools both."""
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set (the tiny model borrows the real model's tokenizer)")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_kinds_grid import _tiny_model_and_data

    model, _ = _tiny_model_and_data(tmp_path)
    results, long_data = tmp_path / "results", tmp_path / "long"
    env = dict(TINY="1", MODEL=str(model), LONG_DATA=str(long_data), RESULTS=str(results), DRY_RUN="0",
               BENCH_SETS="ctx-1k,ctx-8k", OMP_NUM_THREADS="1")

    def session(runs: str) -> subprocess.CompletedProcess:
        done = _cpu_script(tmp_path / "work", RUNS=runs, **env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    session("hyflash-d1-s0 full-d1-s0")
    assert json.loads((long_data / "manifest.json").read_text())["complete"]
    [first] = [b for b in results.glob("bench-*") if (b / ".complete").exists()]
    assert {r["method"] for r in json.loads((first / "results.json").read_text())["runs"]} == {
        "plain", "hyflash-d1-s0", "full-d1-s0"}
    assert (results / "runs/full-d1-s0/train_config.json").exists() and (results / "claims.json").exists()

    import shutil

    shutil.rmtree(tmp_path / "work")  # a new machine: weights and features gone, the checkout kept
    second = session("hyflash-d1-s0 full-d1-s0 hyflash-d1-s1")
    assert "hyflash-d1-s0: in a committed bench, skipped" in second.stdout
    assert [p.name for p in (tmp_path / "work/grid/runs").iterdir()] == ["hyflash-d1-s1"]
    benches = sorted(b for b in results.glob("bench-*") if (b / ".complete").exists())
    assert len(benches) == 2 and benches[0] == first
    assert {r["method"] for r in json.loads((benches[1] / "results.json").read_text())["runs"]} == {
        "plain", "hyflash-d1-s1"}
    summary = json.loads((results / "summary.json").read_text())
    assert len(summary["hyflash-d1"]["ctx-1k"]["tau_seeds"]) == 2  # both sessions' seeds pooled
    assert len(summary["full-d1"]["ctx-1k"]["tau_seeds"]) == 1
