"""deploykit killed while it writes its entries, and deploykit on a full disk (issue #31).

- `kill_tree`: SIGKILL a command and everything it started (CMake and Ninja run in sessions of
  their own, so a process group is not enough: the tree is read from /proc and stopped first,
  so that nothing forks past the kill), as a power cut or the OOM killer would leave it.
- `private_workspace`: a workspace whose sources are links to an existing one's, with a
  runtime cache of its own, so that a killed runtime build damages nothing shared.
- `small_disk`: a tmpfs of a given size (needs the right to mount: root).

The next command after a kill must reuse a complete entry or rebuild it, never take a
half-written one: its firmware is compared byte for byte with a clean build's, at the same
paths. bench/soak --parts kill,disk runs 30 kill points spread over a cold build (export,
configure, compile, archive, the fit's run and record, the final link) and a full disk at
several sizes; tests/unit/test_interrupted_writes.py runs one of each, fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, whatever session it started."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill_tree(pid: int) -> int:
    """SIGSTOP the tree (until no new process appears), then SIGKILL it; how many died."""
    stopped: set[int] = set()
    while True:
        tree = set(descendants(pid)) - stopped
        if not tree:
            break
        for p in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        stopped |= tree
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return len(stopped)


def private_workspace(dest: Path, sources: Path) -> Path:
    """A workspace at `dest` with `sources`' projects linked and its state copied; its
    runtime cache is its own."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sources.iterdir():
        if entry.name == "runtime-cache":
            continue
        link = dest / entry.name
        if entry.is_dir() and not link.exists():
            link.symlink_to(entry)
        elif entry.is_file():
            shutil.copy2(entry, link)
    return dest


@dataclass
class Run:
    returncode: int | None  # None: killed
    seconds: float
    last_line: str  # the last progress line before the end (or the kill)
    stderr: str


def deploykit(args: list[str], cwd: Path, kill_after: float | None = None,
              kill_when: Path | None = None, timeout: float = 1800) -> Run:
    """`deploykit ARGS` with this checkout's package; its tree killed `kill_after` seconds in,
    or as soon as `kill_when` exists (looked for every 5 ms)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(ROOT)]),
           "CI": "1"}  # plain progress lines, one per step
    # Killed when a file appears: the child runs at the lowest priority, so that on a busy
    # machine this poller still wakes within its 5 ms, before the child has written on (the
    # export writes its key a few milliseconds after its program).
    proc = subprocess.Popen([sys.executable, "-m", "deploykit", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=(lambda: os.nice(19)) if kill_when else None)
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    started, lines, buffer = time.monotonic(), [], b""
    deadline = started + (kill_after if kill_after is not None else timeout)

    def killed() -> Run:
        kill_tree(proc.pid)
        proc.wait()
        return Run(None, time.monotonic() - started, lines[-1] if lines else "",
                   "\n".join(lines))

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            if kill_after is None:
                killed()
                raise TimeoutError(f"deploykit {' '.join(args)} ran for {timeout} s")
            return killed()
        ready, _, _ = select.select([fd], [], [], min(left, 0.005) if kill_when else left)
        if kill_when is not None and kill_when.exists():
            return killed()
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines += [line.decode(errors="replace") for line in complete]
    code = proc.wait()
    if buffer:
        lines.append(buffer.decode(errors="replace"))
    return Run(code, time.monotonic() - started, lines[-1] if lines else "", "\n".join(lines))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` (created), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def can_mount() -> str | None:
    """None when a tmpfs can be mounted here, else why not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "mounting a small tmpfs needs root and mount(8)"
    probe = Path(f"/tmp/dk-mount-probe-{os.getpid()}")
    try:
        with small_disk(probe, 1 << 16):
            return None
    except subprocess.CalledProcessError as exc:
        return f"mount -t tmpfs is refused here: {exc.stderr.strip()}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def fill(disk: Path, leave: int) -> Path:
    """A file that fills `disk` up to `leave` free bytes."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    filler = disk / ".filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        remaining = max(free - leave, 0)
        block = b"\0" * (1 << 20)
        while remaining > 0:
            n = min(remaining, len(block))
            try:
                f.write(block[:n])
                f.flush()
            except OSError:
                break
            remaining -= n
    return filler
