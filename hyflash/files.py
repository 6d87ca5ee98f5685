"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half of one.

The bytes go to a temporary file beside the target, are flushed to disk, then renamed over it (os.replace is
atomic on one filesystem). Data shards, manifests, summaries and calibration files are all written this way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())
