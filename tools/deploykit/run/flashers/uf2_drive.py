"""The BOOTSEL drive: copy the UF2 to the mass-storage device the boot ROM presents.

A drive is recognised by its INFO_UF2.TXT, whose `Board-ID:` line names the chip (RP2350 for
the Pico 2, RPI-RP2 for an RP2040). Drives are looked for in the mount table and under the
desktop's automount roots (/media/<user>/<label>, /run/media/<user>/<label>). After the copy
the boot ROM flashes the image and reboots, and the drive goes away.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from deploykit.run.flashers.base import (
    Flasher,
    FlasherCapabilities,
    FlashError,
    FlashImage,
    FlashResult,
    FlashTarget,
)

INFO_FILE = "INFO_UF2.TXT"


def read_info(mount: Path) -> dict[str, str] | None:
    """INFO_UF2.TXT as a dict (`UF2 Bootloader` line under key 'bootloader'), or None."""
    try:
        text = (mount / INFO_FILE).read_text(errors="replace")
    except OSError:
        return None
    info: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
        elif line.strip().startswith("UF2 Bootloader"):
            info["bootloader"] = line.strip()
    return info


def _unescape_mount(field: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as octal (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        octal = field[i + 1:i + 4]
        if field[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class Uf2DriveFlasher(Flasher):
    """Copies the UF2 to the mounted BOOTSEL drive whose INFO_UF2.TXT has the board's ID."""

    kind = "uf2-drive"
    capabilities = FlasherCapabilities(image="uf2", needs_bootsel=True, uses_probe=False,
                                       runs_after=True, verifies=False)

    @property
    def board_id(self) -> str:
        return str(self.config.get("board_id", "RP2350"))

    def candidate_mounts(self) -> list[Path]:
        seen: dict[str, Path] = {}
        try:
            lines = self.env.mounts_file.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            parts = line.split()
            if len(parts) >= 2:
                p = Path(_unescape_mount(parts[1]))
                seen.setdefault(str(p), p)
        for root in self.env.media_roots:
            if not root.is_dir():
                continue
            for first in sorted(root.iterdir()):
                for p in [first, *(sorted(first.iterdir()) if first.is_dir() and not
                                   (first / INFO_FILE).exists() else [])]:
                    seen.setdefault(str(p), p)
        return [p for p in seen.values() if (p / INFO_FILE).is_file()]

    def discover(self) -> list[FlashTarget]:
        targets, others = [], []
        for mount in self.candidate_mounts():
            info = read_info(mount) or {}
            bid = info.get("Board-ID", "?")
            if bid == self.board_id:
                model = info.get("Model", "")
                targets.append(FlashTarget(self.kind, str(mount),
                                           f"drive {mount} ({model or bid})", path=mount))
            else:
                others.append(f"{mount} (Board-ID {bid})")
        if others:
            self.notes.append(f"UF2 drive(s) of another chip ignored: {', '.join(others)}")
        if not targets:
            self.notes.append(f"no mounted drive with {INFO_FILE} Board-ID {self.board_id}")
        return targets

    def target_for_path(self, mount: Path) -> FlashTarget:
        info = read_info(mount)
        if info is None:
            raise FlashError(f"{mount} has no {INFO_FILE}: it is not a UF2 boot drive.",
                             "Hold BOOTSEL while plugging in the board; the drive it shows "
                             f"is labelled {self.config.get('volume_label', self.board_id)}.")
        if info.get("Board-ID") != self.board_id:
            raise FlashError(f"{mount} is the boot drive of a {info.get('Board-ID', '?')}, not "
                             f"of an {self.board_id} ({self.board.name}).",
                             "Plug in the right board, or pick its drive with --port.")
        return FlashTarget(self.kind, str(mount), f"drive {mount}", path=mount)

    def flash(self, image: FlashImage, target: FlashTarget) -> FlashResult:
        uf2 = image.for_kind("uf2")
        assert target.path is not None
        dest = target.path / uf2.name
        data = uf2.read_bytes()
        t0 = time.monotonic()
        try:
            with open(dest, "wb") as f:
                for i in range(0, len(data), 64 * 1024):
                    f.write(data[i:i + 64 * 1024])
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            # The boot ROM may reboot (and the drive vanish) right after the last block; a
            # failure before that is a real one.
            raise FlashError(f"Copying {uf2.name} to {target.path} failed: {exc}",
                             "Check that the drive is still mounted and writable.") from exc
        notes = [f"copied {len(data):,} B to {dest}"]
        deadline = time.monotonic() + self.env.eject_timeout_s
        while time.monotonic() < deadline and (target.path / INFO_FILE).exists():
            time.sleep(0.1)
        if (target.path / INFO_FILE).exists():
            notes.append(f"the drive was still mounted {self.env.eject_timeout_s:g} s after "
                         "the copy; the board normally reboots and unmounts it")
        return FlashResult(self.kind, target, uf2, time.monotonic() - t0, notes=notes)
