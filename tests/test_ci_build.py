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


def _fake_pip(tmp_path: Path, version: str) -> Path:
    """A pip whose `download` writes a source package holding an unrelated llama.cpp tree, and whose other
    commands log their arguments."""
    tree = tmp_path / "sdist" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp" / "ggml"
    tree.mkdir(parents=True)
    (tree / "README").write_text("not the file the patch changes\n")
    pip = tmp_path / "pip"
    pip.write_text(f"""#!/bin/sh
if [ "$1" = download ]; then
  while [ "$1" != -d ]; do shift; done
  tar czf "$2/llama_cpp_python-{version}.tar.gz" -C "{tmp_path / 'sdist'}" llama_cpp_python-{version}
else
  echo "$@" >> "{tmp_path / 'pip.log'}"
fi
""")
    pip.chmod(0o755)
    return pip


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch")
def test_the_llama_cpp_build_script_patches_or_says_why_not(tmp_path):
    """patches/build_llama_cpp_python.sh: a source package the patch does not fit stops the build with a message
    naming the fix; `stock` builds it unpatched; a wrong mode is refused."""
    version = next(line.split("==")[1].strip() for line in (ROOT / "requirements-llamacpp.txt").read_text().splitlines()
                   if line.startswith("llama-cpp-python=="))
    assert (ROOT / "patches" / f"llama-cpp-python-{version}-ggml-x86-two-by-two.patch").exists()
    script = str(ROOT / "patches" / "build_llama_cpp_python.sh")
    pip = str(_fake_pip(tmp_path, version))
    run = lambda *args: subprocess.run([script, pip, "-DGGML_LLAMAFILE=OFF", *args], capture_output=True,  # noqa: E731
                                       text=True, timeout=60)
    patched = run()
    assert patched.returncode == 1 and "does not apply" in patched.stderr and "build stock" in patched.stderr
    assert not (tmp_path / "pip.log").exists()  # nothing installed
    stock = run("stock")
    assert stock.returncode == 0, stock.stderr
    installs = (tmp_path / "pip.log").read_text().splitlines()
    assert installs[0].startswith("install --quiet --no-cache-dir --force-reinstall --no-deps /")
    assert installs[0].endswith(f"llama_cpp_python-{version}") and "requirements-llamacpp.txt" in installs[1]
    wrong = run("fast")
    assert wrong.returncode == 1 and "must be patch or stock" in wrong.stderr
