"""Runs the static aarch64 Linux runner of a Cortex-A board (family linux_aarch64) and decodes
the result protocol from its standard output.

- Without `--host`: under `qemu-aarch64` (Debian's qemu-user) on this machine, with the board's
  `linux.qemu_cpu`. This is the parity path: emulated time is no measurement of the board.
- With `--host HOST` (an SSH host alias or user@host; default: the board file's
  `linux.ssh_host`): the system's `ssh`/`scp` copy the runner to the board's `linux.remote_dir`
  and run it there. The user's own SSH configuration and agent are used; deploykit stores no
  credentials and never answers a prompt (BatchMode). `DEPLOYKIT_SSH_CONFIG` names an ssh
  configuration file to use instead of the user's (`ssh -F`), and `DEPLOYKIT_REMOTE_EXEC` a
  command the remote side runs the runner through (e.g. `qemu-aarch64` on a host without
  binfmt support for aarch64: the tests' loopback "board").

The runner embeds the `.pte` and its inputs, so one file is copied. Its exit status is the
`done` status (dk_exit), so the exit code is checked against the protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from deploykit.readers.protocol import Decoder, RunRecords
from deploykit.run.runners.base import DEFAULT_TIMEOUT_S, Runner, RunnerOption, RunResult
from deploykit.util.errors import ConfigError, EnvironmentProblem, RunError
from deploykit.util.process import kill_group, run_dir_for

QEMU_USER = "qemu-aarch64"
QEMU_USER_APT_PACKAGE = "qemu-user"
DEFAULT_REMOTE_DIR = "/tmp/deploykit"
_READ_CHUNK = 65536
_SSH_BASE = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15")


class LinuxRunner(Runner):
    """A static aarch64 Linux program: under qemu-aarch64 here, or on the board over SSH."""

    kind = "linux"
    supports_exit_code = True
    supports_icount = False
    is_simulator = False  # a board over SSH; under qemu-user it only emulates the CPU
    options = (
        RunnerOption(
            "--host",
            "host",
            "HOST",
            "linux boards: run on this SSH host (alias or user@host) instead of "
            "qemu-aarch64 here; default: the board file's linux.ssh_host",
        ),
        RunnerOption(
            "--threads",
            "threads",
            "N",
            "linux boards: XNNPACK threads of the runner (default: the board file's "
            "linux.threads, its cores)",
        ),
    )

    def __init__(
        self,
        config: Mapping[str, Any],
        linux: Mapping[str, Any],
        *,
        host: str | None = None,
        threads: int | str | None = None,
        qemu: str = QEMU_USER,
        done_grace_s: float = 5.0,
    ) -> None:
        if config.get("kind") != "linux":
            raise ConfigError(f"runner kind {config.get('kind')!r} is not linux")
        self.qemu_cpu: str = str(linux["qemu_cpu"])
        self.host: str | None = host or linux.get("ssh_host")
        self.remote_dir: str = str(linux.get("remote_dir", DEFAULT_REMOTE_DIR))
        try:
            self.threads = int(threads if threads is not None else linux["threads"])
        except (TypeError, ValueError):
            self.threads = 0
        if not 1 <= self.threads <= 256:
            raise ConfigError(
                f"--threads {threads!r}: not a thread count.", "Give a whole number from 1 to 256."
            )
        self.qemu = qemu
        self.done_grace_s = done_grace_s
        self._log_path: Path | None = None  # the current run's runner.log

    @classmethod
    def from_board(
        cls, board: Any, *, progress: Any = None, workspace: Path | None = None, **kwargs: Any
    ) -> LinuxRunner:
        raw = board.raw if hasattr(board, "raw") else board
        if "linux" not in raw:
            raise ConfigError(
                f"board {raw.get('name', '?')}: no `linux:` section",
                "Add `linux: {threads: 4, qemu_cpu: cortex-a76}`.",
            )
        return cls(
            board.runner if hasattr(board, "runner") else raw["runner"], raw["linux"], **kwargs
        )

    @property
    def where(self) -> str:
        return f"ssh {self.host}" if self.host else f"{self.qemu} -cpu {self.qemu_cpu}"

    @property
    def emulated_by(self) -> str | None:
        """The emulator the runner's CPU is when it is one: qemu-user here, or a qemu command
        the remote side runs it through (DEPLOYKIT_REMOTE_EXEC). None on a real board."""
        if not self.host:
            return f"{self.qemu} -cpu {self.qemu_cpu}, qemu-user on this machine"
        wrapper = os.environ.get("DEPLOYKIT_REMOTE_EXEC", "").strip()
        if wrapper and "qemu" in Path(wrapper.split()[0]).name:
            return f"{wrapper} on {self.host}"
        return None

    def check_environment(self) -> str:
        tools = ("ssh", "scp") if self.host else (self.qemu,)
        missing = [t for t in tools if shutil.which(t) is None]
        if missing:
            package = "openssh-client" if self.host else QEMU_USER_APT_PACKAGE
            raise EnvironmentProblem(
                f"{', '.join(missing)} not found on PATH; it runs the runner for this board.",
                f"Install it: sudo apt-get install {package}.",
            )
        return shutil.which(tools[0]) or tools[0]

    # ---- commands ---------------------------------------------------------------------------

    def ssh_options(self) -> list[str]:
        config = os.environ.get("DEPLOYKIT_SSH_CONFIG")
        return [*(["-F", config] if config else []), *_SSH_BASE]

    def remote_path(self, elf: Path) -> str:
        """Where the runner lands on the board: named by its content, so a stale copy is
        never run."""
        digest = hashlib.sha256(Path(elf).read_bytes()).hexdigest()[:12]
        return f"{self.remote_dir}/dk_runner-{digest}"

    def command(self, elf: Path) -> list[str]:
        """The command whose standard output is the result protocol."""
        if not self.host:
            return [self.qemu, "-cpu", self.qemu_cpu, str(elf)]
        wrapper = os.environ.get("DEPLOYKIT_REMOTE_EXEC", "")
        remote = f"DK_THREADS={self.threads} {wrapper} {shlex.quote(self.remote_path(elf))}"
        return ["ssh", *self.ssh_options(), self.host, remote.replace("  ", " ")]

    def _copy(self, elf: Path, log: BinaryIO, deadline: float) -> None:
        """Copy the runner to the board (mkdir + scp), unless it is there already."""
        target = self.remote_path(elf)
        steps = [
            [
                "ssh",
                *self.ssh_options(),
                self.host or "",
                f"mkdir -p {shlex.quote(self.remote_dir)} && test -x {shlex.quote(target)}",
            ],
            ["scp", "-q", *self.ssh_options(), str(elf), f"{self.host}:{target}.part"],
            [
                "ssh",
                *self.ssh_options(),
                self.host or "",
                f"chmod +x {shlex.quote(target)}.part && mv {shlex.quote(target)}.part "
                f"{shlex.quote(target)}",
            ],
        ]
        for i, cmd in enumerate(steps):
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            try:
                res = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=max(5.0, deadline - time.monotonic()),
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise RunError(
                    f"Copying the runner to {self.host} timed out.",
                    "Check that `ssh HOST true` works without a prompt.",
                ) from e
            if i == 0 and res.returncode == 0:
                return  # the same runner is there already
            if i == 0 and res.returncode == 255:
                raise EnvironmentProblem(
                    f"ssh could not connect to {self.host} (exit 255).",
                    "Check `ssh HOST true` (host alias, key in your agent or ssh config; "
                    "deploykit never answers a password prompt).",
                    log_path=str(self._log_path),
                )
            if i > 0 and res.returncode != 0:
                raise EnvironmentProblem(
                    f"Copying the runner to {self.host}:{target} failed (exit {res.returncode}).",
                    f"Check that {self.remote_dir} is writable there "
                    "and that scp works (sshd's sftp subsystem).",
                    log_path=str(self._log_path),
                )

    # ---- run --------------------------------------------------------------------------------

    def run(
        self, elf: Path, out_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, check: bool = True
    ) -> RunResult:
        self.check_environment()
        elf = Path(elf)
        run_dir = run_dir_for(elf, out_dir)
        console_path, log_path = run_dir / "console.bin", run_dir / "runner.log"
        self._log_path = log_path
        start = time.monotonic()
        deadline = start + timeout_s
        dec = Decoder()
        timed_out = killed = False
        proc: subprocess.Popen | None = None
        env = {**os.environ, "DK_THREADS": str(self.threads)}
        with (
            open(console_path.with_suffix(".part"), "wb") as console,
            open(log_path.with_suffix(".part"), "wb") as log,
        ):
            try:
                if self.host:
                    self._copy(elf, log, deadline)
                cmd = self.command(elf)
                log.write(f"$ {shlex.join(cmd)}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
                assert proc.stdout is not None
                timed_out, killed = self._pump(proc, proc.stdout, dec, console, deadline)
            finally:
                if proc is not None and proc.poll() is None:
                    kill_group(proc)
                    killed = True
                # Complete files only, also when the copy failed (its log says why).
                console.close()
                log.close()
                os.replace(console_path.with_suffix(".part"), console_path)
                os.replace(log_path.with_suffix(".part"), log_path)
        dec.finish()
        records = RunRecords.build(dec.records, dec.stats)
        exit_code = None if killed or proc is None else proc.returncode
        if self.host and exit_code == 255:
            exit_code = None  # ssh's own failure, not the runner's status
        result = RunResult(
            records=records,
            exit_code=exit_code,
            wall_seconds=time.monotonic() - start,
            console_log=console_path,
            runner_log=log_path,
            runner=f"the runner ({self.where})",
            supports_exit_code=self.supports_exit_code,
            timed_out=timed_out,
            timeout_s=timeout_s,
            killed=killed,
            command=tuple(cmd),
            notes=[f"{self.threads} thread(s)"],
            emulated_by=self.emulated_by,
        )
        return result.check() if check else result

    def _pump(
        self,
        proc: subprocess.Popen,
        stdout: BinaryIO,
        dec: Decoder,
        console: BinaryIO,
        deadline: float,
    ) -> tuple[bool, bool]:
        """Read the runner's standard output until it closes. Returns (timed_out, killed)."""
        fd = stdout.fileno()
        done_deadline: float | None = None
        while True:
            now = time.monotonic()
            if done_deadline is None and now >= deadline:
                kill_group(proc)
                return True, True
            if done_deadline is not None and now >= done_deadline:
                kill_group(proc)  # done arrived, but the runner did not exit
                return False, True
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            data = os.read(fd, _READ_CHUNK)
            if not data:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                return False, proc.poll() is None
            console.write(data)
            dec.feed(data)
            if dec.done and done_deadline is None:
                done_deadline = time.monotonic() + self.done_grace_s
