"""Model-written code (HumanEval checking) runs only on request, and isolated (issue 39, item 6).

Each program below passes (f() == 1) only if what it tries succeeded, so `passed` means "it got through". The
isolation needs Linux user namespaces; where they are off, checking refuses to run (tested too).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from hyflash.distill import tasks
from hyflash.errors import HyflashError

needs_isolation = pytest.mark.skipif(tasks.isolation_problem() is not None,
                                     reason=f"no isolation here: {tasks.isolation_problem()}")


def _check(body: str, **kwargs):
    problem = {"prompt": "def f():\n", "test": "def check(f):\n    assert f() == 1\n", "entry_point": "f"}
    return tasks.check_humaneval(problem, body, allow_code_execution=True, **kwargs)


def test_refuses_without_the_opt_in():
    problem = {"prompt": "def f():\n", "test": "def check(f):\n    assert f() == 1\n", "entry_point": "f"}
    with pytest.raises(HyflashError, match="--allow-code-execution"):
        tasks.check_humaneval(problem, "    return 1\n")


def test_refuses_where_it_cannot_isolate(monkeypatch):
    tasks.isolation_problem.cache_clear()
    monkeypatch.setattr(tasks.shutil, "which", lambda name: None)
    try:
        with pytest.raises(HyflashError, match="without isolation"):
            _check("    return 1\n")
    finally:
        tasks.isolation_problem.cache_clear()


@needs_isolation
def test_it_writes_only_in_its_own_fresh_folder(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    outside = tmp_path / "escaped.txt"
    tries = (f"    import os\n    ok = 0\n"
             f"    for act in (lambda: open({str(outside)!r}, 'w').write('x'), lambda: os.remove({str(keep)!r})):\n"
             f"        try:\n            act(); ok = 1\n        except OSError:\n            pass\n"
             f"    return ok\n")
    assert _check(tries).status == "failed"
    assert keep.read_text() == "mine" and not outside.exists()
    inside = ("    import os\n    open('scratch.txt', 'w').write('x')\n"
              "    return int(os.path.basename(os.getcwd()).startswith('hyflash-he-') and os.listdir('.') != [])\n")
    assert _check(inside).status == "passed"  # its working folder is a fresh temporary one, writable
    assert not Path("scratch.txt").exists()


@needs_isolation
def test_it_has_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        connect = (f"    import socket\n    try:\n"
                   f"        socket.create_connection(('127.0.0.1', {port}), timeout=2)\n        return 1\n"
                   f"    except OSError:\n        return 0\n")
        assert _check(connect).status == "failed"
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody came
    finally:
        server.close()


def _alive(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                pids.append(int(entry))
        except OSError:
            pass
    return pids


@needs_isolation
@pytest.mark.parametrize("ending", ["return", "timeout"])
def test_what_it_forks_dies_with_it(ending):
    """A child in a session of its own (out of the process group) sleeping on: dead once the check returns,
    whether the program ended by itself or was stopped at the timeout."""
    marker = f"{time.time() % 1000:.6f}"  # this run's sleeper, told apart by its argument
    spawn = (f"    import subprocess\n"
             f"    subprocess.Popen(['/bin/sleep', '{marker}'], start_new_session=True)\n"
             + ("    return 1\n" if ending == "return" else "    while True:\n        pass\n"))
    status = _check(spawn, timeout=2.0).status
    assert status == ("passed" if ending == "return" else "timeout")
    # The kernel kills a PID namespace's processes when its init dies, asynchronously: allow it a moment
    # (the sleeper would otherwise sleep on for up to 1,000 s).
    deadline = time.monotonic() + 5
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(marker) == []
