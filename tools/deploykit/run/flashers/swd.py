"""SWD through a debug probe: OpenOCD or pyOCD, when the board file lists them.

Probes are found by USB identity (the board file's probe_vid/probe_pid; the Raspberry Pi Debug
Probe is 2e8a:000c, CMSIS-DAP) in sysfs; `--probe SERIAL` picks one of several. Both program
the ELF (it carries addresses) and reset the target so the new firmware runs.
"""

from __future__ import annotations

import time

from deploykit.run.flashers.base import (
    Flasher,
    FlasherCapabilities,
    FlashImage,
    FlashResult,
    FlashTarget,
)


class _ProbeFlasher(Flasher):
    capabilities = FlasherCapabilities(image="elf", needs_bootsel=False, uses_probe=True,
                                       runs_after=True, verifies=True)

    def discover(self) -> list[FlashTarget]:
        vid, pid = self.config.get("probe_vid"), self.config.get("probe_pid")
        if vid is None or pid is None:
            self.notes.append("the board file gives no probe_vid/probe_pid")
            return []
        probes = [d for d in self.env.usb_devices() if d.vid == vid and d.pid == pid]
        if not probes:
            self.notes.append(f"no debug probe (USB {vid:04x}:{pid:04x})")
        return [FlashTarget(self.kind, d.serial or d.location, f"probe {d.describe()}", usb=d)
                for d in probes]


class OpenOcdFlasher(_ProbeFlasher):
    """`openocd -f <interface> -f <target> -c "program <elf> verify reset exit"`."""

    kind = "openocd"
    tool = "openocd"

    def command(self, elf: str, target: FlashTarget) -> list[str]:
        cmd = [self.tool_path() or "openocd",
               "-f", str(self.config.get("interface", "interface/cmsis-dap.cfg")),
               "-f", str(self.config.get("target", "target/rp2350.cfg")),
               "-c", f"adapter speed {int(self.config.get('adapter_khz', 5000))}"]
        if target.usb is not None and target.usb.serial:
            cmd += ["-c", f"adapter serial {target.usb.serial}"]
        return cmd + ["-c", f"program {elf} verify reset exit"]

    def flash(self, image: FlashImage, target: FlashTarget) -> FlashResult:
        elf = image.for_kind("elf")
        cmd = self.command(str(elf), target)
        t0 = time.monotonic()
        out = self._check_run(cmd, timeout_s=300.0)
        return FlashResult(self.kind, target, elf, time.monotonic() - t0, tuple(cmd), out)


class PyOcdFlasher(_ProbeFlasher):
    """`pyocd load -t <target> -u <probe> <elf>`, then `pyocd reset`."""

    kind = "pyocd"
    tool = "pyocd"

    def commands(self, elf: str, target: FlashTarget) -> list[list[str]]:
        exe = self.tool_path() or "pyocd"
        sel = ["-t", str(self.config.get("target", "rp2350"))]
        if target.usb is not None and target.usb.serial:
            sel += ["-u", target.usb.serial]
        return [[exe, "load", *sel, elf], [exe, "reset", *sel]]

    def flash(self, image: FlashImage, target: FlashTarget) -> FlashResult:
        elf = image.for_kind("elf")
        t0 = time.monotonic()
        out, cmds = "", self.commands(str(elf), target)
        for cmd in cmds:
            out += self._check_run(cmd, timeout_s=300.0)
        return FlashResult(self.kind, target, elf, time.monotonic() - t0, tuple(cmds[0]), out)
