"""Arm MPS2/MPS3/MPS4 and Corstone boards (QEMU's mps2-an505 and mps3-an547, the Corstone
FVPs): bare metal, deploykit's own startup, console and timer (firmware/boards/mps), one
CMake project (firmware/) for the self-test and the runner."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.build.cmake import cmake_build
from deploykit.build.firmware import Firmware, built_image, toolchain_file
from deploykit.families.base import BoardFamily, Progress
from deploykit.readers.boards import repo_root
from deploykit.readers.sizes import size_report

if TYPE_CHECKING:
    from deploykit.readers.boards import Board


class MpsFamily(BoardFamily):
    name = "mps"
    summary = "Arm MPS/Corstone boards, bare metal with deploykit's startup and C runtime"
    firmware_dirs = ("boards/mps",)
    runners = ("qemu", "fvp")

    def build_image(self, board: Board, generated_dir: Path, build_dir: Path, firmware: str,
                    definitions: dict[str, str] | None = None,
                    progress: Progress | None = None) -> Firmware:
        defs = {"DK_GENERATED_DIR": str(generated_dir.resolve()), "DK_FIRMWARE": firmware,
                **(definitions or {})}
        result = cmake_build(repo_root() / "firmware", build_dir, defs, toolchain_file(),
                             progress=progress)
        elf, map_file = built_image(build_dir, firmware, result)
        return Firmware(board.name, elf, map_file, size_report(map_file),
                        result.configure_seconds, result.build_seconds, result.log)
