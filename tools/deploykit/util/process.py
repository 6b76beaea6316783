"""What every simulator runner does with its process: ports, the run directory, stopping; and
the version a tool reports, for cache keys."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
from pathlib import Path

from deploykit.util.errors import ConfigError, EnvironmentProblem


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_version(argv: list[str], purpose: str) -> str:
    """The first line `argv` (a compiler's `--version`) prints. A version that cannot be had
    is an EnvironmentProblem naming the program: `purpose` (a cache key) must not hold an empty
    or made-up version, under which a build by another compiler would pass for this one."""
    command = shlex.join(argv)
    hint = ("Check the cross toolchain (deploykit doctor); scripts/install installs it, or put "
            "the right one first on PATH.")
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentProblem(
            f"`{command}` could not run ({exc}); {purpose} needs the compiler's version.", hint
        ) from exc
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        said = res.stderr.strip().splitlines()
        detail = f": {said[-1]}" if said else ", no output" if not lines else ""
        raise EnvironmentProblem(
            f"`{command}` failed (exit {res.returncode}{detail}); {purpose} needs the "
            "compiler's version.", hint)
    return lines[0].strip()


def run_dir_for(elf: Path, out_dir: Path) -> Path:
    """Check the ELF exists and return `<out_dir>/run/`, created."""
    if not Path(elf).is_file():
        raise ConfigError(f"ELF not found: {elf}", "Build the firmware first (deploykit build).")
    run_dir = Path(out_dir) / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def kill_group(proc: subprocess.Popen, *, interrupt_first: bool = False) -> None:
    """Stop a process started in a session of its own and everything it started: SIGTERM to
    its process group, then SIGKILL. `interrupt_first`: SIGINT before them, as Ctrl-C would
    send it (ninja then removes the outputs of the commands it was running)."""
    if proc.poll() is not None:
        return
    steps = ((signal.SIGINT, 5.0),) if interrupt_first else ()
    for sig, wait_s in (*steps, (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
