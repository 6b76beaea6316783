"""`deploykit farm exporter-config`: the labgrid exporter configuration of one board, written
from its board file, so that a lab admin never types a VID/PID.

The board's USB identity (`usb.vid`, `usb.pid_cdc` for its serial port, `usb.pid_bootsel`
for its boot ROM) and its flashers (the board file's `flashers:`) give the resources; the
board's USB serial number (the RP2350 reports the same one running and in BOOTSEL) ties them
to one board. udev's ID_VENDOR_ID / ID_MODEL_ID / ID_SERIAL_SHORT are what labgrid matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from deploykit.run.farm.session import BOARD_TAG
from deploykit.run.flashers import flasher_configs
from deploykit.util.errors import ConfigError


@dataclass(frozen=True)
class ExporterConfig:
    board: str
    group: str  # the resource group (and the suggested place name)
    resources: dict[str, Any]  # labgrid resource class -> its parameters
    text: str  # the YAML file, with how to start the exporter and make the place

    @property
    def place_commands(self) -> list[str]:
        return [
            f"labgrid-client -p {self.group} create",
            f"labgrid-client -p {self.group} add-match '<exporter name>/{self.group}/*'",
            f"labgrid-client -p {self.group} set-tags {BOARD_TAG}={self.board}",
        ]


def _hex4(value: int) -> str:
    return f"{int(value):04x}"  # udev writes IDs as four lower-case hex digits


def exporter_config(
    board: Any, serial: str, *, group: str | None = None, probe: str | None = None
) -> ExporterConfig:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", serial or ""):
        raise ConfigError(
            f"--serial {serial!r} is not a USB serial number.",
            "Give the board's serial number as udev reports it (ID_SERIAL_SHORT; "
            "`udevadm info /dev/ttyACM0 | grep SERIAL_SHORT`).",
        )
    usb = (getattr(board, "raw", None) or {}).get("usb") or {}
    if "vid" not in usb or "pid_cdc" not in usb:
        raise ConfigError(
            f"Board {board.name} has no USB serial port in its board file "
            "(usb.vid, usb.pid_cdc), so labgrid cannot find its console.",
            "Use a board whose console is a USB serial port (pico2, pico2-uart).",
        )
    vid = _hex4(usb["vid"])

    def match(pid: int, serial_number: str, vendor: str = vid) -> dict[str, str]:
        return {"ID_VENDOR_ID": vendor, "ID_MODEL_ID": _hex4(pid), "ID_SERIAL_SHORT": serial_number}

    serial_cfg = (getattr(board, "raw", None) or {}).get("serial") or {}
    configs = flasher_configs(board)
    # A console on a debug probe's UART bridge (pico2-uart) is the probe's USB device: it has
    # the probe's serial number, not the board's.
    console_is_probe = any(
        c.get("probe_vid") == usb["vid"] and c.get("probe_pid") == usb["pid_cdc"] for c in configs
    )
    if console_is_probe and not probe:
        raise ConfigError(
            f"The {board.name}'s console is its debug probe's serial port, so the probe's "
            "serial number is needed.",
            "Add --probe <the probe's USB serial number>.",
        )
    resources: dict[str, Any] = {
        "USBSerialPort": {
            "match": match(usb["pid_cdc"], probe if console_is_probe else serial),
            "speed": int(serial_cfg.get("baud", 115200)),
        }
    }
    kinds = [c["kind"] for c in configs]
    if "pid_bootsel" in usb:
        if "uf2-drive" in kinds:
            resources["USBMassStorage"] = {"match": match(usb["pid_bootsel"], serial)}
        if "picotool" in kinds:
            resources["USBFlashableDevice"] = {"match": match(usb["pid_bootsel"], serial)}
    if probe:
        swd = next((c for c in configs if c["kind"] == "openocd"), None)
        if swd is None or "probe_vid" not in swd:
            raise ConfigError(
                f"--probe: board {board.name} lists no openocd flasher with probe_vid/probe_pid.",
                "Leave --probe out for this board.",
            )
        resources["USBDebugger"] = {
            "match": match(swd["probe_pid"], probe, _hex4(swd["probe_vid"]))
        }
    name = group or f"{board.name}-{serial.lower()}"
    # labgrid renders the file with Jinja first, where a line starting with "#" is a
    # statement: comments there start with "##".
    header = [
        f"## labgrid exporter configuration for one {board.name} (USB serial {serial}),",
        f"## written by `deploykit farm exporter-config` from the {board.name} board file.",
        "## On the machine the board is plugged into:",
        "##   labgrid-exporter -c COORDINATOR:20408 THIS_FILE",
        "## Once, anywhere, to make the place deploykit runs on (--place NAME, or",
        f"## --place {BOARD_TAG}={board.name} for any free one):",
    ]
    cfg = ExporterConfig(board.name, name, resources, "")
    header += [f"##   {c}" for c in cfg.place_commands]
    text = "\n".join(header) + "\n" + yaml.safe_dump({name: resources}, sort_keys=False)
    return ExporterConfig(board.name, name, resources, text)
