"""Atomic writes and JSONL logs (hyflash/files.py): a write that fails half-way leaves the old file, a rename is
flushed with its folder, and a log line cut short by a kill does not stop a resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hyflash import files
from hyflash.training.train import JsonlLog

REPO = Path(__file__).resolve().parents[1]


def _cut_short(path: Path, records: list[dict]) -> None:
    """What a kill in the middle of JsonlLog.write leaves: complete lines, then half of one."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + json.dumps({"step": 9, "loss": 1.5})[:11])


def test_training_log_resumes_past_a_line_cut_short_by_a_kill(tmp_path):
    path = tmp_path / "log.jsonl"
    _cut_short(path, [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)])
    log = JsonlLog(path, resume_step=2)
    log.write({"step": 3, "loss": 0.25})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_read_jsonl_leaves_out_a_broken_line_and_repair_removes_it(tmp_path):
    path = tmp_path / "samples.jsonl"
    assert files.read_jsonl(path) == []
    _cut_short(path, [{"step": 1}, {"step": 2}])
    before = path.read_text()
    assert files.read_jsonl(path) == [{"step": 1}, {"step": 2}] and path.read_text() == before
    assert files.read_jsonl(path, repair=True) == [{"step": 1}, {"step": 2}]
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_a_rename_is_flushed_with_its_folder(tmp_path, monkeypatch):
    """After os.replace the folder itself is fsynced, or a power cut can lose the rename (the old file returns)."""
    events = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(b))), real_replace(a, b)))
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")))),
                                                 real_fsync(fd)))
    target = tmp_path / "summary.json"
    files.atomic_write_json(target, {"a": 1})
    assert events.index(("replace", target)) < events.index(("fsync", tmp_path))
    events.clear()
    new, final = tmp_path / "new", tmp_path / "drafter"
    new.mkdir()
    files.replace_folder(new, final)
    assert events.index(("replace", final)) < events.index(("fsync", tmp_path))


CHILD = """
import resource, signal, sys
sys.path.insert(0, sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), like a full disk
from test_bench_report import _results
from hyflash.bench.report import write_report
resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
try:
    write_report(_results(), sys.argv[2])
except OSError as exc:
    print("failed:", exc)
"""


def test_a_report_that_fails_half_way_leaves_the_old_one(tmp_path):
    """The bench's table.md (read by users, and by `hyflash bench --resume`'s reports) is replaced whole or not
    at all: writing it with a 200-byte file limit fails, and the old table stays as it was."""
    old = "| old table |\n"
    (tmp_path / "table.md").write_text(old)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "tests"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "failed:" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "table.md").read_text() == old
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]  # no temporary file left behind
