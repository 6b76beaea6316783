"""picotool: `picotool load -v -x` to a board in BOOTSEL mode, over the boot ROM's PICOBOOT.

picotool is not packaged by Debian 12. When it is not on PATH, deploykit builds it from the
workspace's pinned copy (west.yml group pico, 2.2.0) into `<workspace>/tools/picotool-<rev>/`
the first time it is needed; that needs libusb-1.0-0-dev (without libusb, picotool builds but
cannot talk to a device).
"""

from __future__ import annotations

import shutil
import subprocess
import time

from deploykit.readers.uf2 import picotool_build_dir
from deploykit.run.flashers.base import (
    Flasher,
    FlasherCapabilities,
    FlashError,
    FlashImage,
    FlashResult,
    FlashTarget,
    Progress,
)
from deploykit.util.errors import EnvironmentProblem


def ensure_picotool(ws, progress: Progress) -> str:
    """The path of picotool, building it from the workspace sources when needed."""
    found = shutil.which("picotool")
    if found:
        return found
    prefix = picotool_build_dir(ws)
    exe = prefix / "picotool" / "picotool"
    if exe.is_file():
        return str(exe)
    if not (ws.has("picotool") and ws.has("pico-sdk")):
        raise EnvironmentProblem(
            "picotool is not installed and the workspace has no picotool sources to build it.",
            "Run `deploykit setup --group pico` (or --source picotool=PATH@2.2.0).")
    for tool in ("cmake", "ninja", "c++", "pkg-config"):
        if shutil.which(tool) is None:
            raise EnvironmentProblem(f"Building picotool needs {tool}.",
                                     "apt-get install cmake ninja-build g++ pkg-config")
    if subprocess.run(["pkg-config", "--exists", "libusb-1.0"], check=False).returncode != 0:
        raise EnvironmentProblem(
            "Building picotool for flashing needs libusb (without it, picotool cannot see "
            "devices).", "apt-get install libusb-1.0-0-dev, or flash by copying the UF2 to the "
            "BOOTSEL drive.")
    build = prefix / "build"
    log = prefix / "build.log"
    build.mkdir(parents=True, exist_ok=True)
    progress(f"building picotool from {ws.path_of('picotool')} (about a minute, once)")
    cmds = [["cmake", "-S", str(ws.path_of("picotool")), "-B", str(build), "-G", "Ninja",
             f"-DPICO_SDK_PATH={ws.path_of('pico-sdk')}", f"-DCMAKE_INSTALL_PREFIX={prefix}",
             "-DPICOTOOL_FLAT_INSTALL=1", "-DCMAKE_BUILD_TYPE=Release"],
            ["ninja", "-C", str(build), "install"]]
    with log.open("w") as out:
        for cmd in cmds:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            res = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
            if res.returncode != 0:
                raise EnvironmentProblem("Building picotool failed.", "See the log.",
                                         log_path=str(log))
    if not exe.is_file():
        raise EnvironmentProblem(f"picotool built, but {exe} is missing.", log_path=str(log))
    return str(exe)


class PicotoolFlasher(Flasher):
    """`picotool load -v -x <uf2>` to one RP2350 in BOOTSEL mode (USB vid:pid_bootsel)."""

    kind = "picotool"
    tool = "picotool"
    capabilities = FlasherCapabilities(image="uf2", needs_bootsel=True, uses_probe=False,
                                       runs_after=True, verifies=True)

    def discover(self) -> list[FlashTarget]:
        vid, pid = self.usb.get("vid"), self.usb.get("pid_bootsel")
        if vid is None or pid is None:
            self.notes.append("the board file has no usb.vid/usb.pid_bootsel")
            return []
        found = [d for d in self.env.usb_devices() if d.vid == vid and d.pid == pid]
        if not found:
            self.notes.append(f"no device in BOOTSEL mode (USB {vid:04x}:{pid:04x})")
        return [FlashTarget(self.kind, d.serial or d.location, f"BOOTSEL {d.describe()}",
                            serial_number=d.serial, usb=d) for d in found]

    def flash(self, image: FlashImage, target: FlashTarget) -> FlashResult:
        exe = self.tool_path()
        if exe is None:
            raise FlashError("picotool is not installed.", "Build it with `deploykit flash` "
                             "from a workspace that has it, or copy the UF2 to the drive.")
        uf2 = image.for_kind("uf2")
        cmd = [exe, "load", "-v", "-x", str(uf2), "-t", "uf2"]
        d = target.usb
        if target.serial_number:
            cmd += ["--ser", target.serial_number]
        elif d is not None and d.bus is not None and d.address is not None:
            cmd += ["--bus", str(d.bus), "--address", str(d.address)]
        t0 = time.monotonic()
        out = self._check_run(cmd, timeout_s=180.0)
        return FlashResult(self.kind, target, uf2, time.monotonic() - t0, tuple(cmd), out)
