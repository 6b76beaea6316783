"""What every flasher shares: the Flasher interface, its capabilities, the host it looks at.

A flasher is a small class (Zephyr's runners are the model) that declares what it can do as
class attributes, finds the boards it could program right now (`discover`), and programs one
(`flash`). Everything it reads from the host goes through `HostEnv`, so tests hand it real
stand-ins: a directory laid out like sysfs or like a mounted BOOTSEL drive, a mounts file, a
PATH holding stand-in tools.
"""

from __future__ import annotations

import abc
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from deploykit.util.errors import DeployKitError, ExitCode

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


class FlashError(DeployKitError):
    """Flashing failed, or no (single) board could be chosen. Exit code FLASH."""

    exit_code = ExitCode.FLASH


@dataclass(frozen=True)
class FlasherCapabilities:
    image: str  # "uf2" or "elf": what it writes
    needs_bootsel: bool  # the board must be in its boot ROM's USB mode
    uses_probe: bool  # a debug probe (SWD); --probe selects one
    runs_after: bool  # the new firmware starts by itself when flashing ends
    verifies: bool  # reads back what it wrote


@dataclass(frozen=True)
class UsbDevice:
    """One USB device as sysfs describes it (/sys/bus/usb/devices/<location>)."""

    vid: int
    pid: int
    serial: str | None
    location: str  # sysfs name, e.g. 1-1.4 (bus 1, port path 1.4)
    bus: int | None = None
    address: int | None = None  # devnum
    product: str | None = None

    def describe(self) -> str:
        where = f"bus {self.bus} address {self.address}" if self.bus is not None \
            else f"USB {self.location}"
        return (f"{self.vid:04x}:{self.pid:04x} serial {self.serial or '?'} ({where}"
                + (f", {self.product}" if self.product else "") + ")")


@dataclass
class HostEnv:
    """The parts of the host the flashers and the port discovery read."""

    usb_sysfs: Path = Path("/sys/bus/usb/devices")
    block_sysfs: Path = Path("/sys/class/block")
    mounts_file: Path = Path("/proc/mounts")
    media_roots: tuple[Path, ...] = (Path("/media"), Path("/run/media"))
    path: str | None = None  # PATH for tools; None: the process's PATH
    list_ports: Callable[[], Sequence[Any]] | None = None  # default: pyserial comports()
    eject_timeout_s: float = 10.0  # how long a UF2 copy waits for the drive to go away
    bootsel_timeout_s: float = 10.0  # how long to wait for BOOTSEL after a 1200-baud touch
    tool_dirs: tuple[Path, ...] = ()  # extra places for tools deploykit built (picotool)

    def which(self, tool: str) -> str | None:
        for d in self.tool_dirs:
            for candidate in (Path(d) / tool, Path(d) / tool / tool, Path(d) / "bin" / tool):
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    return str(candidate)
        return shutil.which(tool, path=self.path)

    def ports(self) -> list[Any]:
        if self.list_ports is not None:
            return list(self.list_ports())
        from serial.tools.list_ports import comports

        return list(comports())

    def run(self, cmd: list[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if self.path is not None:
            env["PATH"] = self.path
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  env=env, check=False)
        except subprocess.TimeoutExpired as exc:
            raise FlashError(f"`{' '.join(cmd)}` did not finish in {timeout_s:g} s.",
                             "Check the board's USB connection and retry.") from exc

    def usb_devices(self) -> list[UsbDevice]:
        return usb_devices(self.usb_sysfs)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def usb_devices(sysfs: Path) -> list[UsbDevice]:
    """USB devices under a sysfs `bus/usb/devices` directory (interfaces are skipped)."""
    out = []
    if not sysfs.is_dir():
        return out
    for d in sorted(sysfs.iterdir()):
        vid, pid = _read(d / "idVendor"), _read(d / "idProduct")
        if not vid or not pid:
            continue
        try:
            bus = int(_read(d / "busnum") or "")
            addr = int(_read(d / "devnum") or "")
        except ValueError:
            bus = addr = None
        out.append(UsbDevice(int(vid, 16), int(pid, 16), _read(d / "serial"), d.name, bus, addr,
                             _read(d / "product")))
    return out


@dataclass(frozen=True)
class FlashTarget:
    """A board one flasher can program now."""

    kind: str  # the flasher kind
    ident: str  # what selects it: a USB serial number, a mount point, a probe serial
    description: str
    serial_number: str | None = None  # the board's USB serial number, when known
    path: Path | None = None  # a drive's mount point
    usb: UsbDevice | None = None


@dataclass(frozen=True)
class FlashImage:
    elf: Path
    uf2: Path

    def for_kind(self, image: str) -> Path:
        return self.uf2 if image == "uf2" else self.elf


@dataclass
class FlashResult:
    flasher: str
    target: FlashTarget
    image: Path
    seconds: float
    command: tuple[str, ...] = ()
    output: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"flashed {self.image} with {self.flasher} to {self.target.description} "
                 f"in {self.seconds:.1f} s"]
        if self.command:
            lines.append("  $ " + " ".join(self.command))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class Flasher(abc.ABC):
    """One way to program a board. Subclasses set `kind` and `capabilities`."""

    kind: ClassVar[str] = ""
    capabilities: ClassVar[FlasherCapabilities]
    tool: ClassVar[str | None] = None  # the program it runs, if any

    def __init__(self, board: Any, config: Mapping[str, Any], env: HostEnv | None = None,
                 progress: Progress = _quiet) -> None:
        self.board = board
        self.config = dict(config)
        self.env = env or HostEnv()
        self.progress = progress
        self.notes: list[str] = []  # what discovery saw, for "nothing found" messages

    @property
    def usb(self) -> Mapping[str, Any]:
        raw = getattr(self.board, "raw", None) or {}
        return raw.get("usb", {})

    def tool_path(self) -> str | None:
        return self.env.which(self.tool) if self.tool else None

    def unavailable_reason(self) -> str | None:
        """Why this flasher cannot run on this host (its tool is missing), or None."""
        if self.tool and self.tool_path() is None:
            return f"{self.tool} is not installed"
        return None

    @abc.abstractmethod
    def discover(self) -> list[FlashTarget]:
        """The boards this flasher could program right now."""

    @abc.abstractmethod
    def flash(self, image: FlashImage, target: FlashTarget) -> FlashResult:
        """Program `image` into `target`; raise FlashError on failure."""

    def _check_run(self, cmd: list[str], timeout_s: float = 300.0) -> str:
        res = self.env.run(cmd, timeout_s)
        text = (res.stdout or "") + (res.stderr or "")
        if res.returncode != 0:
            tail = "\n".join(text.strip().splitlines()[-12:])
            raise FlashError(f"{self.kind}: `{' '.join(cmd)}` failed (exit {res.returncode}):\n"
                             f"{tail}", "Check the connection and that the board is the one "
                             "you meant; the full command is above.")
        return text
