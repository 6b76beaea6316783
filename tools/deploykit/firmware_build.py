"""Build stage: configure and build a firmware image of `firmware/` for a board."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .boards import Board, repo_root
from .cmake_driver import cmake_build
from .errors import BuildError
from .sizes import SizeReport, size_report


@dataclass(frozen=True)
class Firmware:
    board: str
    elf: Path
    map_file: Path
    sizes: SizeReport
    configure_seconds: float
    build_seconds: float
    log: Path

    def summary(self) -> str:
        return (f"{self.elf} for {self.board} (configure {self.configure_seconds:.1f} s, "
                f"build {self.build_seconds:.1f} s)\n{self.sizes.table()}")


def toolchain_file() -> Path:
    return repo_root() / "cmake" / "arm-none-eabi-gcc.cmake"


def build_image(board: Board, generated_dir: Path, build_dir: Path, firmware: str,
                definitions: dict[str, str] | None = None,
                progress: Callable[[str], None] | None = None) -> Firmware:
    """Build `firmware` (selftest or runner) against the rendered files in `generated_dir`."""
    defs = {"DK_GENERATED_DIR": str(generated_dir.resolve()), "DK_FIRMWARE": firmware,
            **(definitions or {})}
    result = cmake_build(repo_root() / "firmware", build_dir, defs, toolchain_file(),
                         progress=progress)
    target = {"selftest": "dk_selftest", "runner": "dk_runner"}[firmware]
    elf = build_dir / f"{target}.elf"
    map_file = build_dir / f"{target}.map"
    if not elf.exists():
        raise BuildError(f"The build finished but {elf} is missing.",
                         "Check the firmware CMake project's target names.",
                         log_path=str(result.log))
    return Firmware(board.name, elf, map_file, size_report(map_file), result.configure_seconds,
                    result.build_seconds, result.log)
