"""Boards whose console is a real serial port: read the results, run a board.

- Port discovery (by the board file's USB identity) is `deploykit.run.transport`, shared with the
  flashers.
- `SerialLink`: the host side of the serial link (docs/pico2.md; firmware/boards/rp2350/
  dk_link.h). USB CDC loses what the device writes while the host does not have the port open,
  so the device keeps every result byte and sends nothing unasked. The host opens the port,
  sends REQUEST + nonce (again every `request_interval_s` until answered), discards everything
  before the SYNC that echoes one of its nonces, feeds the rest to the protocol Decoder, and
  sends ACK after `done`. A later SYNC (the device repeating itself, or answering a repeated
  request) restarts the decoder, so duplicated or stale bytes never reach it. If the port
  disappears (the board rebooted after a fault, or was unplugged and plugged in again), it is
  found again and asked again.
- `PicoRunner` (runner kind `pico`): flash (tools/deploykit/flashers), then read the results.
- `SerialStreamLink`: the port as a serve session's link (run/stream.py): the same handshake
  (REQUEST until the SYNC that echoes the nonce, nothing before it kept), then the host's frames
  and the device's records both ways on the port (docs/pico2.md, "Serve firmware on the link").
"""

from __future__ import annotations

import contextlib
import os
import select as io_select
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import serial

from deploykit.families import family_of
from deploykit.readers.protocol import Decoder, RunRecords
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.run.flashers import FlashError, FlashImage, HostEnv, flash, select
from deploykit.run.runners.base import (
    DEFAULT_TIMEOUT_S,
    Runner,
    RunnerOption,
    RunResult,
    runner_section,
)
from deploykit.run.runners.hang import locate_position
from deploykit.run.stream import StreamClosed, StreamLink
from deploykit.run.transport import default_list_ports, locate_port, running_boards
from deploykit.util.errors import ConfigError, ExitCode, RunError

MARK = b"\x16DK"
REQUEST = MARK + b"R"
ACK = MARK + b"A"
SYNC = MARK + b"S"
FRAME = 8  # marker (4) + nonce (4)
NETWORK_ACK_LINGER_S = 0.2  # after the ACK, before closing a pyserial URL port (below)
_READ_CHUNK = 4096


def _quiet(_message: str) -> None:
    pass


# ---- the host side of the serial link -------------------------------------------------------

@dataclass
class LinkStats:
    requests_sent: int = 0
    rerequests: int = 0  # REQUESTs sent again because a transfer arrived damaged
    syncs: int = 0  # SYNC markers that restarted the decoder
    reopens: int = 0  # the port went away and was opened again
    acked: bool = False
    bytes_received: int = 0
    bytes_discarded: int = 0  # before the first SYNC (stale bytes of an earlier session)
    port: str | None = None
    seconds_to_open: float | None = None
    seconds_to_sync: float | None = None


@dataclass
class LinkResult:
    records: RunRecords
    stats: LinkStats
    timed_out: bool
    wall_seconds: float
    notes: list[str] = field(default_factory=list)


def _find_sync(window: bytes, nonces: set[bytes]) -> tuple[int, bytes] | None:
    """The last SYNC in `window` that echoes one of `nonces`: (position, nonce)."""
    pos = window.rfind(SYNC)
    while pos != -1:
        nonce = window[pos + 4:pos + FRAME]
        if len(nonce) == 4 and nonce in nonces:
            return pos, nonce
        pos = window.rfind(SYNC, 0, pos)
    return None


class SerialLink:
    """Reads one run's records from a serial port that speaks the link (module docstring).

    `locate()` returns the port's device (or pyserial URL), or None while it is absent; it is
    called again whenever the port has to be (re)opened.
    """

    def __init__(self, locate: Callable[[], str | None], *, baud: int = 115200,
                 request_interval_s: float = 0.5, nonce: Callable[[], bytes] | None = None,
                 log: Callable[[str], None] = _quiet, max_rerequests: int = 3) -> None:
        self.locate = locate
        self.baud = baud
        self.request_interval_s = request_interval_s
        self._nonce = nonce or (lambda: os.urandom(4))
        self.log = log
        self.max_rerequests = max_rerequests

    def _open(self, deadline: float) -> Any | None:
        while time.monotonic() < deadline:
            where = self.locate()
            if where:
                try:
                    return serial.serial_for_url(where, baudrate=self.baud, timeout=0.05)
                except (serial.SerialException, OSError, ValueError) as exc:
                    self.log(f"open {where}: {exc}")
            time.sleep(0.1)
        return None

    def read(self, timeout_s: float, console: BinaryIO | None = None) -> LinkResult:
        start = time.monotonic()
        deadline = start + timeout_s
        stats = LinkStats()
        dec = Decoder()
        nonces: set[bytes] = set()
        current: bytes | None = None
        synced = False
        tail = b""
        notes: list[str] = []
        ser = self._open(deadline)
        if ser is None:
            dec.finish()
            return LinkResult(RunRecords.build(dec.records, dec.stats), stats, True,
                              time.monotonic() - start,
                              ["the serial port did not appear"])
        stats.port = ser.port
        stats.seconds_to_open = time.monotonic() - start
        next_request = 0.0
        timed_out = False
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if not synced and now >= next_request:
                    n = self._nonce()
                    nonces.add(n)
                    try:
                        ser.write(REQUEST + n)
                        ser.flush()
                    except (serial.SerialException, OSError):
                        pass  # handled by the read below
                    stats.requests_sent += 1
                    next_request = now + self.request_interval_s
                try:
                    data = ser.read(_READ_CHUNK)
                except (serial.SerialException, OSError, TypeError) as exc:
                    # The port went away: a fault reboot, or unplugged. Find it again.
                    self.log(f"port lost: {exc}")
                    with contextlib.suppress(Exception):
                        ser.close()
                    stats.reopens += 1
                    notes.append(f"the port went away after {now - start:.1f} s and was "
                                 "opened again")
                    ser = self._open(deadline)
                    if ser is None:
                        timed_out = True
                        break
                    synced, tail, next_request = False, b"", 0.0
                    continue
                if not data:
                    continue
                stats.bytes_received += len(data)
                if console is not None:
                    console.write(data)
                window = tail + data
                found = _find_sync(window, nonces)
                if found is not None:
                    pos, current = found
                    if stats.seconds_to_sync is None:
                        stats.seconds_to_sync = time.monotonic() - start
                    if synced:
                        notes.append("the device sent its results again; the decoder restarted")
                    else:
                        stats.bytes_discarded += max(0, pos - len(tail))
                    dec = Decoder()
                    synced = True
                    stats.syncs += 1
                    dec.feed(window[pos + FRAME:])
                elif synced:
                    dec.feed(data)
                else:
                    stats.bytes_discarded += len(data)
                tail = window[-(FRAME - 1):]
                if synced and dec.done:
                    if dec.stats.problems() and stats.rerequests < self.max_rerequests:
                        # Bytes were lost or damaged on the way: ask for everything again
                        # (the next SYNC restarts the decoder) instead of acknowledging.
                        stats.rerequests += 1
                        notes.append("damaged transfer (" + "; ".join(dec.stats.problems())
                                     + "); asked again")
                        n = self._nonce()
                        nonces.add(n)
                        with contextlib.suppress(serial.SerialException, OSError):
                            ser.write(REQUEST + n)
                            ser.flush()
                        stats.requests_sent += 1
                        # Discard everything until the answer's SYNC.
                        synced = False
                        next_request = time.monotonic() + self.request_interval_s
                        continue
                    with contextlib.suppress(serial.SerialException, OSError):
                        ser.write(ACK + (current or b"\0\0\0\0"))
                        ser.flush()
                    if "://" in str(ser.port):
                        # A network port (a farm's ser2net) may drop what it has not yet
                        # passed to the device when the connection closes at once: on the
                        # loopback farm 1 ACK in about 12 was lost so. Let it get there.
                        time.sleep(NETWORK_ACK_LINGER_S)
                    stats.acked = True
                    break
        finally:
            with contextlib.suppress(Exception):
                ser.close()
        dec.finish()
        return LinkResult(RunRecords.build(dec.records, dec.stats), stats, timed_out,
                          time.monotonic() - start, notes)


# ---- the port as a serve session's link ------------------------------------------------------

class SerialStreamLink(StreamLink):
    """A board's port as a serve session's link (run/stream.py). `connect()` opens it and does
    the link's handshake: REQUEST + nonce until the SYNC that echoes one, everything before it
    discarded; what follows (the transcript: hello, ready; then the answers, live) is the
    session's. close() acknowledges, so the device repeats nothing."""

    def __init__(self, locate: Callable[[], str | None], *, baud: int = 115200,
                 request_interval_s: float = 0.5, nonce: Callable[[], bytes] | None = None,
                 console: BinaryIO | None = None, description: str = "the board",
                 console_log: Path | None = None) -> None:
        self.locate = locate
        self.baud = baud
        self.request_interval_s = request_interval_s
        self._nonce = nonce or (lambda: os.urandom(4))
        self.console = console
        self.description = description
        self.console_log = console_log
        self.ser: Any = None
        self.nonce = b"\0\0\0\0"
        self._pending = b""

    def connect(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.ser is None:
            where = self.locate()
            if where:
                with contextlib.suppress(serial.SerialException, OSError, ValueError):
                    self.ser = serial.serial_for_url(where, baudrate=self.baud, timeout=0)
            if self.ser is None:
                if time.monotonic() >= deadline:
                    raise StreamClosed(f"no serial port for {self.description} appeared")
                time.sleep(0.1)
        nonces: set[bytes] = set()
        window, next_request = b"", 0.0
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise StreamClosed(f"{self.description} did not answer the link's REQUEST")
            if now >= next_request:
                n = self._nonce()
                nonces.add(n)
                self._write(REQUEST + n)
                next_request = now + self.request_interval_s
            window += self._read_raw(min(deadline, next_request) - now)
            found = _find_sync(window, nonces)
            if found is not None:
                pos, self.nonce = found
                self._pending = window[pos + FRAME:]
                return
            window = window[-(FRAME - 1):]

    def _write(self, data: bytes) -> None:
        try:
            self.ser.write(data)
            self.ser.flush()
        except (serial.SerialException, OSError) as exc:
            raise StreamClosed(f"the port of {self.description} went away: {exc}") from exc

    def _read_raw(self, timeout_s: float) -> bytes:
        try:
            ready, _, _ = io_select.select([self.ser.fileno()], [], [], max(0.0, timeout_s))
            data = self.ser.read(max(1, self.ser.in_waiting)) if ready else b""
        except (serial.SerialException, OSError, TypeError) as exc:
            raise StreamClosed(f"the port of {self.description} went away: {exc}") from exc
        if ready and not data:  # readable, yet nothing: the other end is gone
            raise StreamClosed(f"the port of {self.description} closed")
        if self.console is not None:
            self.console.write(data)
        return data

    def write(self, data: bytes) -> None:
        self._write(data)

    def read(self, timeout_s: float) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        return self._read_raw(timeout_s)

    def close(self, grace_s: float = 5.0) -> int | None:
        if self.ser is not None:
            with contextlib.suppress(StreamClosed):
                self._write(ACK + self.nonce)
            if "://" in str(self.ser.port):
                time.sleep(NETWORK_ACK_LINGER_S)  # as SerialLink: let the ACK reach the board
            with contextlib.suppress(Exception):
                self.ser.close()
            self.ser = None
        if self.console is not None:
            self.console.close()
            self.console = None
        return None  # a board has no exit code; done.status is the verdict


# ---- runner: flash, then read ---------------------------------------------------------------

CONFIG_KEYS = frozenset({"kind"})


class PicoRunner(Runner):
    """A Raspberry Pi Pico 2 (or any board with `usb`, `serial` and `flashers` sections):
    flash the UF2/ELF, then read the results from its USB CDC port."""

    kind = "pico"
    supports_exit_code = False  # a board has no exit code; `done.status` is the verdict
    supports_icount = False
    is_simulator = False
    supports_stream = True
    options = (
        RunnerOption("--port", "port", "PORT|MOUNT|SERIAL",
                     "which board: its serial port (e.g. /dev/ttyACM0), its BOOTSEL drive's "
                     "mount point, or its USB serial number; needed when several are "
                     "connected"),
        RunnerOption("--probe", "probe", "SERIAL",
                     "flash over SWD through the debug probe with this serial number"),
        RunnerOption("--place", "place", "NAME|TAG=VALUE",
                     "run on a labgrid board farm: this place, or any free place with these "
                     "tags (board=pico2); needs deploykit[farm] and a coordinator "
                     "(docs/farm.md)"),
        RunnerOption("--coordinator", "coordinator", "HOST[:PORT]",
                     "the labgrid coordinator for --place (default $LG_COORDINATOR)"),
        RunnerOption("--place-timeout", "place_timeout", "SECONDS",
                     "how long --place waits for a free place (default 300)"),
    )

    @classmethod
    def check_options(cls, board_name: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Also: a farm's place excludes a local port or probe (checked before the build)."""
        opts = super().check_options(board_name, given)
        if opts.get("place") and (opts.get("port") or opts.get("probe")):
            raise ConfigError("--place chooses the board on a labgrid farm; --port and --probe "
                              "choose one on this machine.", "Give one or the other.")
        if opts.get("place"):  # before the build: a farm run needs labgrid
            from deploykit.run.farm.session import require_labgrid

            require_labgrid()
        for option in ("coordinator", "place_timeout"):
            if opts.get(option) is not None and not opts.get("place"):
                flag = "--" + option.replace("_", "-")
                raise ConfigError(f"{flag} is for --place.", "Add --place NAME|TAG=VALUE.")
        try:
            float(opts.get("place_timeout", 0.0))
        except ValueError:
            raise ConfigError(f"--place-timeout {opts['place_timeout']!r} is not a number of "
                              "seconds.", "E.g. --place-timeout 600.") from None
        return opts

    @classmethod
    def from_board(cls, board: Any, *, progress: Any = None, workspace: Path | None = None,
                   **kwargs: Any) -> PicoRunner:
        """The whole board (usb, serial, flashers sections), and the workspace to build
        picotool from when it is missing."""
        from deploykit.readers.sources import load_workspace
        from deploykit.util.errors import DeployKitError

        ws = None
        with contextlib.suppress(DeployKitError):
            ws = load_workspace(workspace)
        return cls(runner_section(board), board=board, workspace=ws,
                   **({"progress": progress} if progress else {}), **kwargs)

    def __init__(self, config: Mapping[str, Any], *, board: Any = None, port: str | None = None,
                 probe: str | None = None, env: Any = None, workspace: Any = None,
                 progress: Callable[[str], None] = _quiet, flash: bool = True,
                 place: str | None = None, coordinator: str | None = None,
                 place_timeout: str | float | None = None) -> None:
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ConfigError(f"runner: unknown key(s) {sorted(unknown)} for kind pico",
                              f"Allowed keys: {sorted(CONFIG_KEYS)}.")
        if board is None:
            raise ConfigError("the pico runner needs the board (usb, serial, flashers)")
        self.check_options(getattr(board, "name", "the board"),
                           {"port": port, "probe": probe, "place": place,
                            "coordinator": coordinator, "place_timeout": place_timeout})
        self.place_timeout = float(place_timeout) if place_timeout is not None else 300.0
        self.place = place
        self.coordinator = coordinator
        self.board = board
        self.port = port
        self.probe = probe
        self.env = env
        if workspace is None:  # where picotool is built when it is not installed
            from deploykit.readers.sources import load_workspace
            from deploykit.util.errors import DeployKitError

            with contextlib.suppress(DeployKitError):
                workspace = load_workspace()
        self.workspace = workspace
        self.progress = progress
        self.do_flash = flash
        raw = getattr(board, "raw", None) or {}
        self.serial_cfg = raw.get("serial", {})

    def check_environment(self) -> str:
        """Raise EnvironmentProblem when no board is connected in any form (running, in
        BOOTSEL mode, as a drive, or behind a probe); else say what was found."""
        from deploykit.util.errors import EnvironmentProblem

        if self.place:  # the farm has the board: check that it knows such a place
            from deploykit.run.farm.session import FarmSession, PlaceQuery

            with FarmSession(self.coordinator) as session:
                found = session.find(PlaceQuery.parse(self.place))
            return f"{self.board.name} on {', '.join(p.name for p in found)} ({session.address})"
        env = self.env or HostEnv()
        running = running_boards(self.board, env.ports())
        if running:
            return f"{self.board.name} running on {running[0].device}"
        try:
            _flasher, target = select(self.board, port=self.port, probe=self.probe, env=env,
                                      workspace=self.workspace, allow_reboot=False)
        except FlashError as exc:
            raise EnvironmentProblem(f"No {self.board.name} is connected: {exc.cause}",
                                     exc.hint) from exc
        return target.description

    def run(self, elf: Path, out_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
            check: bool = True) -> RunResult:
        elf = Path(elf)
        env = self.env or HostEnv()
        run_dir = Path(out_dir) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        serial_number = None
        uf2 = elf.with_suffix(".uf2")
        if self.do_flash and not uf2.exists():
            from deploykit.readers.uf2 import write_uf2

            write_uf2(elf, uf2, family=family_of(self.board).uf2_family(self.board))
        if self.place:  # a board on a labgrid farm (docs/farm.md)
            from deploykit.run.farm.run import on_place

            with on_place(self.board, FlashImage(elf, uf2), place=self.place,
                          coordinator=self.coordinator, place_timeout_s=self.place_timeout,
                          progress=self.progress) as placed:
                result = read_board(self.board, run_dir, timeout_s=timeout_s,
                                    port=placed.serial_url, check=False, notes=placed.notes,
                                    progress=self.progress, elf=elf)
                placed.outcome = result.outcome().exit_code.name.lower()
            return result.check() if check else result
        if self.do_flash:
            result = flash(self.board, FlashImage(elf, uf2), port=self.port, probe=self.probe,
                           env=env, progress=self.progress, workspace=self.workspace)
            notes.append(result.summary())
            serial_number = result.target.serial_number
        port = self.port if self.port and not Path(self.port).is_dir() else None
        if port and not os.path.exists(port) and "://" not in port:
            serial_number, port = serial_number or port, None  # a USB serial number
        return read_board(self.board, run_dir, timeout_s=timeout_s, port=port,
                          serial_number=serial_number, env=env, check=check, notes=notes,
                          progress=self.progress, elf=elf)


    def open_stream(self, elf: Path, out_dir: Path) -> SerialStreamLink:
        """Flash serve firmware and hand its port, after the link's handshake, to a serve
        session (run/stream.py); the bytes received go to `out_dir/run/console.bin`."""
        if self.place:
            raise ConfigError("Streaming samples to a board on a labgrid farm (--place) is not "
                              "supported.", "Stream to a board on this machine (--port).")
        elf = Path(elf)
        env = self.env or HostEnv()
        run_dir = Path(out_dir) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        uf2 = elf.with_suffix(".uf2")
        serial_number = None
        if self.do_flash:
            from deploykit.readers.uf2 import write_uf2

            write_uf2(elf, uf2, family=family_of(self.board).uf2_family(self.board))
            result = flash(self.board, FlashImage(elf, uf2), port=self.port, probe=self.probe,
                           env=env, progress=self.progress, workspace=self.workspace)
            serial_number = result.target.serial_number
        port = self.port if self.port and not Path(self.port).is_dir() else None
        if port and not os.path.exists(port) and "://" not in port:
            serial_number, port = serial_number or port, None  # a USB serial number

        def locate() -> str | None:
            return locate_port(self.board, env.ports(), port, serial_number)

        console_path = run_dir / "console.bin"
        link = SerialStreamLink(locate, baud=int(self.serial_cfg.get("baud", 115200)),
                                request_interval_s=float(self.serial_cfg.get(
                                    "request_interval_s", 0.5)),
                                console=open(console_path, "wb"),  # noqa: SIM115 - the link's
                                description=self.board.name, console_log=console_path)
        try:
            link.connect(float(self.serial_cfg.get("connect_timeout_s", 20.0)) + 10.0)
        except StreamClosed as exc:
            link.close()
            raise RunError(f"{exc}.", "Check the USB cable and that the serve firmware was "
                           "flashed.", exit_code=ExitCode.NO_BOOT) from exc
        return link


def read_board(board: Any, run_dir: Path, *, timeout_s: float, port: str | None = None,
               serial_number: str | None = None, env: Any = None, check: bool = False,
               notes: list[str] | None = None,
               progress: Callable[[str], None] = _quiet, elf: Path | None = None) -> RunResult:
    """Find the board's port and read one run's results (`deploykit monitor`, PicoRunner).
    `elf`: the image that ran; a hang of profiling firmware is then placed in its program."""
    raw = getattr(board, "raw", None) or {}
    cfg = raw.get("serial", {})
    list_ports = (env.ports if env is not None else default_list_ports)

    def locate() -> str | None:  # an ambiguity (ConfigError) ends the read at once
        return locate_port(board, list_ports(), port, serial_number)

    connect_s = float(cfg.get("connect_timeout_s", 20.0))
    run_dir.mkdir(parents=True, exist_ok=True)
    console_path, log_path = run_dir / "console.bin", run_dir / "link.log"
    link_log: list[str] = []
    link = SerialLink(locate, baud=int(cfg.get("baud", 115200)),
                      request_interval_s=float(cfg.get("request_interval_s", 0.5)),
                      log=link_log.append)
    progress(f"waiting up to {connect_s:g} s for {board.name}'s serial port, then up to "
             f"{timeout_s:g} s for its results")
    with open(console_path, "wb") as console:
        res = link.read(connect_s + timeout_s, console)
    s = res.stats
    lines = [f"port {s.port}", f"requests sent {s.requests_sent}", f"syncs {s.syncs}",
             f"reopens {s.reopens}", f"acked {s.acked}", f"bytes {s.bytes_received} "
             f"(discarded before sync {s.bytes_discarded})", *res.notes, *link_log]
    log_path.write_text("\n".join(lines) + "\n")
    if s.port is None:
        raise RunError(
            f"No serial port for {board.name} appeared in {connect_s + timeout_s:g} s"
            + (f" (USB serial number {serial_number})" if serial_number else "") + ".",
            "Check the USB cable (a data cable, not charge-only) and that the firmware was "
            "flashed; list ports with `python -m serial.tools.list_ports -v`.",
            exit_code=ExitCode.NO_BOOT, log_path=str(log_path))
    notes = [*(notes or []), *res.notes]
    result = RunResult(
        records=res.records, exit_code=None, wall_seconds=res.wall_seconds,
        console_log=console_path, runner_log=log_path, runner=f"{board.name} on {s.port}",
        supports_exit_code=False, timed_out=res.timed_out, timeout_s=connect_s + timeout_s,
        notes=notes, hang=_hang_position(elf, res, notes))
    return result.check() if check else result


def _hang_position(elf: Path | None, res: LinkResult, notes: list[str]) -> str | None:
    """Where a hung run of profiling firmware was in its program (runners/hang.py), from the
    operator events it sent before the host's limit or the board's watchdog ended it."""
    rec = res.records
    watchdog = any(e.code == BY_NAME["WATCHDOG"].code for e in rec.errors)
    if elf is None or rec.trace_clock is None or not (res.timed_out or watchdog):
        return None
    position, why_not = locate_position(elf, rec.trace_events)
    if why_not:
        notes.append(why_not)
    return f"Hung {position}" if position else None


@dataclass
class MonitorReport:
    """`deploykit monitor`: one run's decoded results, as the board sent them."""

    board: str
    port: str | None
    exit_code: ExitCode
    cause: str
    records: RunRecords
    console_log: Path
    link_log: Path | None

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    @classmethod
    def from_result(cls, board: str, result: RunResult) -> MonitorReport:
        o = result.outcome()
        port = result.runner.rsplit(" on ", 1)[-1] if " on " in result.runner else None
        return cls(board, port, o.exit_code, o.cause, result.records, result.console_log,
                   result.runner_log)

    def summary(self) -> str:
        rec = self.records
        lines = [f"{self.board} on {self.port}: {'OK' if self.ok else 'FAIL'}: {self.cause}"]
        if rec.hello is not None:
            lines.append("  hello: " + ", ".join(f"{k}={v}" for k, v in rec.hello.fields.items()))
        for i, t in sorted(rec.tensors.items()):
            values = ", ".join(f"{v:.5g}" for v in t.data.ravel()[:10].tolist())
            more = ", ..." if t.data.size > 10 else ""
            lines.append(f"  output {i}: {t.dtype_name} {list(t.sizes)} [{values}{more}]")
        if rec.timing is not None:
            t = rec.timing
            lines.append(f"  execute: {t.ticks:,} ticks at {t.tick_hz:,} Hz = "
                         f"{t.ticks / t.tick_hz * 1e3:.3f} ms ({t.iterations} iteration(s))")
        if rec.memory is not None:
            for name, (used, cap) in rec.memory.entries.items():
                lines.append(f"  {name:<14} peak {used:>9,} B of {cap:>9,} B")
        if rec.fault is not None:
            lines.append(f"  fault: {rec.fault.describe()}")
        for e in rec.errors:
            lines.append(f"  error {e.code}: {e.message}")
        lines.append(f"  console bytes: {self.console_log}")
        return "\n".join(lines)


__all__ = ["ACK", "REQUEST", "SYNC", "LinkResult", "LinkStats", "MonitorReport", "PicoRunner",
           "SerialLink", "SerialStreamLink", "read_board"]
