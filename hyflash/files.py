"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half of one.

The bytes go to a temporary file beside the target, are flushed to disk, then renamed over it (os.replace is
atomic on one filesystem), and the folder is flushed too, so that the rename itself survives a power cut. Data
shards, manifests, summaries, reports and calibration files are all written this way; folders (drafters,
checkpoints) are filled beside their place and swapped in with `replace_folder`.

Append-only JSONL logs are the one thing written in place: a kill in the middle of an append can leave a last line
cut short, which `read_jsonl` leaves out (and with repair=True, removes from the file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_writer(path: Path):
    """An open binary file whose bytes replace `path` only if the block ends without an exception (large files
    are streamed through it); on an exception the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def atomic_write_jsonl(path: Path, records) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: Path, repair: bool = False) -> list[dict]:
    """The records of a JSONL file ([] if there is none), leaving out a line cut short by a kill in the middle of
    an append. repair=True also rewrites the file without such a line, so that the next append starts clean."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if repair and len(records) < len(lines):
        atomic_write_jsonl(path, records)
    return records


def temporary_folder_beside(final: Path) -> Path:
    """A fresh empty folder next to `final` (same filesystem), to fill before `replace_folder` moves it there."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))


def replace_folder(tmp: Path, final: Path, old: Path | None = None) -> Path:
    """Move the finished folder `tmp` to `final`, replacing what was there, so that a reader (or a run killed
    mid-swap) finds one complete folder: the old one is renamed aside to `old` (default `final`.old) before
    `tmp` is renamed in, and removed after. Folder renames are atomic where file renames are."""
    tmp, final = Path(tmp), Path(final)
    old = Path(old) if old is not None else final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_folder(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in 1 MiB blocks (checkpoints are GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
