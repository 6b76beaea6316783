"""Flashers and their selection, against real stand-ins of the host.

- sysfs: a directory laid out like /sys/bus/usb/devices (idVendor, idProduct, serial, busnum,
  devnum, product; interface directories that must be skipped);
- the BOOTSEL drive: a directory laid out like the RP2350's (INFO_UF2.TXT, INDEX.HTM), listed in
  a mounts file in /proc/mounts format (octal escapes included), or under a /media-like root;
- tools: executable stand-ins for picotool and openocd on a private PATH, which record their
  arguments and answer like the real ones (exit status, output);
- a running board: a pty listed by pyserial's ListPortInfo, whose baud rate the "board" watches
  to reboot into BOOTSEL on the 1200-baud touch.
"""

from __future__ import annotations

import os
import pty
import termios
import threading
import time
from pathlib import Path

import pytest
from serial.tools.list_ports_common import ListPortInfo

from deploykit.readers.boards import load_board
from deploykit.run.flashers import (
    FLASHERS,
    FlashError,
    FlashImage,
    HostEnv,
    OpenOcdFlasher,
    PicotoolFlasher,
    PyOcdFlasher,
    Uf2DriveFlasher,
    flash,
    select,
    usb_devices,
)
from deploykit.util.errors import ConfigError, ExitCode

INFO_RP2350 = "UF2 Bootloader v1.0\nModel: Raspberry Pi RP2350\nBoard-ID: RP2350\n"
INFO_RP2040 = "UF2 Bootloader v3.0\nModel: Raspberry Pi RP2\nBoard-ID: RPI-RP2\n"


@pytest.fixture
def board():
    return load_board("pico2")


class Host:
    """A temporary host: sysfs, mounts, media roots, PATH with stand-in tools, serial ports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sysfs = root / "sys/bus/usb/devices"
        self.sysfs.mkdir(parents=True)
        self.mounts = root / "proc/mounts"
        self.mounts.parent.mkdir(parents=True)
        self.mounts.write_text("sysfs /sys sysfs rw 0 0\nproc /proc proc rw 0 0\n")
        self.media = root / "media"
        self.media.mkdir()
        self.bin = root / "bin"
        self.bin.mkdir()
        self.calls = root / "calls.log"
        self.ports: list[ListPortInfo] = []
        self.env = HostEnv(usb_sysfs=self.sysfs, mounts_file=self.mounts,
                           media_roots=(self.media,), path=str(self.bin),
                           list_ports=lambda: self.ports, eject_timeout_s=0.3,
                           bootsel_timeout_s=5.0)

    def usb(self, location: str, vid: int, pid: int, serial: str | None, bus=1, dev=5,
            product="RP2350 Boot") -> Path:
        d = self.sysfs / location
        d.mkdir()
        (d / "idVendor").write_text(f"{vid:04x}\n")
        (d / "idProduct").write_text(f"{pid:04x}\n")
        if serial is not None:
            (d / "serial").write_text(serial + "\n")
        (d / "busnum").write_text(f"{bus}\n")
        (d / "devnum").write_text(f"{dev}\n")
        (d / "product").write_text(product + "\n")
        (self.sysfs / f"{location}:1.0").mkdir()  # an interface: no idVendor
        return d

    def drive(self, name: str, info: str = INFO_RP2350, mounted: bool = True) -> Path:
        d = self.root / "mnt" / name
        d.mkdir(parents=True)
        (d / "INFO_UF2.TXT").write_text(info)
        (d / "INDEX.HTM").write_text("<html>raspberrypi.com/device/RP2?version=...</html>")
        if mounted:
            escaped = str(d).replace(" ", "\\040")
            with self.mounts.open("a") as f:
                f.write(f"/dev/sdb1 {escaped} vfat rw,nosuid,nodev,relatime 0 0\n")
        return d

    def tool(self, name: str, status: int = 0, output: str = "OK") -> Path:
        exe = self.bin / name
        exe.write_text(f'#!/bin/sh\necho "{name} $*" >> "{self.calls}"\necho "{output}"\n'
                       f"exit {status}\n")
        exe.chmod(0o755)
        return exe

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path / "host")


@pytest.fixture
def image(tmp_path):
    elf, uf2 = tmp_path / "dk_runner.elf", tmp_path / "dk_runner.uf2"
    elf.write_bytes(b"\x7fELF" + bytes(60))
    uf2.write_bytes(bytes(range(256)) * 8)
    return FlashImage(elf, uf2)


BOOTSEL = (0x2E8A, 0x000F)
PROBE = (0x2E8A, 0x000C)


# ---- each flasher -------------------------------------------------------------------------------

def test_flashers_declare_capabilities():
    assert set(FLASHERS) == {"picotool", "uf2-drive", "openocd", "pyocd"}
    pico, drive = PicotoolFlasher.capabilities, Uf2DriveFlasher.capabilities
    assert pico.needs_bootsel and pico.image == "uf2" and pico.verifies
    assert drive.needs_bootsel and drive.image == "uf2" and not drive.verifies
    for swd in (OpenOcdFlasher, PyOcdFlasher):
        assert swd.capabilities.uses_probe and swd.capabilities.image == "elf"
        assert not swd.capabilities.needs_bootsel


def test_sysfs_scan_skips_interfaces(host):
    host.usb("1-1.4", *BOOTSEL, "E6614104031B2C2A", bus=1, dev=7)
    host.usb("2-1", 0x1D6B, 0x0002, None, bus=2, dev=1, product="xHCI Host Controller")
    devs = usb_devices(host.sysfs)
    assert [(d.location, d.vid, d.pid, d.serial, d.bus, d.address) for d in devs] == [
        ("1-1.4", 0x2E8A, 0x000F, "E6614104031B2C2A", 1, 7), ("2-1", 0x1D6B, 2, None, 2, 1)]


def test_picotool_loads_the_uf2_into_the_bootsel_board(host, board, image):
    host.usb("1-1.4", *BOOTSEL, "E6614104031B2C2A")
    host.tool("picotool", output="Loading into Flash: [==============================]  100%")
    f, target = select(board, env=host.env)
    assert isinstance(f, PicotoolFlasher) and target.serial_number == "E6614104031B2C2A"
    result = f.flash(image, target)
    assert host.called() == [f"picotool load -v -x {image.uf2} -t uf2 --ser E6614104031B2C2A"]
    assert "100%" in result.output and result.flasher == "picotool"


def test_picotool_failure_is_a_flash_error_with_its_output(host, board, image):
    host.usb("1-1.4", *BOOTSEL, "E661")
    host.tool("picotool", status=248, output="ERROR: Unable to access device")
    with pytest.raises(FlashError) as exc:
        flash(board, image, env=host.env)
    assert exc.value.exit_code == ExitCode.FLASH
    assert "Unable to access device" in str(exc.value) and "exit 248" in str(exc.value)


def test_uf2_drive_copy_to_a_directory_laid_out_like_the_drive(host, board, image):
    drive = host.drive("RP2350 drive")  # a space: \040 in the mounts file
    f, target = select(board, env=host.env)  # no BOOTSEL USB device visible, no picotool
    assert isinstance(f, Uf2DriveFlasher) and target.path == drive
    result = f.flash(image, target)
    assert (drive / "dk_runner.uf2").read_bytes() == image.uf2.read_bytes()
    assert any("still mounted" in n for n in result.notes)  # nothing rebooted the "board"


def test_uf2_drive_that_goes_away_after_the_copy(host, board, image):
    drive = host.drive("RP2350")
    f, target = select(board, env=host.env)

    def board_reboots():  # the boot ROM flashes the image and the drive disappears
        while not (drive / "dk_runner.uf2").exists():
            time.sleep(0.01)
        (drive / "INFO_UF2.TXT").unlink()

    t = threading.Thread(target=board_reboots)
    t.start()
    host.env.eject_timeout_s = 5.0
    result = f.flash(image, target)
    t.join()
    assert not any("still mounted" in n for n in result.notes)


def test_drives_under_media_are_found_and_other_chips_ignored(host, board):
    d = host.media / "user" / "RP2350"
    d.mkdir(parents=True)
    (d / "INFO_UF2.TXT").write_text(INFO_RP2350)
    host.drive("RPI-RP2", info=INFO_RP2040)
    f = Uf2DriveFlasher(board, {"kind": "uf2-drive", "board_id": "RP2350"}, host.env)
    targets = f.discover()
    assert [t.path for t in targets] == [d]
    assert any("RPI-RP2" in n for n in f.notes)


def test_openocd_over_a_probe(host, board, image):
    host.usb("1-2", *PROBE, "E6633861A3978538", product="Debug Probe (CMSIS-DAP)")
    host.tool("openocd", output="** Programming Finished ** ** Verified OK **")
    f, target = select(board, env=host.env)
    assert isinstance(f, OpenOcdFlasher)
    f.flash(image, target)
    (call,) = host.called()
    assert call.startswith("openocd -f interface/cmsis-dap.cfg -f target/rp2350.cfg")
    assert "adapter speed 5000" in call and "adapter serial E6633861A3978538" in call
    assert f"program {image.elf} verify reset exit" in call


def test_pyocd_when_openocd_is_missing(host, board, image):
    host.usb("1-2", *PROBE, "PROBE1")
    host.tool("pyocd")
    f, target = select(board, env=host.env)
    assert isinstance(f, PyOcdFlasher)
    f.flash(image, target)
    assert host.called() == [f"pyocd load -t rp2350 -u PROBE1 {image.elf}",
                             "pyocd reset -t rp2350 -u PROBE1"]


# ---- selection order and ambiguity ---------------------------------------------------------------

def test_order_picotool_then_drive_then_swd(host, board):
    host.usb("1-1.4", *BOOTSEL, "E661")
    host.drive("RP2350")
    host.usb("1-2", *PROBE, "PROBE1")
    host.tool("picotool")
    host.tool("openocd")
    assert select(board, env=host.env)[0].kind == "picotool"
    (host.bin / "picotool").unlink()  # not installed, and no workspace to build it from
    assert select(board, env=host.env)[0].kind == "uf2-drive"
    assert select(board, probe="PROBE1", env=host.env)[0].kind == "openocd"


def test_two_boards_in_bootsel_are_ambiguous(host, board):
    host.usb("1-1.4", *BOOTSEL, "AAAA1111", dev=5)
    host.usb("1-1.3", *BOOTSEL, "BBBB2222", dev=6)
    host.tool("picotool")
    with pytest.raises(FlashError) as exc:
        select(board, env=host.env)
    text = str(exc.value)
    assert "AAAA1111" in text and "BBBB2222" in text and "--port" in text
    f, target = select(board, port="BBBB2222", env=host.env)
    assert target.serial_number == "BBBB2222"


def test_two_drives_are_ambiguous_and_port_picks_a_mount_point(host, board):
    a, b = host.drive("RP2350"), host.drive("RP2350_1")
    with pytest.raises(FlashError) as exc:
        select(board, env=host.env)
    assert str(a) in str(exc.value) and str(b) in str(exc.value)
    assert "--port" in str(exc.value)
    f, target = select(board, port=str(b), env=host.env)
    assert f.kind == "uf2-drive" and target.path == b


def test_a_directory_that_is_not_an_rp2350_drive_is_refused(host, board, tmp_path):
    other = host.drive("RPI-RP2", info=INFO_RP2040, mounted=False)
    with pytest.raises(FlashError, match="RPI-RP2"):
        select(board, port=str(other), env=host.env)
    with pytest.raises(FlashError, match="INFO_UF2.TXT"):
        select(board, port=str(tmp_path), env=host.env)


def test_a_port_whose_serial_number_matches_no_bootsel_board(host, board):
    host.usb("1-1.4", *BOOTSEL, "AAAA1111")
    host.tool("picotool")
    p = ListPortInfo("/dev/ttyACM3", skip_link_detection=True)
    p.vid, p.pid, p.serial_number = 0x2E8A, 0x0009, "CCCC3333"
    host.ports = [p]
    with pytest.raises(FlashError) as exc:
        select(board, port="/dev/ttyACM3", env=host.env)
    text = str(exc.value)
    assert "CCCC3333" in text and "AAAA1111" in text and "--port" in text


def test_two_probes_need_probe(host, board):
    host.usb("1-2", *PROBE, "PROBE1", dev=8)
    host.usb("1-3", *PROBE, "PROBE2", dev=9)
    host.tool("openocd")
    with pytest.raises(FlashError) as exc:
        select(board, env=host.env)
    assert "PROBE1" in str(exc.value) and "--probe" in str(exc.value)
    assert select(board, probe="PROBE2", env=host.env)[1].usb.serial == "PROBE2"


def test_nothing_to_flash_says_what_was_looked_for(host, board):
    with pytest.raises(FlashError) as exc:
        select(board, env=host.env)
    text = str(exc.value)
    assert "BOOTSEL" in text and "2e8a:000f" in text and "INFO_UF2.TXT" in text
    assert "openocd is not installed" in text and "Hold BOOTSEL" in text


def test_a_running_board_is_rebooted_into_bootsel_by_the_1200_baud_touch(host, board, image):
    master, slave = pty.openpty()
    path = os.ttyname(slave)
    p = ListPortInfo(path, skip_link_detection=True)
    p.vid, p.pid, p.serial_number = 0x2E8A, 0x0009, "E6614104031B2C2A"
    host.ports = [p]
    host.tool("picotool")

    def board_firmware():  # the pico-sdk's stdio_usb: line coding 1200 baud -> BOOTSEL
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if termios.tcgetattr(master)[4] == termios.B1200:
                host.ports = []  # the CDC device goes away ...
                host.usb("1-1.4", *BOOTSEL, "E6614104031B2C2A")  # ... the boot ROM appears
                return
            time.sleep(0.01)

    t = threading.Thread(target=board_firmware)
    t.start()
    result = flash(board, image, env=host.env)
    t.join()
    os.close(master)
    os.close(slave)
    assert result.flasher == "picotool" and result.target.serial_number == "E6614104031B2C2A"
    assert host.called() == [f"picotool load -v -x {image.uf2} -t uf2 --ser E6614104031B2C2A"]


def test_two_running_boards_need_a_port(host, board):
    ports = []
    for dev, sn in (("/dev/ttyACM0", "AAAA"), ("/dev/ttyACM1", "BBBB")):
        p = ListPortInfo(dev, skip_link_detection=True)
        p.vid, p.pid, p.serial_number = 0x2E8A, 0x0009, sn
        ports.append(p)
    host.ports = ports
    with pytest.raises(FlashError) as exc:
        select(board, env=host.env)
    assert "/dev/ttyACM0" in str(exc.value) and "/dev/ttyACM1" in str(exc.value)
    assert "--port" in str(exc.value)


def test_missing_image_and_boards_without_flashers(host, board, tmp_path):
    with pytest.raises(FlashError, match="exists"):
        flash(board, FlashImage(tmp_path / "no.elf", tmp_path / "no.uf2"), env=host.env)
    with pytest.raises(ConfigError, match="no flashers"):
        select(load_board("qemu-an505"), env=host.env)


def test_the_pico_runner_says_when_no_board_is_connected(host, board):
    from deploykit.run.runners import runner_for_board
    from deploykit.util.errors import EnvironmentProblem

    runner = runner_for_board(board, env=host.env)
    with pytest.raises(EnvironmentProblem) as exc:
        runner.check_environment()
    assert "No pico2 is connected" in exc.value.cause
    assert exc.value.exit_code == ExitCode.ENVIRONMENT
    host.drive("RP2350")
    assert "drive" in runner.check_environment()
