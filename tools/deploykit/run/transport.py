"""How the host reaches a board over USB serial: find its port, reboot it into BOOTSEL.

The flashers (a running board is rebooted into its boot ROM, then flashed) and the serial-port
runner (the results are read from the board's USB CDC port) both need these, so they live here
and neither package imports the other for them.

- Port discovery: the board file's USB identity (`usb.vid`, `usb.pid_cdc`) against pyserial's
  `list_ports` (ListPortInfo); two candidates, or a `--port` whose USB serial number differs
  from the board just flashed, stop with the candidates named.
- BOOTSEL: opening a running board's CDC port at the reset baud rate (the board file's
  `serial.reset_baud`, 1200 by default) reboots it into its boot ROM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import serial

from deploykit.util.errors import ConfigError


def _usb(board: Any) -> Mapping[str, Any]:
    raw = board.get("usb", {}) if isinstance(board, Mapping) else \
        (getattr(board, "raw", None) or {}).get("usb", {})
    if "vid" not in raw or "pid_cdc" not in raw:
        name = board.get("name") if isinstance(board, Mapping) else getattr(board, "name", "?")
        raise ConfigError(f"Board {name} has no usb.vid/usb.pid_cdc to find its serial port by.",
                          "Add a `usb:` section to the board file, or give --port.")
    return raw


def _describe_port(p: Any) -> str:
    return (f"{p.device} (USB {p.vid:04x}:{p.pid:04x} serial {p.serial_number or '?'}"
            + (f", at {p.location}" if getattr(p, "location", None) else "") + ")")


def cdc_ports(board: Any, ports: list[Any]) -> list[Any]:
    """The ports of `ports` (pyserial ListPortInfo) that are this board's CDC device."""
    usb = _usb(board)
    return [p for p in ports if p.vid == usb["vid"] and p.pid == usb["pid_cdc"]]


def running_boards(board: Any, ports: Sequence[Any]) -> list[Any]:
    """The ports of `ports` with the USB identity of the board's running firmware (its CDC
    device), for the flashers' reboot into BOOTSEL. Unlike `cdc_ports`, it does not raise
    when the board file has no `usb` section."""
    usb = (getattr(board, "raw", None) or {}).get("usb", {})
    return [p for p in ports if p.vid == usb.get("vid") and p.pid == usb.get("pid_cdc")]


def locate_port(board: Any, ports: list[Any], port: str | None = None,
                serial_number: str | None = None) -> str | None:
    """The device of the board's serial port, None when it is not (yet) there.

    `port`: what the user gave (a device path or a pyserial URL); `serial_number`: the USB
    serial number the port must have (the board that was just flashed)."""
    if port and "://" in port:
        return port  # a pyserial URL (socket://, rfc2217://, loop://): taken as it is
    if port:
        info = next((p for p in ports if p.device == port), None)
        if info is None:
            return port if os.path.exists(port) else None
        if serial_number and info.serial_number and info.serial_number != serial_number:
            others = [p for p in cdc_ports(board, ports) if p.serial_number == serial_number]
            raise ConfigError(
                f"--port {port} is USB serial number {info.serial_number}, but the board that "
                f"was flashed is {serial_number}"
                + (f" ({', '.join(_describe_port(p) for p in others)})" if others else "") + ".",
                "Give the flashed board's port with --port, or leave --port out.")
        return port
    candidates = cdc_ports(board, ports)
    if serial_number:
        matching = [p for p in candidates if p.serial_number == serial_number]
        if not matching:
            return None  # the flashed board has not enumerated yet
        candidates = matching
    if len(candidates) > 1:
        raise ConfigError(
            f"{len(candidates)} serial ports look like this board: "
            + "; ".join(_describe_port(p) for p in candidates) + ".",
            "Choose one with --port <device>.")
    return candidates[0].device if candidates else None


def default_list_ports() -> list[Any]:
    """This host's serial ports (pyserial), where no HostEnv supplies them."""
    from serial.tools.list_ports import comports

    return list(comports())


def reboot_to_bootsel(device: str, baud: int = 1200) -> None:
    """Open `device` (a port, or a pyserial URL such as a farm's rfc2217://) at `baud` and
    close it: the pico-sdk's USB stdio then reboots the board into BOOTSEL
    (PICO_STDIO_USB_RESET_MAGIC_BAUD_RATE, 1200 by default)."""
    try:
        s = serial.serial_for_url(device, baudrate=baud)
        s.dtr = False
        s.close()
    except (serial.SerialException, OSError):
        pass  # the device often disappears while we close it
