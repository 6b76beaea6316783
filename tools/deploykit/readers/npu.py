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

from deploykit.util.errors import ConfigError

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
    ns_base: int | None = None  # the non-secure alias of `base`
    secure_enable: bool | None = None  # ethosu_init's; None: the firmware's security state
    privilege_enable: bool = True
    # Vela system configurations (vela.ini: NPU clock, the memories' speeds) that describe
    # this board; `system_config` first. `deploykit npu-sweep` compares them.
    system_configs: tuple[str, ...] = ()

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
    system_config = vela["system_config"]
    system_configs = tuple(dict.fromkeys((system_config, *(vela.get("system_configs") or ()))))
    memory = board.get("memory") if isinstance(board, dict) else getattr(board, "raw", {}).get(
        "memory")
    names = {r["name"] for r in memory or []}
    for port in ("sram", "ext"):
        if names and raw["axi"][port] not in names:
            raise ConfigError(f"board {_name(board)}: npu.axi.{port} names region "
                              f"'{raw['axi'][port]}', which is not in memory.",
                              f"Regions: {', '.join(sorted(names))}.")
    return NpuConfig(type=npu_type, macs=macs, base=int(raw["base"]), irq=int(raw["irq"]),
                     system_config=system_config, memory_mode=mode, memory_modes=modes,
                     system_configs=system_configs,
                     sram_region=raw["axi"]["sram"], ext_region=raw["axi"]["ext"],
                     ns_base=int(raw["ns_base"]) if "ns_base" in raw else None,
                     secure_enable=raw.get("secure_enable"),
                     privilege_enable=bool(raw.get("privilege_enable", True)))


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
    current = board.npu
    if current is None:
        given = "--npu-macs" if macs is not None else "--npu-memory-mode"
        raise ConfigError(f"{given} was given, but board {_name(board)} has no NPU.",
                          "Use a board with an `npu:` section (corstone-300, corstone-320).")
    raw = copy.deepcopy(board.raw)
    npu = current
    if macs is not None:
        raw["npu"]["macs"] = check_macs(current.type, int(macs))
        npu = dataclasses.replace(npu, macs=raw["npu"]["macs"])
    if memory_mode is not None:
        check_memory_mode(current.type, memory_mode)
        if memory_mode not in current.memory_modes:
            raise ConfigError(
                f"--npu-memory-mode {memory_mode} is not one of board {_name(board)}'s "
                "memory modes.",
                f"This board allows: {', '.join(current.memory_modes)} (npu.vela.memory_modes "
                "in its board file).")
        raw["npu"]["vela"]["memory_mode"] = memory_mode
        npu = dataclasses.replace(npu, memory_mode=memory_mode)
    return dataclasses.replace(board, raw=raw, npu=npu)


def _name(board: Any) -> str:
    return board.get("name", "?") if isinstance(board, dict) else getattr(board, "name", "?")


# ---- the NPU firmware (ethos_u_int8 on a board with an `npu:` section) -----------------------
#
# What the firmware build needs beyond the CPU-only runner, each from one place:
#   - board facts -> board_config.h and irq_vectors.h (render_board_files, npu_board_facts):
#     the NPU's base address in the firmware's security state, its IRQ (whose vector slot gets
#     the driver's handler), ethosu_init's secure_enable/privilege_enable;
#   - the plan's placement -> memory.ld (render_board_files(plan=...), npu_placement): the model,
#     the scratch (the temp pool EthosUBackend allocates it from) and the fast arena in the
#     regions the Vela memory mode needs, and their sizes -> model_config.h (npu_plan_sizes);
#   - sources and options -> CMake (npu_firmware_definitions).

# The backend id ExecuTorch gives an Ethos-U delegate in a .pte.
ETHOS_U_BACKEND = "EthosUBackend"

NPU_SCRATCH_ITEM = "Ethos-U scratch"  # plan item names (plan._npu_items)
NPU_FAST_ITEM = "Ethos-U fast scratch"


def npu_board_facts(board: Any) -> dict[str, Any] | None:
    """The NPU facts the generated board files carry, or None without an `npu:` section.

    The base address is the alias of the firmware's security state (`cpu.security`, default
    secure; the MPS family's start-up runs secure). secure_enable defaults to that state too."""
    npu = board.npu
    if npu is None:
        return None
    cpu = board.get("cpu", {}) if isinstance(board, dict) else getattr(board, "cpu", {})
    security = cpu.get("security", "secure")
    if security == "secure":
        base = npu.base
    elif npu.ns_base is not None:
        base = npu.ns_base
    else:
        raise ConfigError(f"board {_name(board)}: cpu.security is non-secure but npu has no "
                          "ns_base.", "Add npu.ns_base (the NPU's non-secure alias).")
    secure = npu.secure_enable if npu.secure_enable is not None else security == "secure"
    return {"type": npu.type, "macs": npu.macs, "target": npu.target, "base": base,
            "irq": npu.irq, "security": security, "secure_enable": bool(secure),
            "privilege_enable": npu.privilege_enable}


def npu_placement(plan: Any) -> dict[str, str]:
    """Where the plan put the NPU's items: {"model", "npu_scratch", "npu_fast"} -> region, for
    the generated memory.ld (REGION_ALIAS DK_MODEL, DK_NPU_SCRATCH, DK_NPU_FAST). Empty for a
    plan without Ethos-U delegates. The plan decided (plan._npu_items, from the memory mode and
    the board's npu.axi map); this only reads it."""
    items = [i for i in plan.items if i.kind == "npu_scratch"]
    if not items:
        return {}
    placement = {"model": next(i.region for i in plan.items if i.kind == "model")}
    for item in items:
        key = "npu_fast" if item.name.startswith(NPU_FAST_ITEM) else "npu_scratch"
        placement[key] = item.region
    placement.setdefault("npu_fast", placement["npu_scratch"])
    return placement


def npu_plan_sizes(plan: Any) -> tuple[int, int]:
    """(Vela scratch, fast arena) bytes of the plan; (0, 0) without Ethos-U delegates."""
    scratch = fast = 0
    for item in plan.items:
        if item.kind != "npu_scratch":
            continue
        if item.name.startswith(NPU_FAST_ITEM):
            fast = item.size
        else:
            scratch = item.size
    return scratch, fast


def npu_firmware_definitions(board: Any, workspace: Any, plan: Any) -> dict[str, str]:
    """The CMake definitions of an NPU firmware build, {} when there is nothing to add.

    NPU parts are built when the board has an `npu:` section and the plan has Ethos-U
    delegates (an ethos_u_int8 export); then the workspace must hold the Ethos-U core driver
    (Arm's repository or the Zephyr module, `deploykit setup --source
    ethos-u-core-driver=PATH@REV`) and CMSIS_6, else EnvironmentProblem says how to add them.

    DK_ETHOS_U=ON, DK_ETHOS_U_DRIVER_DIR, DK_CMSIS_DIR, DK_ETHOS_U_NPU_CONFIG (the driver's
    ETHOSU_TARGET_NPU_CONFIG, e.g. ethos-u85-256: the board's npu type and MACs, overrides
    applied) and DK_ETHOS_U_DRIVER_COMMIT (part of the runtime cache key)."""
    from deploykit.readers.sources import CMSIS, ETHOS_U_DRIVER, require_projects

    npu = board.npu
    if npu is None or not npu_placement(plan):
        return {}
    require_projects(workspace, [ETHOS_U_DRIVER, CMSIS],
                     f"The firmware for the {npu.target} NPU of {_name(board)}")
    return {
        "DK_ETHOS_U": "ON",
        "DK_ETHOS_U_DRIVER_DIR": str(workspace.path_of(ETHOS_U_DRIVER)),
        "DK_CMSIS_DIR": str(workspace.path_of(CMSIS)),
        "DK_ETHOS_U_NPU_CONFIG": npu.target,
        "DK_ETHOS_U_DRIVER_COMMIT": workspace.projects[ETHOS_U_DRIVER].commit,
    }
