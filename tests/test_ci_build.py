"""Under CI (CI=true) a llama-cpp-python that did not build fails the build and the tests, instead of leaving
`make test` green with every llama.cpp test skipped (issue 39, item 10)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_llama_cpp

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("ci", [False, True])
def test_a_missing_llama_cpp_skips_locally_and_fails_under_ci(monkeypatch, ci):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    monkeypatch.setenv("CI", "true") if ci else monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="llama-cpp-python"):
        import_llama_cpp()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("ci", [False, True])
def test_a_failed_llama_cpp_build_fails_make_under_ci(tmp_path, ci):
    """The Makefile's llama-cpp-python step with a pip that always fails: a warning and the stamp locally, a
    non-zero exit and no stamp under CI=true."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    pip = venv / "bin" / "pip"
    pip.write_text("#!/bin/sh\nexit 1\n")
    pip.chmod(0o755)
    (venv / ".installed").touch()  # the rest of the venv is there (newer than the requirements)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    stamp = venv / ".installed-llamacpp"
    proc = subprocess.run(["make", "-C", str(ROOT), f"VENV={venv}", str(stamp)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "llama-cpp-python did not build" in proc.stderr
    assert (proc.returncode != 0) == ci and stamp.exists() != ci, proc.stderr


def test_the_ci_entry_point_sets_ci():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "export CI=true" in lines
    assert lines.index("export CI=true") < lines.index("make test")
