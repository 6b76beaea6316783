"""Build profiles: one typed object that says how a model is exported, compiled, linked and
given memory (docs/profiles.md).

    reference   what upstream's Raspberry Pi Pico 2 example builds, to compare against
    size        the default: every lever that keeps the results identical
    speed       size, plus optimised kernels and int8 model I/O where the model allows it

A board file may name its default (`profile: size`); `--profile` overrides it. Everything a
profile decides lives here, in :data:`PROFILES`, and nowhere else: the export options
(:meth:`BuildProfile.export_options`), the board as compiled (the float ABI,
:meth:`BuildProfile.board_for`), the CMake cache of the firmware build
(:meth:`BuildProfile.cmake_definitions`; cmake/ExecuTorchRuntime.cmake has no defaults of its
own and puts every runtime-relevant one into the runtime cache key) and the memory policy.

    deploykit profiles                      the table of profiles
    deploykit profiles --cmake size         the -D options of one profile, for a hand-run cmake
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from deploykit.flows.base import ExportOptions
from deploykit.util.errors import ConfigError

if TYPE_CHECKING:
    from deploykit.families.base import BoardFamily
    from deploykit.program.inspect import ProgramInfo
    from deploykit.readers.boards import Board

DEFAULT_PROFILE = "size"
KIB = 1024


@dataclass(frozen=True)
class BuildProfile:
    name: str
    summary: str
    # ---- compile and link ----
    build_type: str  # CMAKE_BUILD_TYPE of the firmware and of the ExecuTorch runtime core
    kernel_opt: str  # "" (the build type's level) or e.g. "-O2": portable + cortex_m kernels
    cmsis_nn_opt: str  # "" (CMSIS-NN's own -Ofast) or e.g. "-Os"
    logging: bool  # ET_LOG compiled in (EXECUTORCH_ENABLE_LOGGING)
    pic: bool  # runtime libraries position-independent (ExecuTorch's own default)
    lto: bool  # -flto -ffat-lto-objects for runtime and model code, -flto at the link
    soft_float: bool  # soft-float ABI, FPU unused (only on cores whose FPU is scalar-only)
    exact_kernel_registry: bool  # MAX_KERNEL_NUM = kernels registered (else ExecuTorch's 2000)
    model_prim_ops: bool  # register only the primitive operators the model calls
    lean_libc: bool  # no newlib printf/malloc/atexit/abort: deploykit's minimal ones
    # ---- export ----
    fold_constants: bool  # constant_prop_pass (folds the weight transposes of fp32 Linear)
    int8_io: bool  # int8 model inputs/outputs where the graph starts/ends with (de)quantize
    plan_inputs: bool  # inputs in the planned buffers (copied in), or read in place
    # ---- memory ----
    memory: Literal["fixed", "fit"]  # fixed pools below, or measured (exact) pools and stack
    fixed_method_pool: int = 0
    fixed_planned_pool: int = 0  # the first planned buffer is padded to this
    fixed_temp_pool: int = 0
    # ---- export, from the command line (--strict), not a profile's own choice ----
    strict: bool = False  # int8: no operator kept in float (flows/mixed_precision.py)
    # ---- export, from the command line (--patches) or the board file ----
    patches: str = "off"  # the first stage in tiles: "off", "auto", "NxM" (flows/patches.py)

    def export_options(self) -> ExportOptions:
        return ExportOptions(fold_constants=self.fold_constants, int8_io=self.int8_io,
                             plan_inputs=self.plan_inputs, strict=self.strict,
                             patches=self.patches)

    def board_for(self, board: Board) -> Board:
        """The board as this profile compiles for it: with `soft_float`, the board's CPU flags
        with the FPU switched off (derived from its cpu data: `-mcpu=X+nofp`,
        `-mfloat-abi=soft`, no `-mfpu`, no `+fp` in `-march`). Cores with MVE keep their
        flags: soft float would switch MVE off too and change the int8 kernels (and the
        int8 export, which lays constants out for MVE)."""
        if not self.soft_float or board.cpu.get("mve") or board.cpu.get("float_abi") == "soft":
            return board
        cpu = dict(board.cpu)
        cpu["gcc_flags"] = soft_float_flags(board.cpu["gcc_flags"])
        cpu["float_abi"] = "soft"
        cpu.pop("fpu", None)
        return dataclasses.replace(board, cpu=cpu)

    def uses_soft_float(self, board: Board) -> bool:
        return self.board_for(board).cpu.get("float_abi") == "soft"

    def cmake_definitions(self, family: BoardFamily | None = None) -> dict[str, str]:
        """The firmware build's CMake cache entries for this profile (all of them: the CMake
        side has no defaults). ExecuTorchRuntime.cmake keys the cached runtime on every one
        that changes the runtime's objects.

        `family`: the family of the board built for (None: any). A family that cannot link
        with LTO (`supports_lto`) gets DK_LTO=OFF, so that a proxy
        measurement of its boards (run/proxy.py) is built with the same options. On a board built
        through the pico-sdk the lean libc is linked too (firmware/runner/lean_libc.cpp leaves
        operator new/delete to the SDK)."""
        def on(flag: bool) -> str:
            return "ON" if flag else "OFF"

        lto = self.lto and (family is None or family.supports_lto)

        return {
            "DK_PROFILE": self.name,
            "CMAKE_BUILD_TYPE": self.build_type,
            "DK_ET_BUILD_TYPE": self.build_type,
            "DK_ET_KERNEL_OPT": self.kernel_opt,
            "DK_ET_CMSIS_NN_OPT": self.cmsis_nn_opt,
            "DK_ET_LOGGING": on(self.logging),
            "DK_ET_PIC": on(self.pic),
            "DK_LTO": on(lto),
            "DK_ET_EXACT_KERNEL_REGISTRY": on(self.exact_kernel_registry),
            "DK_ET_MODEL_PRIM_OPS": on(self.model_prim_ops),
            "DK_LEAN_LIBC": on(self.lean_libc),
        }

    def fixed_program(self, program: ProgramInfo) -> ProgramInfo:
        """For `memory: fixed`: the program as the plan should see it, its first planned
        buffer padded to the fixed activation pool (upstream hands the method one 200 KiB
        span)."""
        if self.memory != "fixed" or not program.planned_buffers:
            return program
        first, *rest = program.planned_buffers
        return dataclasses.replace(
            program, planned_buffers=(max(first, self.fixed_planned_pool), *rest))

    def describe(self) -> str:
        opt = self.kernel_opt or "as the build type"
        cmsis = self.cmsis_nn_opt or "its own -Ofast"
        mem = (f"fixed pools (method {self.fixed_method_pool // KIB} KiB, activations "
               f"{self.fixed_planned_pool // KIB} KiB, temp {self.fixed_temp_pool // KIB} KiB),"
               " the board's stack and heap" if self.memory == "fixed"
               else "exact pools (modelled from the .pte; --fit measures pools, stack and "
               "heap on the target and links them at peak + margin)")
        yes = {True: "on", False: "off"}
        return "\n".join([
            f"{self.name}: {self.summary}",
            f"  compile: {self.build_type}, kernels {opt}, CMSIS-NN {cmsis}, "
            f"logging {yes[self.logging]}, "
            f"PIC {yes[self.pic]}, LTO {yes[self.lto]}, "
            + ("soft float (FPU unused; MVE cores keep theirs)" if self.soft_float
               else "the board float ABI"),
            f"  link: {'exact' if self.exact_kernel_registry else 'default (2000)'} kernel "
            f"registry, {'model' if self.model_prim_ops else 'all'} primitive ops, "
            f"{'minimal libc (no printf/malloc)' if self.lean_libc else 'newlib-nano'}",
            f"  export: transposes {'folded' if self.fold_constants else 'at run time'}, "
            f"{'int8' if self.int8_io else 'float'} model I/O, inputs "
            f"{'copied into the planned buffers' if self.plan_inputs else 'read in place'}",
            f"  memory: {mem}",
        ])


PROFILES: dict[str, BuildProfile] = {p.name: p for p in (
    BuildProfile(
        name="reference",
        summary="upstream's Pico 2 example, to compare against",
        build_type="MinSizeRel", kernel_opt="", cmsis_nn_opt="",
        logging=True, pic=True, lto=False, soft_float=True,
        exact_kernel_registry=False, model_prim_ops=False, lean_libc=False,
        fold_constants=False, int8_io=False, plan_inputs=True,
        memory="fixed", fixed_method_pool=200 * KIB, fixed_planned_pool=200 * KIB,
        fixed_temp_pool=32 * KIB),
    BuildProfile(
        name="size",
        summary="smallest code and RAM with identical results (the default)",
        build_type="MinSizeRel", kernel_opt="", cmsis_nn_opt="-Os",
        logging=False, pic=False, lto=True, soft_float=False,
        exact_kernel_registry=True, model_prim_ops=True, lean_libc=True,
        fold_constants=True, int8_io=False, plan_inputs=False, memory="fit"),
    BuildProfile(
        name="speed",
        summary="size, plus -O2 kernels and int8 model I/O where the model allows it",
        build_type="MinSizeRel", kernel_opt="-O2", cmsis_nn_opt="",
        logging=False, pic=False, lto=True, soft_float=False,
        exact_kernel_registry=True, model_prim_ops=True, lean_libc=True,
        fold_constants=True, int8_io=True, plan_inputs=False, memory="fit"),
)}


def get_profile(name: str) -> BuildProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"Unknown build profile '{name}'.",
                          f"Profiles: {', '.join(PROFILES)} (docs/profiles.md).") from None


def resolve_profile(board: Board, name: str | None = None) -> BuildProfile:
    """`name` (the command line), else the board file's `profile:`, else the default."""
    return get_profile(name or board.raw.get("profile") or DEFAULT_PROFILE)


_MCPU = re.compile(r"^-mcpu=(.+)$")
_MARCH = re.compile(r"^-march=(.+)$")


def soft_float_flags(flags: list[str]) -> list[str]:
    """Board CPU flags -> the same CPU with the FPU off and the soft-float ABI."""
    out: list[str] = []
    for flag in flags:
        if flag.startswith("-mfpu="):
            continue
        if flag.startswith("-mfloat-abi="):
            flag = "-mfloat-abi=soft"
        elif m := _MCPU.match(flag):
            base, *ext = m.group(1).split("+")
            ext = [e for e in ext if not e.startswith("fp")]
            flag = "-mcpu=" + "+".join([base, *ext, *([] if "nofp" in ext else ["nofp"])])
        elif m := _MARCH.match(flag):
            base, *ext = m.group(1).split("+")
            flag = "-march=" + "+".join([base, *(e for e in ext if not e.startswith("fp"))])
        out.append(flag)
    if not any(f.startswith("-mfloat-abi=") for f in out):
        out.append("-mfloat-abi=soft")
    return out

