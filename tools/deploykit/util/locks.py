"""One deploykit command at a time per output directory (`--out`).

Two commands on the same directory would interleave their exports, generated files, builds
and runs. The first takes an exclusive `fcntl.flock` on `<out>/.deploykit.lock`; a second one
says which process holds it and waits (Ctrl-C stops the wait). The lock goes with the process:
a command that is killed cannot leave a stale lock. Nested stages of one command (run →
build → export) take it once.

The ExecuTorch runtime cache has its own locks: for the bare-metal runtimes taken by CMake
(`file(LOCK)`, which is `fcntl` too) in cmake/executorch-runtime/configure.cmake and build.cmake;
for the aarch64 Linux runtime `file_lock` below (families/linux_runtime.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_NAME = ".deploykit.lock"
_held: dict[Path, int] = {}  # the directories this process holds, with their nesting depth


def _tell_stderr(message: str) -> None:
    print(f"deploykit: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def out_lock(out: Path, on_wait: Callable[[str], None] = _tell_stderr) -> Iterator[None]:
    """Hold `out` exclusively for the duration; wait, saying so, while another process does."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    key = out.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    with file_lock(out / LOCK_NAME, str(out), on_wait):
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            if created:  # a command that wrote nothing (it failed first) leaves no directory
                with contextlib.suppress(OSError):
                    if [p.name for p in out.iterdir()] == [LOCK_NAME]:
                        (out / LOCK_NAME).unlink()
                        out.rmdir()


@contextlib.contextmanager
def file_lock(lock_file: Path, what: str,
              on_wait: Callable[[str], None] = _tell_stderr) -> Iterator[None]:
    """Hold an exclusive flock on `lock_file` (which names its holder) for the duration; wait,
    saying which process has `what`, while another one holds it."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            on_wait(f"waiting for {holder} to finish with {what}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv[1:3]) or 'python'})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
