"""Flashing a board through the resources of a labgrid place.

The board file's `flashers:` list is the order of preference, as for a board on this machine
(deploykit.run.flashers); each kind maps to the labgrid resource that carries it on a place:

- picotool: USBFlashableDevice (exported as NetworkUSBFlashableDevice), `picotool load -v
  -x` on the exporter;
- uf2-drive: USBMassStorage (NetworkUSBMassStorage), the UF2 copied onto the drive;
- openocd: USBDebugger (NetworkUSBDebugger), `openocd ... program` on the exporter.

The first kind whose resource the place has, and the exporter sees now (`avail`), is used;
pyocd has no labgrid resource and is skipped. The image kind (UF2 or ELF) is the flasher's
own capability. A place with two resources of one kind is ambiguous and refused.

Commands run on the exporter's host: over labgrid's SSH connection manager (as labgrid's own
drivers do), or directly when the exporter is this machine. A drive resource whose `path` is
a directory is a drive already mounted there and is copied to; a block device is mounted with
labgrid's USBStorageDriver (udisks2 on the exporter) first.
"""

from __future__ import annotations

import hashlib
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from deploykit.run.farm.session import FarmError, FarmSession, PlaceResource
from deploykit.run.flashers import FLASHERS, FlashError, FlashImage, flasher_configs
from deploykit.run.flashers.uf2_drive import INFO_FILE
from deploykit.run.transport import reboot_to_bootsel

Progress = Callable[[str], None]

PLACE_RESOURCES = {
    "picotool": "NetworkUSBFlashableDevice",
    "uf2-drive": "NetworkUSBMassStorage",
    "openocd": "NetworkUSBDebugger",
}
SERIAL_CLASS = "NetworkSerialPort"
REMOTE_DIR = "/tmp/deploykit-farm"  # where images are copied to on a remote exporter


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class PlaceFlash:
    """What was done: flasher kind, the resource, the image, how long, the command."""

    kind: str
    resource: PlaceResource
    image: Path
    seconds: float
    command: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        lines = [
            f"flashed {self.image.name} with {self.kind} through "
            f"{self.resource.cls} {self.resource.name} in {self.seconds:.1f} s",
            "  $ " + " ".join(self.command),
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def choose(
    board: Any, resources: Sequence[PlaceResource], place: str
) -> tuple[dict[str, Any], PlaceResource]:
    """The board file's first flasher whose resource the place has and sees (its config and
    the resource); FlashError naming what the place has otherwise."""
    seen = []
    for config in flasher_configs(board):
        kind = config["kind"]
        cls = PLACE_RESOURCES.get(kind)
        if cls is None:
            seen.append(f"{kind}: labgrid has no resource for it")
            continue
        found = [r for r in resources if r.cls == cls]
        if len(found) > 1:
            raise FlashError(
                f"Place {place} has {len(found)} {cls} resources "
                f"({', '.join(r.name for r in found)}); deploykit cannot tell "
                f"which one is the {board.name}.",
                "Give the place one resource of each kind (labgrid-client "
                "-p PLACE delete-match / add-match).",
            )
        if not found:
            seen.append(f"{kind}: the place has no {cls}")
        elif not found[0].avail:
            seen.append(f"{kind}: its {cls} is not present on the exporter now")
        else:
            return config, found[0]
    have = ", ".join(sorted({r.cls for r in resources})) or "none"
    raise FlashError(
        f"Nothing on place {place} can flash the {board.name}: "
        + "; ".join(seen)
        + f". The place has: {have}.",
        "Put the board in BOOTSEL mode (its drive and boot device then appear "
        "on the exporter), or add its debug probe to the place.",
    )


class ExporterHost:
    """Runs commands and places files on the host a resource is exported from."""

    def __init__(self, host: str) -> None:
        self.host = host
        names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
        self.local = host in names

    def run(self, argv: Sequence[str], timeout_s: float = 300.0) -> str:
        if self.local:
            cmd = list(argv)
        else:
            from labgrid.util.ssh import sshmanager

            cmd = [*sshmanager.get(self.host).get_prefix(), "--", *(shlex.quote(a) for a in argv)]
        try:
            res = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise FlashError(
                f"`{' '.join(argv)}` on {self.host} did not finish in {timeout_s:g} s.",
                "Check the board's USB connection.",
            ) from exc
        text = (res.stdout or "") + (res.stderr or "")
        if res.returncode != 0:
            tail = "\n".join(text.strip().splitlines()[-12:])
            raise FlashError(
                f"`{' '.join(argv)}` on {self.host} failed (exit {res.returncode}):\n{tail}",
                "Check the place's resources (labgrid-client -p PLACE show).",
            )
        return text

    def put(self, local: Path) -> str:
        """The path of `local` on the host (copied there when the host is another one)."""
        if self.local:
            return str(local)
        from labgrid.util.ssh import sshmanager

        # Named by content: jobs flashing other images through this exporter at the same time
        # do not overwrite each other's file.
        digest = hashlib.sha256(local.read_bytes()).hexdigest()[:16]
        remote = f"{REMOTE_DIR}/{digest}-{local.name}"
        self.run(["mkdir", "-p", REMOTE_DIR])
        sshmanager.put_file(self.host, str(local), remote)
        return remote

    def is_dir(self, path: str) -> bool:
        if self.local:
            return Path(path).is_dir()
        try:
            self.run(["test", "-d", path], timeout_s=30.0)
        except FlashError:
            return False
        return True

    def exists(self, path: str) -> bool:
        if self.local:
            return Path(path).exists()
        try:
            self.run(["test", "-e", path], timeout_s=30.0)
        except FlashError:
            return False
        return True


def serial_url(resource: PlaceResource) -> str:
    """pyserial's URL for a NetworkSerialPort (ser2net speaks RFC 2217 unless told raw).

    ser2net does not answer RFC 2217's SET_CONTROL (flow control), on which pyserial's client
    waits and times out ("timeout while waiting for option 'control'"); the URL option
    `ign_set_control` (pyserial 3.5, and labgrid's fork of it) skips the wait, as labgrid's
    own serial driver does."""
    host, port = resource.params.get("host"), resource.params.get("port")
    if resource.params.get("protocol") == "raw":
        return f"socket://{host}:{port}"
    return f"rfc2217://{host}:{port}?ign_set_control"


def network_serial_port(
    resources: Callable[[], Sequence[PlaceResource]], place: str, wait_s: float = 10.0
) -> PlaceResource:
    """The place's serial port, once its exporter serves it (the exporter starts ser2net when
    the place is acquired, and then publishes the TCP port)."""
    deadline = time.monotonic() + wait_s
    while True:
        ports = [r for r in resources() if r.cls == SERIAL_CLASS]
        if len(ports) > 1:
            raise FarmError(
                f"Place {place} has {len(ports)} serial ports "
                f"({', '.join(r.name for r in ports)}); deploykit reads one.",
                "Give the place only the board's console port.",
            )
        if not ports:
            raise FarmError(
                f"Place {place} has no serial port ({SERIAL_CLASS}).",
                "Add the board's USB serial port to the exporter and the place "
                "(deploykit farm exporter-config writes it).",
            )
        if ports[0].avail and ports[0].params.get("port"):
            return ports[0]
        if time.monotonic() >= deadline:
            raise FarmError(
                f"The serial port of place {place} is not available on its exporter "
                f"({ports[0].params.get('host')}).",
                "Check that the board is plugged in there and that ser2net is installed "
                "on the exporter.",
            )
        time.sleep(0.2)


def _seen_now(resources: Sequence[PlaceResource]) -> list[PlaceResource]:
    """The resources, with a drive published as a mounted directory counted as present only
    while it holds the boot ROM's INFO_UF2.TXT (udev makes a block device's resource
    unavailable by itself when the board leaves BOOTSEL mode)."""
    out = []
    for r in resources:
        if r.cls == PLACE_RESOURCES["uf2-drive"] and r.avail:
            host = ExporterHost(str(r.params.get("host", "localhost")))
            drive = str(r.params.get("path", ""))
            if drive and host.is_dir(drive) and not host.exists(f"{drive}/{INFO_FILE}"):
                r = PlaceResource(r.name, r.cls, r.params, False)
        out.append(r)
    return out


def _reboot_into_bootsel(
    board: Any,
    place: str,
    resources: Callable[[], Sequence[PlaceResource]],
    why: FlashError,
    progress: Progress,
    timeout_s: float,
) -> tuple[dict[str, Any], PlaceResource]:
    """A board that runs (rather than waits in BOOTSEL mode) has no boot device: reboot it
    into BOOTSEL through the place's serial port, as a local flash does through the CDC
    port (the pico-sdk's 1200-baud touch, which RFC 2217 carries to the exporter's port)."""
    reset_baud = ((getattr(board, "raw", None) or {}).get("serial") or {}).get("reset_baud")
    if reset_baud is None:
        raise why
    try:
        url = serial_url(network_serial_port(resources, place))
    except FarmError:
        raise why from None
    progress(
        f"{place}: the board is not in BOOTSEL mode; rebooting it ({reset_baud}-baud touch "
        f"on {url})"
    )
    reboot_to_bootsel(url, int(reset_baud))
    deadline = time.monotonic() + timeout_s
    while True:
        time.sleep(0.25)
        try:
            return choose(board, _seen_now(resources()), place)
        except FlashError as again:
            if time.monotonic() >= deadline:
                raise FlashError(
                    f"{again.cause} (still so {timeout_s:g} s after a {reset_baud}-baud touch "
                    f"on {url})",
                    again.hint,
                ) from why


def flash_place(
    board: Any,
    image: FlashImage,
    place: str,
    session: FarmSession,
    *,
    progress: Progress = _quiet,
    bootsel_timeout_s: float = 10.0,
    eject_timeout_s: float = 10.0,
) -> PlaceFlash:
    """Flash `image` through the resources of `place`, which `session` holds (it is asked for
    them again while a rebooted board comes back in BOOTSEL mode)."""

    def resources() -> list[PlaceResource]:
        return session.resources(place)

    try:
        config, resource = choose(board, _seen_now(resources()), place)
    except FlashError as exc:
        config, resource = _reboot_into_bootsel(
            board, place, resources, exc, progress, bootsel_timeout_s
        )
    kind = config["kind"]
    path = Path(image.for_kind(FLASHERS[kind].capabilities.image))
    if not path.is_file():
        raise FlashError(
            f"{kind} writes the {path.suffix[1:].upper()}, and {path} does not exist.",
            "Build it first: deploykit build --board B --model M",
        )
    host = ExporterHost(str(resource.params.get("host", "localhost")))
    progress(f"flashing {path.name} with {kind} through {place}'s {resource.cls} on {host.host}")
    t0 = time.monotonic()
    notes: list[str] = []
    if kind == "uf2-drive":
        command = _copy_to_drive(host, resource, path, notes, eject_timeout_s, session, place)
    elif kind == "picotool":
        remote = host.put(path)
        command = [
            "picotool",
            "load",
            "-v",
            "-x",
            remote,
            "-t",
            "uf2",
            "--bus",
            str(resource.params["busnum"]),
            "--address",
            str(resource.params["devnum"]),
        ]
        host.run(command, timeout_s=180.0)
    else:  # openocd
        remote = host.put(path)
        command = [
            "openocd",
            "-f",
            str(config.get("interface", "interface/cmsis-dap.cfg")),
            "-f",
            str(config.get("target", "target/rp2350.cfg")),
            "-c",
            f"adapter speed {int(config.get('adapter_khz', 5000))}",
            "-c",
            f"adapter usb location {resource.params['path']}",
            "-c",
            f"program {remote} verify reset exit",
        ]
        host.run(command)
    return PlaceFlash(kind, resource, path, time.monotonic() - t0, tuple(command), tuple(notes))


def _copy_to_drive(
    host: ExporterHost,
    resource: PlaceResource,
    uf2: Path,
    notes: list[str],
    eject_timeout_s: float,
    session: FarmSession,
    place: str,
) -> list[str]:
    drive = str(resource.params.get("path", ""))
    if not drive:
        raise FlashError(
            f"The place's {resource.cls} {resource.name} has no path.",
            "Check the exporter's configuration.",
        )
    if not host.is_dir(drive):
        return _write_with_labgrid(session, place, resource, uf2)
    info = str(PurePosixPath(drive) / INFO_FILE)
    if not host.exists(info):
        raise FlashError(
            f"{drive} on {host.host} has no {INFO_FILE}: it is not (or no longer) "
            "a UF2 boot drive.",
            "Put the board in BOOTSEL mode and retry.",
        )
    remote = host.put(uf2)
    command = ["cp", remote, str(PurePosixPath(drive) / uf2.name)]
    host.run(command)
    # The boot ROM flashes the image and reboots; the drive goes away.
    deadline = time.monotonic() + eject_timeout_s
    while time.monotonic() < deadline and host.exists(info):
        time.sleep(0.1)
    if host.exists(info):
        notes.append(
            f"the drive was still there {eject_timeout_s:g} s after the copy; the "
            "board normally reboots and the drive goes away"
        )
    return command


def _write_with_labgrid(
    session: FarmSession, place: str, resource: PlaceResource, uf2: Path
) -> list[str]:
    """A block device on the exporter: labgrid's USBStorageDriver mounts it (udisks2 there),
    copies the UF2 and unmounts it."""
    from labgrid.driver import USBStorageDriver

    target = session.labgrid_target(place)
    try:
        driver = USBStorageDriver(target, name=None)
        target.activate(driver)
        driver.write_files([str(uf2)], PurePosixPath("/"), None, target_is_directory=True)
    except Exception as exc:  # labgrid's ExecutionError, CalledProcessError, ssh failures
        raise FlashError(
            f"Copying {uf2.name} to the drive {resource.params.get('path')} on "
            f"{resource.params.get('host')} failed: {exc}",
            "Check that the exporter is reachable over SSH and runs udisks2.",
        ) from exc
    finally:
        target.cleanup()
    return ["USBStorageDriver.write_files", str(uf2), str(resource.params.get("path"))]
