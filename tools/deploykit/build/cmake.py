"""Drive CMake + Ninja: configure once per cache key, build with progress, log to files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploykit.readers.doctor import require_tools
from deploykit.util.errors import BuildError, DiskFullError
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


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _run_logged(cmd: list[str], log: Path, what: str,
                progress: Callable[[str], None] | None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    last_report = 0.0
    with log.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        # A session of its own, so that an interrupted deploykit stops CMake, ninja and the
        # compilers they run, whoever sent the signal (runners/process.py: kill_group).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                out.write(line)
                m = _NINJA_PROGRESS.match(line)
                now = time.monotonic()
                if progress and m and (now - last_report > 2.0 or m.group(1) == m.group(2)):
                    progress(f"{what}: {m.group(1)}/{m.group(2)}")
                    last_report = now
            rc = proc.wait()
        except BaseException:
            kill_group(proc, interrupt_first=True)
            raise
    if rc != 0:
        tail = _tail(log)
        if "No space left on device" in tail:  # the compiler's, the linker's, CMake's words
            raise DiskFullError(f"{what} failed: a file system is full. Last lines:\n{tail}",
                                "Free space where the lines above write (the build "
                                "directory, or the workspace's runtime cache) and run the "
                                "command again; Ninja rebuilds what was cut short.",
                                log_path=str(log))
        raise BuildError(f"{what} failed (exit {rc}). Last lines:\n{tail}",
                         "Fix the error above; the full log has every command.",
                         log_path=str(log))


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
                     *args], log, "CMake configure", progress)
        stamp.write_text("\n".join(args))
    t1 = time.monotonic()
    cmd = ["cmake", "--build", str(build_dir)]
    if target:
        cmd += ["--target", target]
    _run_logged(cmd, log, f"building {source_dir.name}", progress)
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
