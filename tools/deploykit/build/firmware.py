"""Build stage: what every board family's firmware build produces and how it is checked.

Each family builds its images its own way (deploykit.families: the MPS boards through
`firmware/`, RP2350 boards through the pico-sdk project `firmware/pico/`); the result is a
`Firmware`, whose linked ELF can be checked against the board file's memory regions
(`memory_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.build.cmake import CMakeResult
from deploykit.readers.boards import Board, repo_root
from deploykit.readers.sizes import SizeReport
from deploykit.util.errors import BuildError, MemoryPlanError

if TYPE_CHECKING:
    from deploykit.readers.uf2 import Uf2Result


@dataclass(frozen=True)
class Firmware:
    board: str
    elf: Path
    map_file: Path
    sizes: SizeReport
    configure_seconds: float
    build_seconds: float
    log: Path
    fit: MemoryFit | None = None  # the ELF against the board's regions (pico builds)
    uf2: Uf2Result | None = None  # boards flashed as UF2 (rp2350)

    def summary(self, sizes: bool = True) -> str:
        """`sizes=False`: without the size table (the caller shows the footprint instead)."""
        text = (f"{self.elf} for {self.board} (configure {self.configure_seconds:.1f} s, "
                f"build {self.build_seconds:.1f} s)" + (f"\n{self.sizes.table()}" if sizes
                                                          else ""))
        if self.fit is not None:
            text += "\n" + self.fit.table()
        if self.uf2 is not None:
            u = self.uf2
            same = {True: "; picotool's output is identical",
                    False: "; differs from picotool's"}.get(u.picotool_identical, "")
            text += (f"\n{u.path} (written by {u.source}{same}): checked, "
                     f"{u.report.summary()}")
            text += "".join(f"\n  note: {n}" for n in u.report.notes)
        return text


@dataclass(frozen=True)
class RegionFit:
    name: str
    origin: int
    size: int
    used: int  # bytes of ALLOC sections placed there (run addresses), plus load images
    nonvolatile: bool  # holds the board's vectors or code (flash)

    @property
    def headroom(self) -> int:
        return self.size - self.used


@dataclass(frozen=True)
class MemoryFit:
    """Where the linked ELF's sections landed, per board region, and Berkeley sizes."""

    board: str
    regions: tuple[RegionFit, ...]
    text: int
    data: int
    bss: int
    problems: tuple[str, ...] = ()

    @property
    def flash_used(self) -> int:
        return sum(r.used for r in self.regions if r.nonvolatile)

    @property
    def flash_size(self) -> int:
        return sum(r.size for r in self.regions if r.nonvolatile)

    @property
    def ram_used(self) -> int:
        return sum(r.used for r in self.regions if not r.nonvolatile)

    @property
    def ram_size(self) -> int:
        return sum(r.size for r in self.regions if not r.nonvolatile)

    @property
    def fits(self) -> bool:
        return not self.problems and all(r.headroom >= 0 for r in self.regions)

    def table(self) -> str:
        lines = [f"fit check ({self.board}): text {self.text:,} B, data {self.data:,} B, "
                 f"bss {self.bss:,} B",
                 f"  {'region':<10}{'origin':>12}{'used':>12}{'size':>12}{'use':>8}"]
        for r in self.regions:
            lines.append(f"  {r.name:<10}  0x{r.origin:08X}{r.used:>12,}{r.size:>12,}"
                         f"{100 * r.used / r.size:>7.1f}%")
        lines.append(f"  flash {self.flash_used:,} of {self.flash_size:,} B "
                     f"({self.flash_size // 1024:,} KiB), RAM {self.ram_used:,} of "
                     f"{self.ram_size:,} B ({self.ram_size // 1024:,} KiB): "
                     + ("fits" if self.fits else "DOES NOT FIT"))
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def memory_fit(elf: Path, board: Board) -> MemoryFit:
    """Place every allocated section of `elf` (run address, and load address when they
    differ) in the board's memory regions."""
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile

    code_regions = {board.placement["vectors"], board.placement["code"]}
    used = {r.name: 0 for r in board.memory}
    problems = []
    text = data = bss = 0

    def region_of(addr: int, size: int):
        return next((r for r in board.memory if r.origin <= addr and addr + size <= r.end), None)

    with open(elf, "rb") as f:
        e = ELFFile(f)
        loads = [s for s in e.iter_segments() if s["p_type"] == "PT_LOAD"]
        for sec in e.iter_sections():
            flags, size = sec["sh_flags"], sec["sh_size"]
            if not flags & SH_FLAGS.SHF_ALLOC or size == 0:
                continue
            nobits = sec["sh_type"] == "SHT_NOBITS"
            if nobits:
                bss += size
            elif flags & SH_FLAGS.SHF_WRITE:
                data += size
            else:
                text += size
            vma = sec["sh_addr"]
            r = region_of(vma, size)
            if r is None:
                problems.append(f"{sec.name} (0x{vma:08X}, {size:,} B) is outside every region "
                                f"of {board.name}")
                continue
            used[r.name] += size
            if nobits:
                continue
            seg = next((s for s in loads if s["p_vaddr"] <= vma
                        and vma + size <= s["p_vaddr"] + s["p_filesz"]), None)
            if seg is None:
                continue
            lma = seg["p_paddr"] + vma - seg["p_vaddr"]
            if lma != vma:
                lr = region_of(lma, size)
                if lr is None:
                    problems.append(f"the load image of {sec.name} (0x{lma:08X}) is outside "
                                    f"every region of {board.name}")
                else:
                    used[lr.name] += size
    regions = tuple(RegionFit(r.name, r.origin, r.size, used[r.name], r.name in code_regions)
                    for r in board.memory)
    return MemoryFit(board.name, regions, text, data, bss, tuple(problems))


def check_fit(fit: MemoryFit, elf: Path) -> None:
    if not fit.fits:
        raise MemoryPlanError(f"{elf.name} does not fit {fit.board}:\n{fit.table()}",
                              "Make the model smaller (--flow cortex_m_int8) or move items to "
                              "larger regions in the board file's placement.")


def toolchain_file() -> Path:
    return repo_root() / "cmake" / "arm-none-eabi-gcc.cmake"


def built_image(build_dir: Path, firmware: str, result: CMakeResult) -> tuple[Path, Path]:
    """The ELF and map file a finished build of `firmware` must have produced."""
    target = {"selftest": "dk_selftest", "runner": "dk_runner"}[firmware]
    elf, map_file = build_dir / f"{target}.elf", build_dir / f"{target}.map"
    if not elf.exists():
        raise BuildError(f"The build finished but {elf} is missing.",
                         "Check the firmware CMake project's target names.",
                         log_path=str(result.log))
    return elf, map_file
