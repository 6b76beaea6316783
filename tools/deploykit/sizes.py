"""Size report: flash and RAM by component, from the ELF and the linker map file.

The map file says which archive or object every input section came from, so bytes are
attributed to the ExecuTorch runtime core, each kernel library, the model data, the
runner, the C library, and the pools and stack by their sections.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Output sections that occupy flash (loaded) vs RAM only (NOLOAD / bss).
_FLASH_SECTIONS = (".text", ".rodata", ".vectors", ".dk_model", ".ARM.exidx", ".ARM.extab",
                   ".init_array", ".fini_array", ".preinit_array", ".data", ".got")
_RAM_SECTIONS = (".data", ".bss", ".dk_pools", ".stack", ".heap", ".got", ".noinit")

# Input-section line of a GNU ld map: " .text.foo  0x00001234  0x56 path/libx.a(obj.o)"
_INPUT = re.compile(r"^\s+(\.\S+)?\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)\s+(\S.*)$")
_OUTPUT = re.compile(r"^(\.\S+)\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)")


def component_of(origin: str, section: str) -> str:
    """Name the component an input section belongs to."""
    name = Path(origin.split("(")[0]).name
    if section.startswith(".dk_model") or "model_pte" in origin:
        return "model data"
    if section.startswith(".dk_pools"):
        return "pools"
    if "model_io" in origin:
        return "model inputs"
    if name.startswith(("libc", "libm", "libg", "libnosys", "libstdc++", "libsupc++",
                        "libgcc")) or "crt" in name:
        return "C/C++ library"
    if name.startswith("lib") and name.endswith(".a"):
        return name[3:-2]
    return "runner"


@dataclass
class SizeReport:
    flash_by_component: dict[str, int] = field(default_factory=dict)
    ram_by_component: dict[str, int] = field(default_factory=dict)
    sections: dict[str, int] = field(default_factory=dict)

    @property
    def flash_total(self) -> int:
        return sum(self.flash_by_component.values())

    @property
    def ram_total(self) -> int:
        return sum(self.ram_by_component.values())

    def code_excluding_model(self) -> int:
        return sum(v for k, v in self.flash_by_component.items()
                   if k not in ("model data", "model inputs"))

    def table(self) -> str:
        lines = [f"{'flash':<28}{'bytes':>12}"]
        for k, v in sorted(self.flash_by_component.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:<26}{v:>12,}")
        lines.append(f"  {'total':<26}{self.flash_total:>12,}")
        lines.append(f"{'RAM':<28}{'bytes':>12}")
        for k, v in sorted(self.ram_by_component.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:<26}{v:>12,}")
        lines.append(f"  {'total':<26}{self.ram_total:>12,}")
        return "\n".join(lines)


def size_report(map_file: Path) -> SizeReport:
    report = SizeReport()
    flash: dict[str, int] = defaultdict(int)
    ram: dict[str, int] = defaultdict(int)
    output = None
    pending_section = None
    for line in map_file.read_text(errors="replace").splitlines():
        if line.startswith("Discarded input sections") or line.startswith("Memory Configuration"):
            output = None
            continue
        m = _OUTPUT.match(line)
        if m:
            output = m.group(1)
            report.sections[output] = int(m.group(3), 16)
            continue
        if output is None:
            continue
        if re.match(r"^ \.\S+$", line):  # long input-section name, numbers on the next line
            pending_section = line.strip()
            continue
        m = _INPUT.match(line)
        if not m:
            pending_section = None
            continue
        section = m.group(1) or pending_section or output
        pending_section = None
        size = int(m.group(3), 16)
        if size == 0 or int(m.group(2), 16) == 0:
            continue
        comp = component_of(m.group(4), section)
        if output.startswith(_FLASH_SECTIONS):
            flash[comp] += size
        if output.startswith(_RAM_SECTIONS):
            ram[comp] += size
    for name in (".stack", ".heap"):
        if name in report.sections:
            ram[name.lstrip(".")] = report.sections[name]
    report.flash_by_component = dict(flash)
    report.ram_by_component = dict(ram)
    return report
