"""A labgrid board farm on loopback, for the farm tests (tests/integration/test_farm.py).

What is real: `labgrid-coordinator` and `labgrid-exporter` (labgrid 26, gRPC on 127.0.0.1),
ser2net started by the exporter for each place's serial port, pyserial's rfc2217 client, the
deploykit code under test, and the device side of the serial link: firmware/boards/rp2350/
dk_link.c and firmware/protocol/dk_protocol.c, the code the Pico 2 runs, compiled for the host.

What stands in for the absent hardware (a `StandInBoard` per place):
- the board's USB CDC port is a pty (raw, like a CDC port); the exporter exports its slave
  side as a serial port, so ser2net serves it as a real NetworkSerialPort;
- the BOOTSEL drive is a temporary directory with the boot ROM's INFO_UF2.TXT, exported as
  the place's NetworkUSBMassStorage with that directory as its path;
- the boot ROM is a thread: when a complete UF2 lands on the drive, it checks the UF2 framing,
  takes the drive away (as the RP2350 does when it reboots into the new image) and starts the
  stand-in firmware on the pty, which sends the result protocol with the outputs it is given
  (`values`) and serves the link until the host acknowledges. The board then runs on, without
  a drive, until its port's line rate is set to 1200 baud (the pico-sdk's reset request, here
  carried by RFC 2217 and ser2net to the pty): then it is back in BOOTSEL mode, drive and all.
  The stand-in does not run the flashed image: it cannot execute Cortex-M33 code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pty
import shutil
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import tty
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from deploykit.readers.boards import repo_root

CC = shutil.which("cc") or shutil.which("gcc")
INFO_UF2 = "UF2 Bootloader v1.0\nModel: Raspberry Pi RP2350\nBoard-ID: RP2350\n"
UF2_MAGIC = (0x0A324655, 0x9E5D5157)

STANDIN_C = r"""
#define _DEFAULT_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dk_board.h"
#include "dk_link.h"
#include "dk_protocol.h"

static int fd;
static size_t port_read(void *buf, size_t len) {
  ssize_t n = read(fd, buf, len);
  return n > 0 ? (size_t)n : 0u;
}
static void port_write(const void *buf, size_t len) {
  const unsigned char *p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) return;
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 50);
      continue;
    }
    p += n;
    len -= (size_t)n;
  }
}
static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
static void idle(void) { usleep(500); }
static const dk_link_port_t port = {port_read, port_write, now_us, idle};
void dk_console_write(const void *data, size_t len) { dk_link_write(data, len); }

static unsigned char transcript[DK_LINK_TRANSCRIPT_BYTES];
static float out[4096];

/* argv: pty master fd, raw float32 outputs file, milliseconds to serve before giving up */
int main(int argc, char **argv) {
  if (argc != 4) return 2;
  fd = atoi(argv[1]);
  FILE *f = fopen(argv[2], "rb");
  if (!f) return 2;
  size_t n = fread(out, sizeof out[0], sizeof out / sizeof out[0], f);
  fclose(f);
  uint64_t end = now_us() + (uint64_t)strtol(argv[3], 0, 10) * 1000u;
  dk_link_init(&port, transcript, sizeof transcript, 0);
  dk_send_hello("protocol=1\nboard=pico2\nfirmware=farm-standin");
  const int32_t sizes[2] = {1, (int32_t)n};
  dk_send_tensor(0, DK_DTYPE_FLOAT32, 2, sizes, 0.0f, 0, out, (uint32_t)(n * 4));
  dk_send_timing(123456, 1000000, 1, DK_INSTRUCTIONS_UNKNOWN);
  dk_send_done(DK_STATUS_OK);
  dk_link_finish();
  while (now_us() < end && !dk_link_get_stats()->acks) {
    dk_link_poll();
    usleep(500);
  }
  printf("requests=%u acks=%u\n", dk_link_get_stats()->requests, dk_link_get_stats()->acks);
  return dk_link_get_stats()->acks ? 0 : 3;
}
"""


def build_standin(directory: Path) -> Path:
    fw = repo_root() / "firmware"
    src, exe = directory / "farm_standin.c", directory / "farm_standin"
    src.write_text(STANDIN_C)
    subprocess.run(
        [
            CC,
            "-std=c11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-DDK_LINK_TRANSCRIPT_BYTES=8192",
            "-DDK_LINK_REPEAT_MS=300",
            f"-I{fw / 'boards' / 'rp2350'}",
            f"-I{fw / 'boards'}",
            f"-I{fw / 'protocol'}",
            str(src),
            str(fw / "boards" / "rp2350" / "dk_link.c"),
            str(fw / "protocol" / "dk_protocol.c"),
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return exe


def complete_uf2(path: Path) -> bytes | None:
    """The file's bytes once its last block is the last of its run of blocks (a copy in
    progress ends elsewhere), else None. The RP2350 image starts with a two-block run of its
    own (the RP2350-E10 absolute block), so the first block's count does not say it."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 512 or len(data) % 512:
        return None
    if struct.unpack_from("<2I", data) != UF2_MAGIC:
        raise ValueError(f"{path} is not a UF2 file")
    block_no, total = struct.unpack_from("<2I", data, len(data) - 512 + 20)
    return data if block_no == total - 1 else None


@dataclass
class Flash:
    place: str
    name: str
    sha256: str
    size: int
    standin_exit: int | None = None


@dataclass
class StandInBoard:
    """One Pico 2 stand-in: a pty for its CDC port, a directory for its BOOTSEL drive."""

    place: str
    exe: Path
    root: Path
    # What the stand-in sends as output 0: an array, or a function called at flash time
    # (a test that builds through `deploykit run` reads the export's reference then).
    values: Any = field(default_factory=lambda: np.arange(10, dtype=np.float32))
    serve_ms: int = 20000

    def __post_init__(self) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(slave)
        self.tty = os.ttyname(slave)
        os.set_blocking(self.master, False)
        os.close(slave)
        self.drive = self.root / f"{self.place.replace('/', '_')}-drive"
        self.drive.mkdir(parents=True)
        self.values_file = self.root / f"{self.place.replace('/', '_')}-values.bin"
        self.flashes: list[Flash] = []
        self.running = threading.Event()  # the stand-in firmware runs (the board is busy)
        self.touches = 0  # reboots into BOOTSEL by a 1200-baud touch
        self._stop = threading.Event()
        self._reset = threading.Event()
        self.bootsel()
        self._thread = threading.Thread(target=self._boot_rom, daemon=True)
        self._thread.start()

    def bootsel(self) -> None:
        (self.drive / "INFO_UF2.TXT").write_text(INFO_UF2)

    def _touched(self) -> bool:
        """The pico-sdk's reset request: the CDC port's line rate set to 1200 baud (here by
        ser2net, on an RFC 2217 client's request). The pty's two sides share one termios."""
        return termios.tcgetattr(self.master)[5] == termios.B1200

    def _reset_line_rate(self) -> None:
        fd = os.open(self.tty, os.O_RDWR | os.O_NOCTTY)
        try:
            attrs = termios.tcgetattr(fd)
            attrs[4] = attrs[5] = termios.B115200
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        finally:
            os.close(fd)

    def _boot_rom(self) -> None:
        proc: subprocess.Popen | None = None
        flash: Flash | None = None
        while not self._stop.is_set():
            time.sleep(0.05)
            if self._reset.is_set():  # power-cycled into BOOTSEL mode, between tests
                if proc is not None:
                    proc.kill()
                    proc.wait()
                    proc = None
                for p in self.drive.iterdir():
                    p.unlink()
                self._reset_line_rate()
                self.running.clear()
                self.flashes, self.touches = [], 0
                self.values = np.arange(10, dtype=np.float32)
                self.bootsel()
                self._reset.clear()
                continue
            if self.running.is_set():  # the firmware runs (or has finished and idles)
                if proc is not None and proc.poll() is not None and flash is not None:
                    flash.standin_exit = proc.wait()
                    proc = None
                if self._touched():  # reboot into BOOTSEL
                    if proc is not None:
                        proc.kill()
                        flash.standin_exit = proc.wait()
                        proc = None
                    self._reset_line_rate()
                    self.touches += 1
                    self.running.clear()
                    self.bootsel()
                continue
            uf2s = sorted(self.drive.glob("*.uf2"))
            data = complete_uf2(uf2s[0]) if uf2s else None
            if data is None:
                continue
            flash = Flash(self.place, uf2s[0].name, hashlib.sha256(data).hexdigest(), len(data))
            self.flashes.append(flash)
            for p in self.drive.iterdir():  # the drive goes away: the board reboots
                p.unlink()
            values = self.values() if callable(self.values) else self.values
            self.values_file.write_bytes(np.asarray(values, np.float32).tobytes())
            self.running.set()
            proc = subprocess.Popen(
                [str(self.exe), str(self.master), str(self.values_file), str(self.serve_ms)],
                pass_fds=(self.master,),
                stdout=subprocess.DEVNULL,
            )
        if proc is not None:
            proc.kill()
            proc.wait()

    def firmware_exit(self, timeout_s: float = 10.0) -> int | None:
        """The exit code of the stand-in firmware of the last flash, once it has ended (it
        ends when the host's ACK arrives, a moment after the host has returned)."""
        deadline = time.monotonic() + timeout_s
        while self.flashes[-1].standin_exit is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.flashes[-1].standin_exit

    def reset(self) -> None:
        """Back to a fresh board in BOOTSEL mode with nothing recorded (between tests)."""
        self._reset.set()
        deadline = time.monotonic() + 10
        while self._reset.is_set():
            assert time.monotonic() < deadline, "the stand-in board did not reset"
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        os.close(self.master)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labgrid_tool(name: str) -> str | None:
    """labgrid's programs, beside the running Python (a virtual environment) or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


class LocalFarm:
    """A coordinator and an exporter on 127.0.0.1 with one place per stand-in board, each
    tagged board=pico2."""

    def __init__(
        self,
        root: Path,
        places: list[str],
        exe: Path,
        picotool_place: str | None = None,
        block_drive_place: str | None = None,
    ) -> None:
        self.root = root
        self.address = f"127.0.0.1:{free_port()}"
        self.boards = {name: StandInBoard(name, exe, root) for name in places}
        # A place flashed with picotool (its boot device exported as a USBFlashableDevice;
        # `bin/picotool` stands in for the tool), untagged so that tag queries pass it over.
        self.picotool_place = picotool_place
        if picotool_place is not None:
            self.boards[picotool_place] = StandInBoard(picotool_place, exe, root)
            self._write_picotool(self.boards[picotool_place])
        # A place whose drive is a block device (as udev exports a real one): labgrid's own
        # USBStorageDriver writes to it, over SSH to the exporter; untagged as well.
        self.block_drive_place = block_drive_place
        if block_drive_place is not None:
            self.boards[block_drive_place] = StandInBoard(block_drive_place, exe, root)
        self._procs: list[subprocess.Popen] = []
        self.client = _labgrid_tool("labgrid-client")
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _write_picotool(self, board: StandInBoard) -> None:
        """bin/picotool: `picotool load -v -x FILE -t uf2 --bus 3 --address 9` delivers the UF2
        to the boot ROM of the board at that USB address (here: onto its drive directory, which
        the stand-in's boot ROM watches), as picotool does over PICOBOOT; it refuses, as
        picotool does, when that board is not in BOOTSEL mode. Each call is logged."""
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        self.picotool_log = bin_dir / "picotool.log"
        script = bin_dir / "picotool"
        script.write_text(
            f"""#!{sys.executable}
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
with open({str(self.picotool_log)!r}, "a") as log:
    log.write(" ".join(args) + "\\n")
drive = Path({str(board.drive)!r})
ok = args[:4] == ["load", "-v", "-x", args[3]] and args[4:6] == ["-t", "uf2"]
if not ok or args[6:] != ["--bus", "3", "--address", "9"]:
    sys.exit("picotool stand-in: unexpected arguments " + " ".join(args))
if not (drive / "INFO_UF2.TXT").exists():
    sys.exit("No accessible RP-series devices in BOOTSEL mode were found.")
shutil.copy(args[3], drive / "picotool-load.uf2")
print("Loading into Flash: [==============================]  100%")
"""
        )
        script.chmod(0o755)
        self.bin_dir = bin_dir

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.root / log, "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(argv, cwd=self.root, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self._procs.append(proc)
        return proc

    def _start(self) -> None:
        self._spawn([_labgrid_tool("labgrid-coordinator"), "-l", self.address], "coordinator.log")
        host, port = self.address.split(":")
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "labgrid-coordinator did not start: "
                    + (self.root / "coordinator.log").read_text()
                )
            time.sleep(0.1)
        config = {}
        for name, board in self.boards.items():
            config[self.group(name)] = {
                "RawSerialPort": {"port": board.tty, "speed": 115200},
                "NetworkUSBMassStorage": {
                    "host": "127.0.0.1",
                    "path": str(board.drive),
                    "busnum": 1,
                    "devnum": 5,
                    "vendor_id": 0x2E8A,
                    "model_id": 0x000F,
                },
            }
        if self.picotool_place is not None:
            group = config[self.group(self.picotool_place)]
            del group["NetworkUSBMassStorage"]  # a boot device only: picotool must be chosen
            group["NetworkUSBFlashableDevice"] = {
                "host": "127.0.0.1",
                "busnum": 3,
                "devnum": 9,
                "path": "3-2",
                "vendor_id": 0x2E8A,
                "model_id": 0x000F,
            }
        if self.block_drive_place is not None:
            drive = config[self.group(self.block_drive_place)]["NetworkUSBMassStorage"]
            drive["path"] = "/dev/disk/by-id/usb-RPI_RP2350-deploykit-test"
        (self.root / "exporter.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            [
                _labgrid_tool("labgrid-exporter"),
                "-c",
                self.address,
                "-n",
                "lab",
                "--hostname",
                "127.0.0.1",
                "exporter.yaml",
            ],
            "exporter.log",
        )
        for name in self.boards:
            self.lg("-p", name, "create")
            self.lg("-p", name, "add-match", f"lab/{self.group(name)}/*")
            if name not in (self.picotool_place, self.block_drive_place):
                self.lg("-p", name, "set-tags", "board=pico2")
        deadline = time.monotonic() + 30
        while self.lg("resources").count("NetworkSerialPort") < len(self.boards):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the exporter's resources did not appear: "
                    + (self.root / "exporter.log").read_text()
                )
            time.sleep(0.2)

    @staticmethod
    def group(place: str) -> str:
        return place.replace("/", "_")

    def lg(self, *args: str) -> str:
        res = subprocess.run(
            [self.client, "-x", self.address, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.root,
        )
        if res.returncode != 0:
            raise RuntimeError(f"labgrid-client {' '.join(args)}: {res.stdout}{res.stderr}")
        return res.stdout

    def holders(self) -> dict[str, str | None]:
        """Each place and who holds it, as labgrid-client reports it."""
        out: dict[str, str | None] = {}
        place = None
        for line in self.lg("-v", "places").splitlines():
            if line.startswith("Place '"):
                place = line[len("Place '") : line.rindex("'")]
            elif place is not None and line.strip().startswith("acquired:"):
                value = line.split("acquired:", 1)[1].strip()
                out[place] = None if value in ("", "None") else value
        assert set(out) == set(self.boards), out
        return out

    def reset(self) -> None:
        """Every place free and every board fresh, for the next test on the same farm."""
        for name, holder in self.holders().items():
            if holder is not None:
                self.lg("-p", name, "release", "--kick")
        for board in self.boards.values():
            board.reset()

    def close(self) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for board in self.boards.values():
            board.close()
