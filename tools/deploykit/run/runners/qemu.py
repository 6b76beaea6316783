"""Run firmware in qemu-system-arm and decode its console (docs/protocol.md).

The console UART is a TCP server in QEMU (`wait=on` holds the guest until we connect), read
through pyserial's `socket://` handler. The handle is opened with `timeout=0`, so each
`read()` does exactly one `recv()`; waiting happens in `select()`. pyserial loses the bytes
of a read that is pending when the peer closes (measured with QEMU 7.2: a pending
`read(4096)` raises and drops what it had), which a one-`recv()` read cannot do. The
disconnect when QEMU exits is the end of the output.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import serial

from deploykit.readers.protocol import Decoder, RunRecords
from deploykit.run.runners.base import DEFAULT_TIMEOUT_S, Runner, RunResult
from deploykit.run.runners.hang import HangLocation, locate_hang, locate_position
from deploykit.run.stream import StreamClosed, StreamLink
from deploykit.util.errors import (
    NO_SPACE_ERRNOS,
    BuildError,
    ConfigError,
    EnvironmentProblem,
    ExitCode,
    RunError,
    disk_full,
)
from deploykit.util.process import free_port, kill_group, run_dir_for

QEMU_BINARY = "qemu-system-arm"
QEMU_APT_PACKAGE = "qemu-system-arm"
DEFAULT_ICOUNT_SHIFT = 5
CONFIG_KEYS = frozenset({"kind", "machine", "cpu", "icount_shift"})
_READ_CHUNK = 1024
_POLL_S = 0.05


def icount_instructions(ticks: int, tick_hz: int, shift: int) -> float:
    """Instructions executed during `ticks` of a `tick_hz` timer under `-icount shift=S`.

    With icount each instruction advances virtual time by 2**S ns, so
    instructions = ticks * 1e9 / (2**S * tick_hz). It is an estimate: the timer resolution is
    2**S * tick_hz / 1e9 instructions per tick (about 1 at shift 5 and 32 MHz).
    """
    if tick_hz <= 0:
        raise ValueError("tick_hz must be positive")
    return ticks * 1e9 / ((1 << shift) * tick_hz)




def _tail(path: Path, limit: int = 1200) -> str:
    try:
        text = path.read_bytes()[-limit:].decode("utf-8", errors="replace")
    except OSError:
        return ""
    return text.strip()


class _QemuGone(Exception):
    """QEMU exited before the console connected."""


class QemuRunner(Runner):
    """Runs an ELF on a QEMU Arm machine given by the board's `runner:` section."""

    kind = "qemu"
    supports_exit_code = True
    supports_icount = True
    is_simulator = True
    supports_stream = True

    def __init__(self, config: Mapping[str, Any], *, qemu: str = QEMU_BINARY,
                 icount_shift: int | None = DEFAULT_ICOUNT_SHIFT, connect_timeout_s: float = 10.0,
                 done_grace_s: float = 5.0) -> None:
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ConfigError(f"runner: unknown key(s) {sorted(unknown)} for kind qemu",
                              f"Allowed keys: {sorted(CONFIG_KEYS)}.")
        if config.get("kind", "qemu") != "qemu":
            raise ConfigError(f"runner kind {config.get('kind')!r} is not qemu")
        machine = config.get("machine")
        if not isinstance(machine, str) or not machine:
            raise ConfigError("runner: `machine` (a QEMU machine, e.g. mps3-an547) is required")
        cpu = config.get("cpu")
        if cpu is not None and (not isinstance(cpu, str) or not cpu):
            raise ConfigError("runner: `cpu` must be a QEMU CPU name, e.g. cortex-m55")
        shift = config.get("icount_shift", icount_shift)
        if shift is not None and (isinstance(shift, bool) or not isinstance(shift, int)
                                  or not 0 <= shift <= 10):
            raise ConfigError(f"runner: icount_shift {shift!r} must be an integer 0..10 or null")
        self.machine: str = machine
        self.cpu: str | None = cpu
        self.icount_shift: int | None = shift
        self.qemu = qemu
        self.connect_timeout_s = connect_timeout_s
        self.done_grace_s = done_grace_s

    def check_environment(self) -> str:
        path = shutil.which(self.qemu)
        if path is None:
            raise EnvironmentProblem(
                f"{self.qemu} not found on PATH; it runs the firmware for this board.",
                f"Install it: sudo apt-get install {QEMU_APT_PACKAGE} (QEMU 7.2 or newer).")
        return path

    def command(self, elf: Path, port: int, qemu: str | None = None,
                qmp_socket: Path | None = None, nodelay: bool = False) -> list[str]:
        """The command line. `nodelay`: the console socket sends each write at once (Nagle
        off), which a serve session needs: the guest writes its answer a byte at a time, and
        Nagle's algorithm against the host's delayed ACK held each answer back ~40 ms."""
        cmd = [qemu or self.qemu, "-machine", self.machine]
        if self.cpu:
            cmd += ["-cpu", self.cpu]
        cmd += ["-nographic", "-monitor", "none", "-semihosting"]
        if qmp_socket is not None:  # where a hung run is (runners/hang.py)
            cmd += ["-qmp", f"unix:{qmp_socket},server=on,wait=off"]
        if self.icount_shift is not None:
            cmd += ["-icount", f"shift={self.icount_shift},align=off,sleep=off"]
        console = f"tcp:127.0.0.1:{port},server=on,wait=on" + (",nodelay=on" if nodelay else "")
        cmd += ["-serial", console, "-kernel", str(elf)]
        return cmd

    # ---- run -------------------------------------------------------------------------------

    def run(self, elf: Path, out_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
            check: bool = True) -> RunResult:
        qemu = self.check_environment()
        elf = Path(elf)
        run_dir = run_dir_for(elf, out_dir)
        console_path, log_path = run_dir / "console.bin", run_dir / "qemu.log"
        console_tmp = _temp_in(run_dir, console_path.name)
        log_tmp = _temp_in(run_dir, log_path.name)
        start = time.monotonic()
        deadline = start + timeout_s
        proc: subprocess.Popen | None = None
        ser = None
        dec = Decoder()
        timed_out = killed = False
        cmd: list[str] = []
        notes: list[str] = []
        hang: HangLocation | None = None
        # A short path of its own: a unix socket path is limited to 107 bytes.
        qmp_dir = Path(tempfile.mkdtemp(prefix="dk-qmp-"))
        qmp_socket = qmp_dir / "qmp"
        try:
            with open(console_tmp, "wb") as console, open(log_tmp, "wb") as log:
                proc, ser, cmd = self._launch(elf, qemu, log, log_tmp, log_path,
                                              min(deadline, start + self.connect_timeout_s),
                                              notes, qmp_socket)
                timed_out, killed = self._pump(proc, ser, dec, console, deadline)
                if timed_out:
                    hang, why_not = locate_hang(str(qmp_socket), elf)
                    if why_not:
                        notes.append(why_not)
                    kill_group(proc)
                    killed = True
                with contextlib.suppress(Exception):
                    ser.close()
                ser = None
                if proc.poll() is None:
                    try:
                        proc.wait(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                    except subprocess.TimeoutExpired:
                        kill_group(proc)
                        killed = True
                        notes.append("QEMU closed the console but did not exit; killed")
                wall = time.monotonic() - start
        except OSError as exc:
            if exc.errno in NO_SPACE_ERRNOS:  # the console or the log, in the run directory
                raise disk_full(run_dir, exc) from exc
            raise
        finally:
            if ser is not None:
                with contextlib.suppress(Exception):
                    ser.close()
            if proc is not None and proc.poll() is None:
                kill_group(proc)
                killed = True
            for tmp, final in ((console_tmp, console_path), (log_tmp, log_path)):
                with contextlib.suppress(OSError):
                    os.replace(tmp, final)
            shutil.rmtree(qmp_dir, ignore_errors=True)
        dec.finish()
        records = RunRecords.build(dec.records, dec.stats)
        where = hang.describe() if hang else None
        if where and records.trace_clock is not None:  # profiling firmware: which operator
            position, why_not = locate_position(elf, records.trace_events)
            where = f"{where}, {position}" if position else where
            if why_not:
                notes.append(why_not)
        estimate = None
        t = records.timing
        if self.icount_shift is not None and t is not None and t.tick_hz > 0:
            estimate = icount_instructions(t.ticks, t.tick_hz, self.icount_shift)
        result = RunResult(
            records=records, exit_code=None if killed else proc.returncode, wall_seconds=wall,
            console_log=console_path, runner_log=log_path, runner="QEMU",
            supports_exit_code=self.supports_exit_code, timed_out=timed_out, timeout_s=timeout_s,
            killed=killed, icount_shift=self.icount_shift, instructions_estimate=estimate,
            command=tuple(cmd), notes=notes, hang=where)
        return result.check() if check else result

    def _launch(self, elf: Path, qemu: str, log: BinaryIO, log_tmp: Path, log_path: Path,
                deadline: float, notes: list[str], qmp_socket: Path | None = None,
                nodelay: bool = False) -> tuple[subprocess.Popen, Any, list[str]]:
        """Start QEMU on a free console port (another one when the port was taken meanwhile)
        and connect to its console: (process, console handle, command line)."""
        for _attempt in range(3):
            cmd = self.command(elf, free_port(), qemu, qmp_socket, nodelay)
            log.seek(0)
            log.truncate()
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                return proc, self._connect(proc, cmd, deadline), cmd
            except _QemuGone:
                log.flush()
                text = _tail(log_tmp)
                if "Address already in use" in text:
                    notes.append("console port was taken; retried with another port")
                    continue
                self._raise_start_failure(proc.returncode, text, log_path)
            except BaseException:  # interrupted while connecting: leave no QEMU behind
                kill_group(proc)
                raise
        raise EnvironmentProblem("QEMU could not bind a console port (3 attempts).",
                                 log_path=str(log_path))

    def open_stream(self, elf: Path, out_dir: Path) -> QemuStreamLink:
        """Start serve firmware and hand its console to a serve session (run/stream.py):
        the console socket is two-way, the guest reads what the host writes on its UART. Logs
        under `out_dir/run/` as for a run (console.bin, qemu.log)."""
        qemu = self.check_environment()
        elf = Path(elf)
        run_dir = run_dir_for(elf, out_dir)
        console_path, log_path = run_dir / "console.bin", run_dir / "qemu.log"
        console_tmp, log_tmp = _temp_in(run_dir, console_path.name), _temp_in(run_dir,
                                                                              log_path.name)
        console, log = open(console_tmp, "wb"), open(log_tmp, "wb")  # noqa: SIM115 - the link's
        try:
            proc, ser, _cmd = self._launch(elf, qemu, log, log_tmp, log_path,
                                           time.monotonic() + self.connect_timeout_s, [],
                                           nodelay=True)
        except BaseException:
            console.close()
            log.close()
            for tmp, final in ((console_tmp, console_path), (log_tmp, log_path)):
                with contextlib.suppress(OSError):
                    os.replace(tmp, final)
            raise
        return QemuStreamLink(proc, ser, console, log,
                              ((console_tmp, console_path), (log_tmp, log_path)))

    def _connect(self, proc: subprocess.Popen, cmd: list[str], deadline: float):
        url = cmd[cmd.index("-serial") + 1].replace("tcp:", "socket://", 1).split(",")[0]
        while True:
            if proc.poll() is not None:
                raise _QemuGone()
            try:
                return serial.serial_for_url(url, timeout=0)
            except (serial.SerialException, OSError):
                pass
            if time.monotonic() >= deadline:
                kill_group(proc)
                raise RunError(f"QEMU did not open its console socket ({url}) in time.",
                               "The machine may be overloaded; retry with a longer timeout.",
                               exit_code=ExitCode.TIMEOUT)
            time.sleep(0.02)

    def _pump(self, proc: subprocess.Popen, ser: Any, dec: Decoder, console: BinaryIO,
              deadline: float) -> tuple[bool, bool]:
        """Read until QEMU closes the console. Returns (timed_out, killed)."""
        fd = ser.fileno()
        done_deadline: float | None = None
        exited_at: float | None = None
        while True:
            now = time.monotonic()
            if done_deadline is None and now >= deadline:
                return True, False  # the caller asks QEMU where the CPU is, then kills it
            if done_deadline is not None and now >= done_deadline:
                kill_group(proc)  # done arrived, but the firmware did not exit
                return False, True
            if exited_at is not None and now - exited_at > 2.0:
                return False, False  # exited, yet the socket never reported EOF
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if ready:
                try:
                    data = ser.read(_READ_CHUNK)
                except serial.SerialException:
                    return False, False  # disconnected: QEMU exited, end of output
                if data:
                    console.write(data)
                    dec.feed(data)
                    if dec.done and done_deadline is None:
                        done_deadline = time.monotonic() + self.done_grace_s
            elif exited_at is None and proc.poll() is not None:
                exited_at = now

    def _raise_start_failure(self, code: int | None, log_text: str, log_path: Path) -> None:
        lines = [ln for ln in log_text.splitlines()
                 if ln.strip() and not ln.startswith("$ ") and "waiting for connection" not in ln]
        msg = " / ".join(lines[-3:]) or "(no output)"
        if "could not load kernel" in log_text.lower():
            raise BuildError(f"QEMU could not load the ELF: {msg}",
                             "Check that the ELF was linked for this board.",
                             log_path=str(log_path))
        target = f"-machine {self.machine}" + (f" -cpu {self.cpu}" if self.cpu else "")
        raise EnvironmentProblem(
            f"QEMU ({target}) exited with code {code} before the firmware started: {msg}",
            "Check the board's runner.machine / runner.cpu against "
            "`qemu-system-arm -machine help` and `-cpu help`.", log_path=str(log_path))


class QemuStreamLink(StreamLink):
    """QEMU's console socket as a serve session's link (QemuRunner.open_stream). Reads are
    one recv() after select(), as in a run; what arrives is also written to console.bin."""

    description = "QEMU"

    def __init__(self, proc: subprocess.Popen, ser: Any, console: BinaryIO, log: BinaryIO,
                 renames: tuple[tuple[Path, Path], ...]) -> None:
        self.proc, self.ser, self.console, self.log = proc, ser, console, log
        self.renames = renames
        self.console_log = renames[0][1]
        self._open = True
        # The host's side too: a `run` sent again right after the sample is not held back.
        sock = getattr(ser, "_socket", None)
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def write(self, data: bytes) -> None:
        try:
            self.ser.write(data)
        except (serial.SerialException, OSError) as exc:
            raise StreamClosed(str(exc)) from exc

    def read(self, timeout_s: float) -> bytes:
        if not self._open:
            raise StreamClosed("QEMU closed its console")
        ready, _, _ = select.select([self.ser.fileno()], [], [], timeout_s)
        if not ready:
            if self.proc.poll() is not None:
                raise StreamClosed(f"QEMU exited with code {self.proc.returncode}")
            return b""
        try:
            data = self.ser.read(_READ_CHUNK)
        except serial.SerialException as exc:  # disconnected: QEMU exited
            self._open = False
            raise StreamClosed(str(exc)) from exc
        self.console.write(data)
        return data

    def close(self, grace_s: float = 5.0) -> int | None:
        killed = False
        with contextlib.suppress(Exception):
            self.ser.close()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            killed = True
        if self.proc.poll() is None:
            kill_group(self.proc)
            killed = True
        for f in (self.console, self.log):
            f.close()
        for tmp, final in self.renames:
            with contextlib.suppress(OSError):
                os.replace(tmp, final)
        return None if killed else self.proc.returncode


def _temp_in(directory: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


