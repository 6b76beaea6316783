"""The cached ExecuTorch runtime of Cortex-A Linux boards: ExecuTorch's own CMake project,
cross-compiled with the aarch64 Linux toolchain for one board's CPU flags, with the XNNPACK
delegate and the portable kernels, installed into a directory of the workspace's runtime
cache. One directory per key (sources, compiler, CPU flags, options): every board and model
with the same key shares it, and only the first build compiles XNNPACK (docs/rpi5.md)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploykit.build.cmake import _run_logged
from deploykit.readers.boards import repo_root
from deploykit.readers.doctor import require_tools
from deploykit.util.fsutil import write_atomic
from deploykit.util.locks import file_lock
from deploykit.util.process import tool_version
from deploykit.util.version import deploykit_version

# ExecuTorch options of the runtime: the XNNPACK delegate (without Arm's KleidiAI kernels, which
# XNNPACK would download at configure time), the file data loader, and nothing else (no
# module/tensor extensions, no pybindings, no tests). The portable kernels are not built here:
# the runner compiles only the operators its model leaves outside XNNPACK
# (firmware/linux_aarch64). XNNPACK's fp16/bf16 kernels serve no flow of this family (fp32 and
# int8 graphs), and neither the Cortex-A76 nor the Cortex-A72 has I8MM or SME: leaving those
# kernels out is about a quarter of XNNPACK's compile time.
RUNTIME_OPTIONS: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "EXECUTORCH_BUILD_XNNPACK": "ON",
    "EXECUTORCH_XNNPACK_ENABLE_KLEIDI": "OFF",
    "XNNPACK_ENABLE_ARM_FP16_VECTOR": "OFF",
    "XNNPACK_ENABLE_ARM_FP16_SCALAR": "OFF",
    "XNNPACK_ENABLE_ARM_BF16": "OFF",
    "XNNPACK_ENABLE_ARM_I8MM": "OFF",
    "XNNPACK_ENABLE_ARM_SME": "OFF",
    "XNNPACK_ENABLE_ARM_SME2": "OFF",
    "EXECUTORCH_BUILD_PORTABLE_OPS": "OFF",
    "EXECUTORCH_BUILD_EXTENSION_DATA_LOADER": "ON",
    "EXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR": "OFF",
    "EXECUTORCH_BUILD_EXTENSION_MODULE": "OFF",
    "EXECUTORCH_BUILD_EXTENSION_TENSOR": "OFF",
    "EXECUTORCH_BUILD_EXECUTOR_RUNNER": "OFF",
    "EXECUTORCH_BUILD_KERNELS_OPTIMIZED": "OFF",
    "EXECUTORCH_BUILD_KERNELS_QUANTIZED": "OFF",
    "EXECUTORCH_BUILD_DEVTOOLS": "OFF",
    "EXECUTORCH_BUILD_TESTS": "OFF",
    "EXECUTORCH_ENABLE_LOGGING": "ON",
    "EXECUTORCH_BUILD_PTHREADPOOL": "ON",
    "EXECUTORCH_BUILD_CPUINFO": "ON",
}
# Compile flags beside the board's CPU flags. With +fp16 in -march, XNNPACK's math.h takes
# _Float16 for its half type, which GCC 12 (Debian's cross compiler) has in C but not in C++:
# XNNPACK's own portable half type is used in both languages instead (same size and layout).
EXTRA_FLAGS = ("-DXNN_HAVE_FLOAT16=0",)


@dataclass(frozen=True)
class LinuxRuntime:
    """An installed runtime: `prefix` holds lib/ (static libraries), include/ and the CMake
    package files ExecuTorch installs (lib/cmake/ExecuTorch)."""

    directory: Path
    key: str
    prefix: Path
    cached: bool  # True: it was already built
    seconds: float  # configure + build + install time of this call

    @property
    def package_dir(self) -> Path:
        return self.prefix / "lib" / "cmake" / "ExecuTorch"


def toolchain_file() -> Path:
    return repo_root() / "cmake" / "aarch64-linux-gnu.cmake"


def _compiler_version(prefix: str) -> str:
    return tool_version([f"{prefix}g++", "--version"], "the aarch64 runtime's cache key")


def _project_hash() -> str:
    """This module decides how the runtime is configured and built: another deploykit's may
    build the same inputs otherwise."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def runtime_key(
    cpu_flags: list[str],
    source_commits: dict[str, str],
    toolchain_prefix: str = "aarch64-linux-gnu-",
) -> tuple[str, str]:
    """The key of a runtime build and the text it hashes: one `name=value` line per input."""
    tc = hashlib.sha256(toolchain_file().read_bytes()).hexdigest()
    lines = [
        f"deploykit={deploykit_version()} {_project_hash()}",
        f"cpu_flags={' '.join(cpu_flags)}",
        f"compiler={toolchain_prefix} {_compiler_version(toolchain_prefix)}",
        f"toolchain={tc}",
        *(f"source:{k}={v}" for k, v in sorted(source_commits.items())),
        *(f"option:{k}={v}" for k, v in sorted(RUNTIME_OPTIONS.items())),
        f"extra_flags={' '.join(EXTRA_FLAGS)}",
    ]
    text = "\n".join(lines) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()[:16], text


def build_runtime(
    executorch_dir: Path,
    cache_dir: Path,
    cpu_flags: list[str],
    source_commits: dict[str, str],
    *,
    jobs: int = 2,
    progress: Callable[[str], None] | None = None,
) -> LinuxRuntime:
    """Configure, build and install the runtime for `cpu_flags` once; later calls with the
    same key return the installed one."""
    key, text = runtime_key(cpu_flags, source_commits)
    directory = cache_dir / f"linux-aarch64-{key}"
    prefix = directory / "install"
    done = directory / "dk-runtime-installed.json"
    if done.exists():
        return LinuxRuntime(directory, key, prefix, True, 0.0)
    require_tools("cmake", "ninja", "aarch64-linux-gnu-g++")
    # Two builds of one key (two boards with the same CPU flags, `matrix -j 2`) would configure
    # and compile into one directory at once: the second waits, then finds it installed.
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / ".dk-build.lock", str(directory),
                   progress or (lambda _message: None)):
        if done.exists():
            return LinuxRuntime(directory, key, prefix, True, 0.0)
        return _build_runtime(executorch_dir, directory, key, text, cpu_flags, jobs, progress)


def _build_runtime(executorch_dir: Path, directory: Path, key: str, text: str,
                   cpu_flags: list[str], jobs: int,
                   progress: Callable[[str], None] | None) -> LinuxRuntime:
    """Configure, build and install into `directory` (its lock held)."""
    prefix = directory / "install"
    done = directory / "dk-runtime-installed.json"
    build = directory / "build"
    # The key hashes the toolchain file's content, not its path: every checkout of deploykit
    # with the same file shares this directory. CMake records the toolchain file's path in the
    # build directory (CMakeCache.txt, CMakeFiles/<version>/CMakeSystem.cmake, build.ninja's
    # re-run rule), so the directory is configured from a copy of its own, never from the
    # checkout that came first. An unfinished build configured from elsewhere (an older
    # deploykit's, from its checkout) starts over.
    toolchain = directory / "toolchain" / toolchain_file().name
    cache_file = build / "CMakeCache.txt"
    if cache_file.exists() and (
        f"CMAKE_TOOLCHAIN_FILE:FILEPATH={toolchain}\n" not in cache_file.read_text()
    ):
        shutil.rmtree(build)
    build.mkdir(parents=True, exist_ok=True)
    toolchain.parent.mkdir(exist_ok=True)
    shutil.copyfile(toolchain_file(), toolchain)
    (directory / "dk-runtime-key.txt").write_text(text)
    log = directory / "build.log"
    log.write_text("")
    # CMAKE_<LANG>_FLAGS given here replace the toolchain file's seed: the CPU flags again.
    flags = " ".join((*cpu_flags, *EXTRA_FLAGS))
    defs = {
        **RUNTIME_OPTIONS,
        "CMAKE_TOOLCHAIN_FILE": str(toolchain),
        "DK_CPU_FLAGS": ";".join(cpu_flags),
        "CMAKE_INSTALL_PREFIX": str(prefix),
        "CMAKE_C_FLAGS": flags,
        "CMAKE_CXX_FLAGS": flags,
    }
    t0 = time.monotonic()
    if progress:
        progress(
            f"configuring the aarch64 ExecuTorch + XNNPACK runtime in {directory} "
            "(once per CPU flags; the first build takes a while)"
        )
    _run_logged(
        [
            "cmake",
            "-S",
            str(executorch_dir),
            "-B",
            str(build),
            "-G",
            "Ninja",
            *(f"-D{k}={v}" for k, v in sorted(defs.items())),
        ],
        log,
        "ExecuTorch runtime configure",
        progress,
    )
    _run_logged(
        ["cmake", "--build", str(build), "-j", str(jobs)],
        log,
        "building the aarch64 ExecuTorch runtime",
        progress,
    )
    _run_logged(["cmake", "--install", str(build)], log, "installing the runtime", None)
    seconds = time.monotonic() - t0
    write_atomic(done, json.dumps({"key": key, "seconds": round(seconds, 1)}) + "\n")
    return LinuxRuntime(directory, key, prefix, False, seconds)
