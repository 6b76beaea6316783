"""Cortex-A boards running 64-bit Linux (Raspberry Pi 5 and 4): the runner is one static
aarch64 Linux program (firmware/linux_aarch64), cross-compiled with Debian's
g++-aarch64-linux-gnu against an ExecuTorch runtime with the XNNPACK delegate that is built once
per CPU flags (linux_runtime.py). It runs under qemu-aarch64 here (parity only), or on the board
over SSH (runners/linux.py); its result protocol goes to standard output (docs/rpi5.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.build.cmake import cmake_build
from deploykit.build.firmware import Firmware
from deploykit.families.base import BoardFamily, Progress
from deploykit.families.linux_runtime import build_runtime, toolchain_file
from deploykit.readers.boards import repo_root
from deploykit.readers.sizes import size_report
from deploykit.readers.sources import load_workspace, require_projects
from deploykit.util.errors import BuildError

if TYPE_CHECKING:
    from deploykit.readers.boards import Board
    from deploykit.readers.sources import Workspace

# The workspace projects the runtime is built from (west.yml group xnnpack), whose commits key
# the cached runtime.
RUNTIME_PROJECTS = ("xnnpack", "cpuinfo", "pthreadpool", "fxdiv", "fp16", "gflags", "json")


class LinuxAarch64Family(BoardFamily):
    name = "linux_aarch64"
    summary = (
        "Cortex-A boards on 64-bit Linux: a static aarch64 runner with ExecuTorch and "
        "XNNPACK, run under qemu-aarch64 or over SSH"
    )
    projects = RUNTIME_PROJECTS
    image_formats = ("elf",)
    owns_c_runtime = False  # glibc's, linked statically
    supports_lto = False
    firmware_dirs = ("boards/linux_aarch64", "linux_aarch64")
    runners = ("linux",)
    required_sections = ("linux",)

    def build_definitions(self, board: Board, workspace: Workspace) -> dict[str, str]:
        return {"DK_WORKSPACE": str(workspace.root)}

    def build_image(
        self,
        board: Board,
        generated_dir: Path,
        build_dir: Path,
        firmware: str,
        definitions: dict[str, str] | None = None,
        progress: Progress | None = None,
    ) -> Firmware:
        self.check_board(board)
        if firmware != "runner":
            raise BuildError(
                f"{board.name} has no {firmware} image: family {self.name} builds "
                "only the ExecuTorch runner.",
                "Use `deploykit build` or `deploykit run` for this board.",
            )
        defs = dict(definitions or {})
        workspace = defs.get("DK_WORKSPACE")
        ws = load_workspace(Path(workspace) if workspace else None)
        require_projects(ws, list(self.projects), f"The {board.name} runner")
        commits = runtime_commits(ws)
        cache = Path(defs.get("DK_ET_RUNTIME_CACHE_DIR") or ws.root / "runtime-cache")
        runtime = build_runtime(
            ws.executorch_dir, cache, board.cpu_flags, commits, progress=progress
        )
        if progress and runtime.cached:
            progress(f"aarch64 runtime {runtime.key} is cached ({runtime.directory})")
        result = cmake_build(
            repo_root() / "firmware" / "linux_aarch64",
            build_dir,
            {
                "DK_GENERATED_DIR": str(generated_dir.resolve()),
                "DK_CPU_FLAGS": ";".join(board.cpu_flags),
                "DK_ET_PREFIX": str(runtime.prefix),
                "DK_ET_RUNTIME_KEY": runtime.key,
                "EXECUTORCH_SOURCE_DIR": str(ws.executorch_dir),
                "DK_OPS_YAML": defs["DK_OPS_YAML"],
                "DK_LINUX_THREADS": str(board.raw["linux"]["threads"]),
                "CMAKE_BUILD_TYPE": "Release",
            },
            toolchain_file(),
            progress=progress,
            compiler="aarch64-linux-gnu-g++",
        )
        elf, map_file = build_dir / "dk_runner.elf", build_dir / "dk_runner.map"
        if not elf.exists():
            raise BuildError(
                f"The build finished but {elf} is missing.",
                "Check firmware/linux_aarch64/CMakeLists.txt.",
                log_path=str(result.log),
            )
        return Firmware(
            board.name,
            elf,
            map_file,
            size_report(map_file, elf),
            result.configure_seconds + runtime.seconds,
            result.build_seconds,
            result.log,
        )


def runtime_commits(ws: Workspace) -> dict[str, str]:
    """The commits of the sources the runtime is built from: part of its cache key."""
    return {
        "executorch": ws.executorch_commit,
        **{p: ws.projects[p].commit for p in RUNTIME_PROJECTS},
    }
