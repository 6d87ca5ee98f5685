"""Training runs as separate processes: killed with SIGKILL and resumed, and under torchrun with 2 processes.

Both must end with the weights of one uninterrupted single-process run on the same global batches. This file
is also the training script those processes run (`python tests/test_training_runs.py ...`), on a tiny random
Llama target, so the tests need no network and no real model.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
STEPS, SAVE_EVERY, PAUSE_AT = 12, 3, 8  # the killed run checkpoints at 3 and 6, is killed during step 8


def _tiny_target():
    sys.path.insert(0, str(HERE))
    from conftest import tiny_llama

    from hyflash.targets import HFTarget

    return HFTarget(tiny_llama(), name="tiny-llama")


def _write_data(folder: Path) -> None:
    """Target-written sequences: the tiny target's greedy continuations of random prompts."""
    from hyflash.training.data import write_dataset

    target = _tiny_target()
    prompts = torch.randint(0, 97, (16, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target.model.generate(input_ids=prompts, max_new_tokens=30, do_sample=False, pad_token_id=0)
    write_dataset(folder, [row.tolist() for row in out], [10] * len(out), target.signature(), name="tiny-llama")


def _config(data: Path, out: Path):
    from hyflash.training.config import TrainConfig

    return TrainConfig(
        data=[str(data)], out=str(out), steps=STEPS, batch_size=4, anchors=6, block_size=4, window=8,
        chunk_size=4, draft_vocab_size=48, warmup_steps=2, lr=3e-3, save_every=SAVE_EVERY, log_every=1,
        autocast=False, save_dtype="float32", threads=1, plot=False,
        # The levers with state or copies: the survival weights' EMA must survive SIGKILL + resume (it is in
        # the checkpoint) and agree across processes (built from all-reduced counts); the target copy is the
        # same in every process.
        slot_weights="survival", init_from_target=True,
    )


def _main(argv: list[str]) -> None:
    """Entry point of the training subprocesses: DATA OUT [--resume] [--pause]."""
    data, out = Path(argv[0]), Path(argv[1])
    torch.set_num_threads(1)
    from hyflash.training import batches as batches_module
    from hyflash.training import train as train_module

    if "--pause" in argv:  # announce, then hang inside step PAUSE_AT (after checkpoints 3 and 6)
        real = batches_module.make_batch
        calls = [0]

        def make_batch(*args, **kwargs):
            calls[0] += 1
            if calls[0] == PAUSE_AT:
                (out / "paused").write_text("")
                time.sleep(600)
            return real(*args, **kwargs)

        batches_module.make_batch = make_batch  # training_batches draws every step's batch through it
    train_module.train(_config(data, out), resume="--resume" in argv, progress=False, target=_tiny_target())


def _run(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "drafter" / "model.safetensors"))


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The data, and one uninterrupted single-process run started at once (others compare to it)."""
    root = tmp_path_factory.mktemp("train-runs")
    _write_data(root / "data")
    proc = _run([sys.executable, __file__, str(root / "data"), str(root / "reference")])
    output: list[str] = []

    def wait_for_reference() -> None:
        if not output:
            output.append(_finish(proc))

    return root, wait_for_reference


def test_sigkill_and_resume_matches_uninterrupted_run(runs):
    root, reference = runs
    run = root / "killed"
    run.mkdir()
    proc = _run([sys.executable, __file__, str(root / "data"), str(run), "--pause"])
    deadline = time.time() + 120
    while not (run / "paused").exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "the run never reached the pause point"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert saved == ["step-000003", "step-000006"], saved
    assert not (run / "drafter").exists()
    _finish(_run([sys.executable, __file__, str(root / "data"), str(run), "--resume"]))
    reference()
    expected, got = _weights(root / "reference"), _weights(run)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    assert _losses(run) == pytest.approx(_losses(root / "reference"), abs=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_matches_one_process(runs):
    root, reference = runs
    run = root / "ddp"
    run.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), __file__, str(root / "data"), str(run)]
    _finish(_run(cmd))
    reference()
    expected, got = _weights(root / "reference"), _weights(run)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
    ref_loss, ddp_loss = _losses(root / "reference"), _losses(run)
    assert ddp_loss.keys() == ref_loss.keys()
    for step in ref_loss:
        assert ddp_loss[step] == pytest.approx(ref_loss[step], rel=1e-4), step


if __name__ == "__main__":
    _main(sys.argv[1:])
