"""Drive CMake + Ninja: configure once per cache key, build with progress, log to files."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from deploykit.readers.doctor import require_tools
from deploykit.util.errors import NO_SPACE_ERRNOS, BuildError, DiskFullError, disk_full
from deploykit.util.process import kill_group

_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
# What CMake and Ninja keep at the top of a build directory about the source tree they were
# configured from; without them the directory is configured and built from scratch.
_CMAKE_STATE = ("CMakeCache.txt", "CMakeFiles", "build.ninja", ".ninja_log", ".ninja_deps",
                "cmake_install.cmake")


@dataclass(frozen=True)
class CMakeResult:
    build_dir: Path
    configure_seconds: float
    build_seconds: float
    log: Path


class _Log:
    """The build's log file and its last lines in memory: on a full disk the file loses what
    the tools said (their own "No space left on device" among it), the memory does not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: deque[str] = deque(maxlen=30)
        self.full: OSError | None = None  # the log's own write that the disk refused
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file: IO[str] | None = path.open("a")
        except OSError as exc:
            self._refused(exc)

    def write(self, line: str) -> None:
        self.lines.append(line.rstrip("\n"))
        if self.file is None:
            return
        try:
            self.file.write(line)
            self.file.flush()
        except OSError as exc:
            self._refused(exc)

    def _refused(self, exc: OSError) -> None:
        if exc.errno not in NO_SPACE_ERRNOS:
            raise exc
        self.full, self.file = exc, None

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()


# Free bytes under which a file system a failed step wrote to is taken for its cause (CMake
# does not always say so: it reports "Generating done" without the build.ninja it could not
# write).
NEARLY_FULL = 1 << 20


def _nearly_full(places: tuple[Path, ...]) -> tuple[Path, int] | None:
    for place in places:
        probe = next((p for p in (place, *place.parents) if p.exists()), None)
        if probe is None:
            continue
        stat = os.statvfs(probe)
        if stat.f_bavail * stat.f_frsize < NEARLY_FULL:
            return place, stat.f_bavail * stat.f_frsize
    return None


def _run_logged(cmd: list[str], log_path: Path, what: str,
                progress: Callable[[str], None] | None,
                writes_to: tuple[Path, ...] = ()) -> None:
    """Run `cmd`, its output into the log; a failure is a BuildError with the log's last
    lines, or a DiskFullError when the disk refused the log, the tools said so, or a file
    system the step writes to (`writes_to`, the log's own too) is left nearly full."""
    last_report = 0.0
    log = _Log(log_path)
    try:
        log.write("$ " + " ".join(cmd) + "\n")
        # A session of its own, so that an interrupted deploykit stops CMake, ninja and the
        # compilers they run, whoever sent the signal (runners/process.py: kill_group).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                m = _NINJA_PROGRESS.match(line)
                now = time.monotonic()
                if progress and m and (now - last_report > 2.0 or m.group(1) == m.group(2)):
                    progress(f"{what}: {m.group(1)}/{m.group(2)}")
                    last_report = now
            rc = proc.wait()
        except BaseException:
            kill_group(proc, interrupt_first=True)
            raise
    finally:
        log.close()
    if rc != 0:
        tail = "\n".join(log.lines)
        if log.full is not None:
            raise disk_full(log_path, log.full)
        hint = ("Free space there and run the command again; what was cut short is made "
                "again.")
        if "No space left on device" in tail:  # the compiler's, the linker's, CMake's words
            raise DiskFullError(f"{what} failed: a file system is full. Last lines:\n{tail}",
                                hint, log_path=str(log_path))
        full = _nearly_full((log_path.parent, *writes_to))
        if full is not None:
            place, free = full
            raise DiskFullError(f"{what} failed with {free:,} B left on the file system of "
                                f"{place}: it is full. Last lines:\n{tail}", hint,
                                log_path=str(log_path))
        raise BuildError(f"{what} failed (exit {rc}). Last lines:\n{tail}",
                         "Fix the error above; the full log has every command.",
                         log_path=str(log_path))


def cmake_build(source_dir: Path, build_dir: Path, definitions: dict[str, str],
                toolchain_file: Path, *, target: str | None = None,
                progress: Callable[[str], None] | None = None,
                log_name: str = "build.log",
                compiler: str = "arm-none-eabi-gcc") -> CMakeResult:
    """Configure `source_dir` into `build_dir` (if its definitions changed) and build it."""
    require_tools("cmake", "ninja", compiler)
    log = build_dir / log_name
    build_dir.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    # The Python the build's code generators run on: deploykit's own (the .venv, which need
    # not be on PATH), not whichever python3 CMake would find first.
    defs = {"CMAKE_TOOLCHAIN_FILE": str(toolchain_file), "PYTHON_EXECUTABLE": sys.executable,
            **definitions}
    args = [f"-D{k}={v}" for k, v in sorted(defs.items())]
    # Where the build writes besides its own directory: the shared runtime cache.
    writes_to = tuple(Path(defs[k]) for k in ("DK_ET_RUNTIME_CACHE_DIR",) if defs.get(k))
    stamp = build_dir / "deploykit-configure.args"
    t0 = time.monotonic()
    _forget_another_source(source_dir, build_dir, stamp, progress)
    if not (build_dir / "build.ninja").exists() or not stamp.exists() \
            or stamp.read_text() != "\n".join(args):
        if progress:
            progress(f"configuring {source_dir.name} in {build_dir}")
        # No stamp while configuring: an interrupted configure leaves a cache that matches
        # neither the old arguments nor the new ones, and must not be trusted.
        stamp.unlink(missing_ok=True)
        _run_logged(["cmake", "-S", str(source_dir), "-B", str(build_dir), "-G", "Ninja",
                     *args], log, "CMake configure", progress, writes_to)
        stamp.write_text("\n".join(args))
    t1 = time.monotonic()
    cmd = ["cmake", "--build", str(build_dir)]
    if target:
        cmd += ["--target", target]
    _run_logged(cmd, log, f"building {source_dir.name}", progress, writes_to)
    return CMakeResult(build_dir, t1 - t0, time.monotonic() - t1, log)


def configured_source(build_dir: Path) -> Path | None:
    """The source tree a CMake build directory was configured from (None: not configured)."""
    try:
        text = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
            return Path(line.partition("=")[2])
    return None


def _forget_another_source(source_dir: Path, build_dir: Path, stamp: Path,
                           progress: Callable[[str], None] | None) -> None:
    """A build directory configured from another source tree (another checkout of deploykit,
    an upgraded install) is one CMake refuses to configure again ("The source ... does not
    match the source ... used to generate cache"): its CMake and Ninja state goes, so that it
    is configured and built from scratch from this one."""
    cached = configured_source(build_dir)
    if cached is None or cached.resolve() == source_dir.resolve():
        return
    if progress:
        progress(f"{build_dir} was configured from {cached}: configuring it from scratch "
                 f"from {source_dir}")
    stamp.unlink(missing_ok=True)
    for name in _CMAKE_STATE:
        path = build_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
