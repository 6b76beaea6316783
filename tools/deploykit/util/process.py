"""What every simulator runner does with its process: ports, the run directory, stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

from deploykit.util.errors import ConfigError


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
