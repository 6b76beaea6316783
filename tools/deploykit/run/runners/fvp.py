"""Run firmware on an Arm Ecosystem FVP (Corstone-300/-320) and decode its console.

The command line comes from the board file: the `runner:` section names the FVP binary, the
`-C` parameter that takes the NPU's MAC count (`macs_param`), the console UART and its telnet
terminal, the CPU instance whose semihosting is enabled, and further `params`; the MAC count
itself is the board's `npu.macs` (after any --npu-macs override), the same field Vela compiled
for, so the two cannot disagree.

Console, per the FVP's documented parameters (`FVP_... --list-params`):
- `file` (default): `<uart>.out_file=<run>/console.bin` with `unbuffered_output=1`; the file
  is followed while the FVP runs and fed to the protocol Decoder;
- `telnet`: `<telnet>.mode=raw`, `start_telnet=0` and `start_port`; the FVP prints the port it
  listens on ("Listening for serial connection on port N"), which the runner then reads.
Both set `<uart>.shutdown_on_eot=1`, and semihosting is enabled so the firmware's
SYS_EXIT_EXTENDED ends the simulation.

Success needs a done record with status 0 and the FVP's own exit status 0. The FVP's
exit status is not assumed to mirror done.status (`supports_exit_code` is False). A host
timeout applies, and `--timelimit` (the FVP's own limit, in host seconds) is set just past it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.readers.protocol import Decoder, Outcome, RunRecords
from deploykit.run.runners.base import DEFAULT_TIMEOUT_S, Runner, RunResult, runner_section
from deploykit.util.errors import ConfigError, EnvironmentProblem, ExitCode
from deploykit.util.process import free_port, kill_group, run_dir_for

FVP_DIR_ENV = "DEPLOYKIT_FVP_DIR"
CONSOLE_MODES = ("file", "telnet")
CONFIG_KEYS = frozenset({"kind", "binary", "macs_param", "uart", "telnet", "semihosting",
                         "params", "note", "console"})
REQUIRED_KEYS = ("binary", "macs_param", "uart", "telnet", "semihosting")
ECOSYSTEM_FVPS_URL = "https://developer.arm.com/downloads/-/arm-ecosystem-fvps"
# The packages ExecuTorch v1.4.1's backends/arm/scripts/fvp_utils.sh installs (x86-64 Linux).
FVP_DOWNLOADS = {
    "FVP_Corstone_SSE-300_Ethos-U55": "https://developer.arm.com/-/cdn-downloads/permalink/"
    "FVPs-Corstone-IoT/Corstone-300/FVP_Corstone_SSE-300_11.27_42_Linux64.tgz",
    "FVP_Corstone_SSE-320": "https://developer.arm.com/-/cdn-downloads/permalink/"
    "FVPs-Corstone-IoT/Corstone-320/FVP_Corstone_SSE-320_11.27_25_Linux64.tgz",
}
_PORT_RE = re.compile(rb"Listening for serial connection on port (\d+)")
_TIMELIMIT_RE = re.compile(rb"Simulation is stopping\. Reason: CPU time has been exceeded")
_READ_CHUNK = 4096
_POLL_S = 0.05


@dataclass
class FvpRunResult(RunResult):
    """A RunResult whose outcome also requires the FVP to have exited with status 0."""

    def outcome(self) -> Outcome:
        base = super().outcome()
        if not base.ok:
            return base
        if self.killed or self.exit_code is None:
            return Outcome(ExitCode.PROTOCOL,
                           "The firmware sent done (status 0) but the FVP did not exit; it "
                           "was killed.",
                           "The firmware must end the simulation: semihosting "
                           "SYS_EXIT_EXTENDED (or an EOT on the UART with shutdown_on_eot).")
        if self.exit_code != 0:
            return Outcome(ExitCode.PROTOCOL,
                           f"The firmware reported success but the FVP exited with status "
                           f"{self.exit_code}.",
                           f"See the FVP log {self.runner_log}.")
        return base


class FvpRunner(Runner):
    """Runs an ELF on the FVP named by the board's `runner:` section (kind fvp)."""

    kind = "fvp"
    supports_exit_code = False
    supports_icount = False
    is_simulator = True

    def __init__(self, config: Mapping[str, Any], *, npu_macs: int | None = None,
                 console: str | None = None, fvp_dir: str | Path | None = None,
                 connect_timeout_s: float = 20.0, done_grace_s: float = 10.0) -> None:
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ConfigError(f"runner: unknown key(s) {sorted(unknown)} for kind fvp",
                              f"Allowed keys: {sorted(CONFIG_KEYS)}.")
        if config.get("kind", "fvp") != "fvp":
            raise ConfigError(f"runner kind {config.get('kind')!r} is not fvp")
        missing = [k for k in REQUIRED_KEYS if not isinstance(config.get(k), str)
                   or not config.get(k)]
        if missing:
            raise ConfigError(f"runner (kind fvp): missing {', '.join(missing)}",
                              "See boards/corstone-320.yaml for a complete fvp runner section.")
        params = config.get("params") or {}
        if not isinstance(params, Mapping):
            raise ConfigError("runner.params must map FVP parameters to values")
        console = console or config.get("console", "file")
        if console not in CONSOLE_MODES:
            raise ConfigError(f"runner: console {console!r} is not one of {CONSOLE_MODES}")
        self.binary: str = config["binary"]
        self.macs_param: str = config["macs_param"]
        self.uart: str = config["uart"]
        self.telnet: str = config["telnet"]
        self.semihosting: str = config["semihosting"]
        self.params: dict[str, Any] = dict(params)
        for key in self.params:
            if key == self.macs_param or key.endswith(".num_macs"):
                raise ConfigError(f"runner.params sets {key}; the MAC count comes from the "
                                  "board's npu.macs only.",
                                  "Remove it from params: npu.macs (or --npu-macs) feeds both "
                                  "Vela and the FVP.")
        self.npu_macs = npu_macs
        self.console = console
        self.fvp_dir = Path(fvp_dir) if fvp_dir else (
            Path(os.environ[FVP_DIR_ENV]) if os.environ.get(FVP_DIR_ENV) else None)
        self.connect_timeout_s = connect_timeout_s
        self.done_grace_s = done_grace_s

    @classmethod
    def from_board(cls, board: Any, *, progress: Any = None, workspace: Any = None,
                   **kwargs: Any) -> FvpRunner:
        """From a board (Board or mapping): runner section plus the MAC count of its NPU."""

        npu = board.npu
        if npu is not None:
            kwargs.setdefault("npu_macs", npu.macs)
        return cls(runner_section(board), **kwargs)

    # ---- environment -------------------------------------------------------------------

    def find_binary(self) -> str | None:
        if self.fvp_dir is not None:
            for candidate in (self.fvp_dir / self.binary,
                              *sorted(self.fvp_dir.glob(f"**/{self.binary}"))):
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    return str(candidate)
        return shutil.which(self.binary)

    def check_environment(self) -> str:
        path = self.find_binary()
        if path is None:
            where = f"on PATH or in ${FVP_DIR_ENV} ({self.fvp_dir})" if self.fvp_dir \
                else f"on PATH (nor is ${FVP_DIR_ENV} set)"
            download = FVP_DOWNLOADS.get(self.binary)
            raise EnvironmentProblem(
                f"{self.binary} not found {where}; it runs the firmware for this board.",
                f"Get the free Arm Ecosystem FVP ({ECOSYSTEM_FVPS_URL}"
                + (f"; direct package: {download}" if download else "")
                + "), accept its EULA and install it, then put its models/Linux64_GCC-* "
                f"directory on PATH or set {FVP_DIR_ENV} to the install directory.")
        return path

    # ---- command line ------------------------------------------------------------------

    def command(self, elf: Path, *, console_file: Path | None = None, port: int | None = None,
                timelimit_s: float | None = None, fvp: str | None = None) -> list[str]:
        """The FVP command line. `console_file` (file mode) or `port` (telnet mode)."""
        params: list[tuple[str, Any]] = []
        if self.npu_macs is not None:
            params.append((self.macs_param, self.npu_macs))
        params.append((f"{self.semihosting}.semihosting-enable", 1))
        params += sorted(self.params.items())
        params.append((f"{self.uart}.shutdown_on_eot", 1))
        params.append((f"{self.telnet}.start_telnet", 0))
        if self.console == "file":
            if console_file is None:
                raise ValueError("file console needs console_file")
            params += [(f"{self.uart}.out_file", str(console_file)),
                       (f"{self.uart}.unbuffered_output", 1),
                       (f"{self.telnet}.quiet", 1)]
        else:
            params += [(f"{self.telnet}.mode", "raw")]
            if port is not None:
                params.append((f"{self.telnet}.start_port", port))
        cmd = [fvp or self.binary]
        for key, value in params:
            cmd += ["-C", f"{key}={_value(value)}"]
        if timelimit_s is not None:
            cmd += ["--timelimit", str(max(1, math.ceil(timelimit_s)))]
        cmd += ["-a", str(elf)]
        return cmd

    # ---- run ---------------------------------------------------------------------------

    def run(self, elf: Path, out_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
            check: bool = True) -> RunResult:
        fvp = self.check_environment()
        elf = Path(elf)
        run_dir = run_dir_for(elf, out_dir)
        console_path, log_path = run_dir / "console.bin", run_dir / "fvp.log"
        console_path.unlink(missing_ok=True)
        start = time.monotonic()
        deadline = start + timeout_s
        dec = Decoder()
        port = free_port() if self.console == "telnet" else None
        cmd = self.command(elf, console_file=console_path, port=port,
                           timelimit_s=timeout_s + 5.0, fvp=fvp)
        notes: list[str] = []
        timed_out = killed = False
        with open(log_path, "wb") as log:
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                if self.console == "file":
                    timed_out, killed = self._follow_file(proc, console_path, dec, deadline)
                else:
                    with open(console_path, "wb") as console:
                        timed_out, killed = self._follow_telnet(proc, log_path, console, dec,
                                                                deadline)
            finally:
                if proc.poll() is None:
                    kill_group(proc)
                    killed = True
        if _TIMELIMIT_RE.search(log_path.read_bytes()):
            timed_out = True
            notes.append("the FVP's --timelimit stopped the simulation")
        dec.finish()
        records = RunRecords.build(dec.records, dec.stats)
        hang = None
        if timed_out:
            # The FVP's own debug server (Iris) could give the registers; deploykit does not
            # drive it yet, so a hang is reported with the last record, not with its place.
            hang = ("Where it hung is not known: deploykit reads a hung CPU's registers on "
                    "QEMU only (the FVP's Iris debug server is not driven)")
        result = FvpRunResult(
            records=records, exit_code=None if killed else proc.returncode,
            wall_seconds=time.monotonic() - start, console_log=console_path,
            runner_log=log_path, runner=self.binary, supports_exit_code=False,
            timed_out=timed_out, timeout_s=timeout_s, killed=killed, command=tuple(cmd),
            notes=notes, hang=hang)
        return result.check() if check else result

    def _pump_until_exit(self, proc: subprocess.Popen, read: Any, dec: Decoder,
                         deadline: float) -> tuple[bool, bool]:
        """Call `read()` (new console bytes) until the FVP exits. (timed_out, killed)."""
        done_deadline: float | None = None
        while True:
            data = read()
            if data:
                dec.feed(data)
                if dec.done and done_deadline is None:
                    done_deadline = time.monotonic() + self.done_grace_s
            if proc.poll() is not None:
                while data := read():  # what the FVP wrote before exiting
                    dec.feed(data)
                return False, False
            now = time.monotonic()
            if done_deadline is None and now >= deadline:
                kill_group(proc)
                return True, True
            if done_deadline is not None and now >= done_deadline:
                kill_group(proc)  # done arrived, but the simulation did not end
                return False, True
            if not data:
                time.sleep(_POLL_S)

    def _follow_file(self, proc: subprocess.Popen, path: Path, dec: Decoder,
                     deadline: float) -> tuple[bool, bool]:
        handle: list[Any] = []

        def read() -> bytes:
            if not handle:
                if not path.exists():
                    return b""
                handle.append(open(path, "rb"))  # noqa: SIM115 - closed below
            return handle[0].read(_READ_CHUNK)

        try:
            return self._pump_until_exit(proc, read, dec, deadline)
        finally:
            for f in handle:
                f.close()

    def _follow_telnet(self, proc: subprocess.Popen, log_path: Path, console: Any,
                       dec: Decoder, deadline: float) -> tuple[bool, bool]:
        connect_by = min(deadline, time.monotonic() + self.connect_timeout_s)
        sock = None
        while sock is None:
            match = _PORT_RE.search(log_path.read_bytes())
            if match:
                with contextlib.suppress(OSError):
                    sock = socket.create_connection(("127.0.0.1", int(match.group(1))), 2.0)
            if sock is None:
                if proc.poll() is not None:
                    return False, False
                if time.monotonic() >= connect_by:
                    kill_group(proc)
                    return True, True
                time.sleep(_POLL_S)
        sock.setblocking(False)
        closed = [False]

        def read() -> bytes:
            if closed[0]:
                return b""
            ready, _, _ = select.select([sock], [], [], 0)
            if not ready:
                return b""
            try:
                data = sock.recv(_READ_CHUNK)
            except OSError:
                data = b""
            if not data:
                closed[0] = True
            console.write(data)
            return data

        try:
            return self._pump_until_exit(proc, read, dec, deadline)
        finally:
            sock.close()


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)




