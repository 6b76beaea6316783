"""The Ethos-U NPU of a board: its `npu:` section, the --npu-macs / --npu-memory-mode overrides,
and what a Vela memory mode implies for memory placement.

One `NpuConfig` feeds everything that needs an NPU fact: the Vela target string and options of
the export (`ethos-u85-256`, system config, memory mode), the memory plan (where the `.pte`, the
scratch arena and the fast scratch go) and the FVP command line (`...ethosu.num_macs`). An
override is applied to the board itself (`with_npu_overrides`), so the MAC count given to Vela
and the one given to the FVP are the same field and cannot disagree.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

# MAC configurations per NPU type (Vela's --accelerator-config and the FVPs' num_macs).
NPU_MACS: dict[str, tuple[int, ...]] = {
    "ethos-u55": (32, 64, 128, 256),
    "ethos-u85": (128, 256, 512, 1024, 2048),
}
DEFAULT_MACS = {"ethos-u55": 128, "ethos-u85": 256}
# Memory modes of Vela's Arm/vela.ini that each NPU type supports here. The U55 has no
# dedicated-SRAM (cache) mode; ExecuTorch's Corstone build accepts Shared_Sram and Sram_Only.
MEMORY_MODES: dict[str, tuple[str, ...]] = {
    "ethos-u55": ("Shared_Sram", "Sram_Only"),
    "ethos-u85": ("Shared_Sram", "Sram_Only", "Dedicated_Sram", "Dedicated_Sram_256KB",
                  "Dedicated_Sram_384KB", "Dedicated_Sram_512KB"),
}
# `Dedicated_Sram` without a size: the fast scratch ExecuTorch's Corstone runner reserves by
# default (ET_ARM_BAREMETAL_FAST_SCRATCH_TEMP_ALLOCATOR_POOL_SIZE = 0x60000).
DEFAULT_FAST_SCRATCH = 384 * 1024
_DEDICATED_RE = re.compile(r"^Dedicated_Sram(?:_(\d+)KB)?$")
_TARGET_RE = re.compile(r"^(ethos-u55|ethos-u85)-(\d+)$")


@dataclass(frozen=True)
class MemoryModeLayout:
    """Where a Vela memory mode puts things: "sram" (behind the NPU's AXI0 port) or "ext"
    (behind AXI1: DRAM or flash)."""

    mode: str
    model: str  # the .pte (its weights are read by the NPU in place)
    scratch: str  # the scratch arena (tensor arena) Vela plans
    fast_scratch: int  # bytes of SRAM the NPU uses as a cache of `scratch` (0: none)


def memory_mode_layout(mode: str) -> MemoryModeLayout:
    """Vela's Arm/vela.ini memory modes: Sram_Only puts constants and arena in SRAM (AXI0);
    Shared_Sram keeps constants on AXI1 and the arena in SRAM; Dedicated_Sram[_<N>KB] puts
    both on AXI1 and uses N KB of SRAM as the arena cache ("fast scratch")."""
    if mode == "Sram_Only":
        return MemoryModeLayout(mode, "sram", "sram", 0)
    if mode == "Shared_Sram":
        return MemoryModeLayout(mode, "ext", "sram", 0)
    m = _DEDICATED_RE.match(mode)
    if m:
        size = int(m.group(1)) * 1024 if m.group(1) else DEFAULT_FAST_SCRATCH
        return MemoryModeLayout(mode, "ext", "ext", size)
    raise ConfigError(f"Unknown Vela memory mode '{mode}'.",
                      "Use Sram_Only, Shared_Sram or Dedicated_Sram[_256KB|_384KB|_512KB].")


@dataclass(frozen=True)
class NpuConfig:
    """The resolved `npu:` section of a board (defaults and overrides applied)."""

    type: str  # "ethos-u55" | "ethos-u85"
    macs: int
    base: int
    irq: int
    system_config: str
    memory_mode: str
    memory_modes: tuple[str, ...]  # the modes this board allows (first: the board's default)
    sram_region: str  # memory region behind the NPU's AXI0 (SRAM) port
    ext_region: str  # memory region behind AXI1 (DRAM/flash)

    @property
    def target(self) -> str:
        """Vela's --accelerator-config and EthosUCompileSpec's target: `ethos-u85-256`."""
        return f"{self.type}-{self.macs}"

    @property
    def layout(self) -> MemoryModeLayout:
        return memory_mode_layout(self.memory_mode)

    def region_of(self, where: str) -> str:
        return self.sram_region if where == "sram" else self.ext_region

    def export_settings(self) -> dict[str, Any]:
        """What the export depends on (the export cache key includes it)."""
        return {"type": self.type, "macs": self.macs, "target": self.target,
                "system_config": self.system_config, "memory_mode": self.memory_mode}


def npu_section(board: Any) -> dict[str, Any] | None:
    raw = board.get("npu") if isinstance(board, dict) else getattr(board, "raw", {}).get("npu")
    return raw


def npu_config(board: Any) -> NpuConfig | None:
    """The board's NPU, or None when it has no `npu:` section."""
    raw = npu_section(board)
    if raw is None:
        return None
    npu_type = raw["type"]
    macs = int(raw.get("macs", DEFAULT_MACS[npu_type]))
    check_macs(npu_type, macs, where=f"board {_name(board)}: npu.macs")
    vela = raw["vela"]
    modes = tuple(vela.get("memory_modes") or (vela["memory_mode"],))
    mode = vela["memory_mode"]
    if mode not in modes:
        modes = (mode, *modes)
    for m in modes:
        check_memory_mode(npu_type, m, where=f"board {_name(board)}: npu.vela")
    memory = board.get("memory") if isinstance(board, dict) else getattr(board, "raw", {}).get(
        "memory")
    names = {r["name"] for r in memory or []}
    for port in ("sram", "ext"):
        if names and raw["axi"][port] not in names:
            raise ConfigError(f"board {_name(board)}: npu.axi.{port} names region "
                              f"'{raw['axi'][port]}', which is not in memory.",
                              f"Regions: {', '.join(sorted(names))}.")
    return NpuConfig(type=npu_type, macs=macs, base=int(raw["base"]), irq=int(raw["irq"]),
                     system_config=vela["system_config"], memory_mode=mode, memory_modes=modes,
                     sram_region=raw["axi"]["sram"], ext_region=raw["axi"]["ext"])


def check_macs(npu_type: str, macs: int, where: str = "--npu-macs") -> int:
    allowed = NPU_MACS.get(npu_type)
    if allowed is None:
        raise ConfigError(f"Unknown NPU type '{npu_type}'.",
                          f"Known types: {', '.join(NPU_MACS)}.")
    if isinstance(macs, bool) or macs not in allowed:
        raise ConfigError(f"{where} {macs} is not a MAC configuration of the {npu_type}.",
                          f"The {npu_type} comes with {', '.join(map(str, allowed))} MACs "
                          "per cycle.")
    return macs


def check_memory_mode(npu_type: str, mode: str, where: str = "--npu-memory-mode") -> str:
    memory_mode_layout(mode)  # known at all
    if mode not in MEMORY_MODES[npu_type]:
        raise ConfigError(f"{where}: memory mode {mode} is not supported by the {npu_type}.",
                          f"Use one of: {', '.join(MEMORY_MODES[npu_type])}.")
    return mode


def parse_target(target: str) -> tuple[str, int]:
    """`ethos-u85-256` -> ("ethos-u85", 256), validated."""
    m = _TARGET_RE.match(target.strip().lower())
    if not m:
        raise ConfigError(f"'{target}' is not an Ethos-U target.",
                          "Write it as ethos-u55-<macs> or ethos-u85-<macs>.")
    return m.group(1), check_macs(m.group(1), int(m.group(2)), where=target)


def with_npu_overrides(board: Any, macs: int | None = None,
                       memory_mode: str | None = None) -> Any:
    """A copy of `board` (a deploykit Board) whose `npu:` section carries the overrides.

    Everything downstream (export, plan, FVP) reads the NPU from the board, so an override
    changes Vela's target and the FVP's num_macs together. Without an NPU section, an override
    is refused.
    """
    if macs is None and memory_mode is None:
        return board
    current = npu_config(board)
    if current is None:
        given = "--npu-macs" if macs is not None else "--npu-memory-mode"
        raise ConfigError(f"{given} was given, but board {_name(board)} has no NPU.",
                          "Use a board with an `npu:` section (corstone-300, corstone-320).")
    raw = copy.deepcopy(board.raw)
    if macs is not None:
        raw["npu"]["macs"] = check_macs(current.type, int(macs))
    if memory_mode is not None:
        check_memory_mode(current.type, memory_mode)
        if memory_mode not in current.memory_modes:
            raise ConfigError(
                f"--npu-memory-mode {memory_mode} is not one of board {_name(board)}'s "
                "memory modes.",
                f"This board allows: {', '.join(current.memory_modes)} (npu.vela.memory_modes "
                "in its board file).")
        raw["npu"]["vela"]["memory_mode"] = memory_mode
    return dataclasses.replace(board, raw=raw)


def _name(board: Any) -> str:
    return board.get("name", "?") if isinstance(board, dict) else getattr(board, "name", "?")
