"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half of one.

The bytes go to a temporary file beside the target, are flushed to disk, then renamed over it (os.replace is
atomic on one filesystem). Data shards, manifests, summaries and calibration files are all written this way.
"""

from __future__ import annotations

import json
import os
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
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())
