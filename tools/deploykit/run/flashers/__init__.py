"""Flashers: how firmware gets onto a physical board (docs/pico2.md, "Flashing").

The board file lists its flashers in order of preference (`flashers:`); `select()` asks each
in turn which boards it can see and takes the first flasher that sees exactly one. For the
Pico 2 the order is:

1. picotool  `picotool load -v -x` to a board in BOOTSEL mode (built from source if absent);
2. uf2-drive copy the UF2 to the mounted BOOTSEL drive, found by its INFO_UF2.TXT;
3. openocd / pyocd  SWD through a debug probe.

When none sees a board but a running one is connected (its USB CDC port, found by VID/PID),
it is rebooted into BOOTSEL by opening its port at the reset baud rate (both in
deploykit.run.transport), and the search runs again. Ambiguity stops with the candidates named:
two boards, or a `--port` whose USB serial number matches none of them. `--port` takes a
serial port (the board running deploykit firmware), a mount point (a BOOTSEL drive) or a USB
serial number; `--probe` a probe's serial.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deploykit.readers.uf2 import picotool_build_dir
from deploykit.run.flashers.base import (
    Flasher,
    FlasherCapabilities,
    FlashError,
    FlashImage,
    FlashResult,
    FlashTarget,
    HostEnv,
    Progress,
    UsbDevice,
    _quiet,
    usb_devices,
)
from deploykit.run.flashers.picotool import PicotoolFlasher, ensure_picotool
from deploykit.run.flashers.swd import OpenOcdFlasher, PyOcdFlasher
from deploykit.run.flashers.uf2_drive import Uf2DriveFlasher
from deploykit.run.transport import reboot_to_bootsel, running_boards
from deploykit.util.errors import ConfigError

FLASHERS: dict[str, type[Flasher]] = {
    cls.kind: cls for cls in (PicotoolFlasher, Uf2DriveFlasher, OpenOcdFlasher, PyOcdFlasher)
}


def flasher_configs(board: Any) -> list[Mapping[str, Any]]:
    raw = getattr(board, "raw", None) or {}
    configs = raw.get("flashers") or []
    if not configs:
        raise ConfigError(f"Board {board.name} lists no flashers.",
                          "Add a `flashers:` section to its board file (see boards/pico2.yaml).")
    for c in configs:
        if c.get("kind") not in FLASHERS:
            raise ConfigError(f"Board {board.name}: unknown flasher kind {c.get('kind')!r}.",
                              f"Known kinds: {', '.join(FLASHERS)}.")
    return configs


def _describe(targets: list[FlashTarget]) -> str:
    return "; ".join(t.description for t in targets)


def _port_serial(port: str, env: HostEnv) -> tuple[str | None, list[Any]]:
    """The USB serial number of serial port `port` (None when not a USB port we can see)."""
    ports = env.ports()
    for p in ports:
        if p.device == port or Path(p.device).resolve() == Path(port).resolve():
            return p.serial_number, ports
    return None, ports


def select(board: Any, *, port: str | None = None, probe: str | None = None,
           env: HostEnv | None = None, progress: Progress = _quiet,
           workspace: Any = None, allow_reboot: bool = True) -> tuple[Flasher, FlashTarget]:
    """The flasher and the one board it will program (see the module docstring)."""
    env = env or HostEnv()
    if workspace is not None:  # deploykit's own build of picotool, if there is one
        built = picotool_build_dir(workspace) / "picotool"
        if built not in env.tool_dirs:
            env.tool_dirs = (*env.tool_dirs, built)
    configs = flasher_configs(board)
    flashers = [FLASHERS[c["kind"]](board, c, env, progress) for c in configs]

    # --port as a mount point: that drive, nothing else.
    if port and Path(port).is_dir():
        drive = next((f for f in flashers if isinstance(f, Uf2DriveFlasher)), None)
        if drive is None:
            raise ConfigError(f"--port {port} is a directory, but {board.name} has no "
                              "uf2-drive flasher.")
        return drive, drive.target_for_path(Path(port))

    want_serial: str | None = None
    if port:
        want_serial, ports = _port_serial(port, env)
        if want_serial is None:
            known = [p.device for p in ports]
            if port in known:
                raise FlashError(f"--port {port} has no USB serial number, so deploykit cannot "
                                 "tell which board in BOOTSEL mode it is.",
                                 "Put only that board in BOOTSEL mode, or give its drive's "
                                 "mount point with --port.")
            want_serial = port  # not a port we can see: take it as a USB serial number

    seen: list[str] = []
    for f in flashers:
        caps = f.capabilities
        if probe and not caps.uses_probe:
            continue
        targets = f.discover()
        if probe:
            targets = [t for t in targets if t.ident == probe
                       or (t.usb is not None and t.usb.serial == probe)]
            if not targets:
                f.notes.append(f"no probe with serial {probe}")
        if want_serial and not caps.uses_probe:
            matching = [t for t in targets if t.serial_number == want_serial]
            unknown = [t for t in targets if t.serial_number is None]
            if targets and not matching and not unknown:
                raise FlashError(
                    f"--port {port} is the board with USB serial number {want_serial}, but "
                    f"{f.kind} sees only: {_describe(targets)}.",
                    "Choose one of these with --port <serial number>, or unplug the others.")
            targets = matching or unknown
        if len(targets) > 1:
            opt = "--probe SERIAL" if caps.uses_probe else "--port SERIAL|MOUNT"
            raise FlashError(f"{len(targets)} boards can be flashed with {f.kind}: "
                             f"{_describe(targets)}.",
                             f"Choose one with {opt} (the serial numbers or mount points "
                             "above), or disconnect the others.")
        if len(targets) == 1:
            reason = f.unavailable_reason()
            if reason is None:
                return f, targets[0]
            if isinstance(f, PicotoolFlasher) and workspace is not None:
                try:
                    exe = ensure_picotool(workspace, progress)
                except Exception as exc:  # cannot build it here: try the next flasher
                    seen.append(f"{f.kind}: {reason}, and building it failed: {exc}")
                    continue
                env.tool_dirs = (*env.tool_dirs, Path(exe).parent)
                return f, targets[0]
            seen.append(f"{f.kind}: sees {targets[0].description}, but {reason}")
            continue
        reason = f.unavailable_reason()
        seen.append(f"{f.kind}: " + "; ".join(f.notes + ([reason] if reason else [])))

    raw = getattr(board, "raw", None) or {}
    # Without serial.reset_baud (a console on a UART) no port can reboot the board into BOOTSEL.
    if allow_reboot and not probe and "reset_baud" in raw.get("serial", {}):
        running = running_boards(board, env.ports())
        if want_serial:
            running = [p for p in running if p.serial_number == want_serial
                       or p.device == port]
        if len(running) > 1:
            raise FlashError(
                f"{len(running)} {board.name} boards are running: "
                + "; ".join(f"{p.device} (serial {p.serial_number})" for p in running) + ".",
                "Choose one with --port <its serial port>.")
        if len(running) == 1:
            p = running[0]
            baud = int(raw["serial"]["reset_baud"])
            progress(f"rebooting {p.device} (serial {p.serial_number}) into BOOTSEL "
                     f"({baud}-baud touch)")
            reboot_to_bootsel(p.device, baud)
            deadline = time.monotonic() + env.bootsel_timeout_s
            while True:
                try:
                    # The boot ROM reports the chip's serial number, like the CDC device
                    # did; when the user named the board, insist on it.
                    return select(board, port=want_serial and p.serial_number, probe=None,
                                  env=env, progress=progress, workspace=workspace,
                                  allow_reboot=False)
                except FlashError:
                    if time.monotonic() >= deadline:
                        raise
                time.sleep(0.25)

    raise FlashError(
        f"No {board.name} to flash. " + " | ".join(seen) + ".",
        "Hold BOOTSEL while plugging the board in (it then shows a USB drive), or connect a "
        "debug probe; then run the command again.")


def flash(board: Any, image: FlashImage, *, port: str | None = None, probe: str | None = None,
          env: HostEnv | None = None, progress: Progress = _quiet,
          workspace: Any = None) -> FlashResult:
    """Select a flasher and a board (see `select`) and program `image`."""
    if not Path(image.uf2).is_file() and not Path(image.elf).is_file():
        raise FlashError(f"Neither {image.uf2} nor {image.elf} exists.",
                         "Build first: deploykit build --board B --model M")
    flasher, target = select(board, port=port, probe=probe, env=env, progress=progress,
                             workspace=workspace)
    needed = image.for_kind(flasher.capabilities.image)
    if not Path(needed).is_file():
        raise FlashError(f"{flasher.kind} writes the {flasher.capabilities.image.upper()}, and "
                         f"{needed} does not exist.", "Give both files (build them together).")
    progress(f"flashing with {flasher.kind}: {target.description}")
    return flasher.flash(image, target)


__all__ = ["FLASHERS", "FlashError", "FlashImage", "FlashResult", "FlashTarget", "Flasher",
           "FlasherCapabilities", "HostEnv", "OpenOcdFlasher", "PicotoolFlasher", "PyOcdFlasher",
           "Uf2DriveFlasher", "UsbDevice", "ensure_picotool", "flash", "flasher_configs",
           "picotool_build_dir", "select", "usb_devices"]
