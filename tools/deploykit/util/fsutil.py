"""Atomic file writes: nothing is ever left half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from deploykit.util.errors import NO_SPACE_ERRNOS, disk_full


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` through a temp file in the same directory and a rename. A full
    file system is a DiskFullError naming `path` (the temp file is gone, `path` unchanged)."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise disk_full(path, exc) from exc
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        # mkstemp creates 0600; give the file the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            raise disk_full(path, exc) from exc
        raise


def write_if_changed(path: Path, data: bytes | str) -> bool:
    """Atomically write `path` unless it already holds `data`; keeps mtimes stable for make."""
    raw = data.encode() if isinstance(data, str) else data
    if Path(path).exists() and Path(path).read_bytes() == raw:
        return False
    write_atomic(path, raw)
    return True
