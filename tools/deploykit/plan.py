"""Plan stage: size every memory item a model needs and place it in the board's regions.

The numbers come from the `.pte` (planned buffers, constant data, values, instructions) and
the board file (stack, heap, placement). For a `.pte` with Ethos-U delegates on a board with an
`npu:` section, the Vela memory mode the delegates were compiled for decides where the `.pte` and
the NPU's scratch arena go (`deploykit.npu.memory_mode_layout`: Shared_Sram puts the scratch in
the SRAM behind the NPU's AXI0 port, Dedicated_Sram_<N>KB puts it behind AXI1 plus N KB of fast
scratch in SRAM, Sram_Only puts the model in SRAM too); the scratch is the largest delegate's
Vela scratch, read from the `.pte`. The method allocator's need is not stored in the
`.pte`; until it is measured on the target it is estimated generously from the number of
values and instructions, and the estimate is labelled as such.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .boards import Board
from .errors import ConfigError, MemoryPlanError
from .inspect_pte import ProgramInfo
from .npu import NpuConfig, memory_mode_layout, npu_config

# Estimate of the method allocator's need per value and per instruction, in bytes:
# an EValue plus a TensorImpl with its sizes/dim-order/strides arrays per value, and a
# kernel pointer plus argument list per instruction; the constant covers the Method object.
_METHOD_BYTES_PER_VALUE = 160
_METHOD_BYTES_PER_INSTRUCTION = 96
_METHOD_BYTES_FIXED = 2048
# CMSIS-NN and portable kernels ask the temp allocator for scratch; until measured,
# reserve this much.
DEFAULT_TEMP_POOL = 32 * 1024
_POOL_ALIGN = 16


def _align(n: int, to: int = _POOL_ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class PlanItem:
    name: str
    kind: str  # a board placement kind: model, pools, stack, heap; or npu_scratch
    size: int
    source: str  # where the number comes from: "pte", "estimate", "board", "measured"
    region: str | None = None  # set when not the board's placement of `kind` (NPU items)

    def region_in(self, board: Board) -> str:
        return self.region or board.placement[self.kind]


@dataclass(frozen=True)
class RegionUse:
    region: str
    capacity: int
    used: int

    @property
    def headroom(self) -> int:
        return self.capacity - self.used


@dataclass(frozen=True)
class MemoryPlan:
    board: str
    items: tuple[PlanItem, ...]
    regions: tuple[RegionUse, ...]
    method_pool: int
    temp_pool: int
    planned_buffers: tuple[int, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(r.headroom >= 0 for r in self.regions)

    def table(self, items: bool = False) -> str:
        """Per region: needed, available, headroom; with `items`, what is in each region."""
        lines = [f"{'region':<10}{'needed':>12}{'available':>12}{'headroom':>12}"]
        for r in self.regions:
            lines.append(f"{r.region:<10}{r.used:>12,}{r.capacity:>12,}{r.headroom:>12,}"
                         + ("   OVER" if r.headroom < 0 else ""))
            if items:
                lines += [f"    {i.name:<52}{i.size:>12,}  ({i.source})" for i in self.items
                          if i.region == r.region]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _npu_items(board: Board, program: ProgramInfo,
               npu: NpuConfig | None) -> tuple[str | None, list[PlanItem], list[str]]:
    """(region of the model, NPU plan items, notes) for a program with Ethos-U delegates."""
    vela = [d for d in program.delegates if d.vela is not None]
    if not vela:
        return None, [], []
    if npu is None:
        raise ConfigError(f"The .pte has Ethos-U delegates but board {board.name} has no NPU.",
                          "Export for this board (its default flow), or run it on an Ethos-U "
                          "board (corstone-300, corstone-320).")
    targets = {d.target for d in vela if d.target}
    if targets and targets != {npu.target}:
        raise ConfigError(
            f"The .pte was compiled by Vela for {', '.join(sorted(targets))}, but board "
            f"{board.name}'s NPU is {npu.target}; the NPU rejects a command stream built for "
            "another MAC configuration.",
            "Export again with the same --npu-macs as the build and run (the export cache "
            "keys on it), or drop the override.")
    modes = {d.memory_mode for d in vela if d.memory_mode}
    if len(modes) > 1:
        raise ConfigError(f"The .pte's delegates use different Vela memory modes: {modes}.",
                          "Export again: one memory mode per program.")
    mode = modes.pop() if modes else npu.memory_mode
    notes = []
    if mode != npu.memory_mode:
        notes.append(f"The .pte was compiled for memory mode {mode}; the board's is "
                     f"{npu.memory_mode}. Planned for {mode}.")
    layout = memory_mode_layout(mode)
    scratch = max(d.scratch_size or 0 for d in vela)
    items = [PlanItem(f"Ethos-U scratch ({mode}, largest of {len(vela)} delegate"
                      f"{'s' if len(vela) > 1 else ''})", "npu_scratch", _align(scratch),
                      "pte", npu.region_of(layout.scratch))]
    if layout.fast_scratch:
        items.append(PlanItem(f"Ethos-U fast scratch ({mode})", "npu_scratch",
                              layout.fast_scratch, "board", npu.sram_region))
    return npu.region_of(layout.model), items, notes


def plan_memory(board: Board, program: ProgramInfo, *, method_pool: int | None = None,
                temp_pool: int | None = None, npu: NpuConfig | None = None) -> MemoryPlan:
    """Size and place every item; raise MemoryPlanError when a region overflows.

    `npu` defaults to the board's `npu:` section; it is used only when the program has
    Ethos-U delegates."""
    method_source = "measured" if method_pool is not None else "estimate"
    if method_pool is None:
        method_pool = (_METHOD_BYTES_FIXED + _METHOD_BYTES_PER_VALUE * program.num_values
                       + _METHOD_BYTES_PER_INSTRUCTION * program.num_instructions)
    temp_source = "measured" if temp_pool is not None else "estimate"
    if temp_pool is None:
        temp_pool = DEFAULT_TEMP_POOL
    method_pool, temp_pool = _align(method_pool), _align(temp_pool)
    planned = tuple(_align(s) for s in program.planned_buffers)
    model_region, npu_items, notes = _npu_items(board, program, npu or npu_config(board))
    items = (
        PlanItem("model (.pte)", "model", program.size, "pte", model_region),
        PlanItem("method pool", "pools", method_pool, method_source),
        PlanItem("temp pool", "pools", temp_pool, temp_source),
        *(PlanItem(f"planned buffer {i + 1}", "pools", s, "pte") for i, s in enumerate(planned)),
        PlanItem("stack", "stack", board.stack_size, "board"),
        PlanItem("heap", "heap", board.heap_size, "board"),
        *npu_items,
    )
    # Every item names its region, so the plan reads without the board.
    items = tuple(dataclasses.replace(i, region=i.region_in(board)) for i in items)
    used: dict[str, int] = {}
    for item in items:
        region = item.region_in(board)
        used[region] = used.get(region, 0) + item.size
    regions = tuple(RegionUse(r.name, r.size, used.get(r.name, 0)) for r in board.memory
                    if r.name in used)
    plan = MemoryPlan(board.name, items, regions, method_pool, temp_pool, planned, notes)
    if not plan.fits:
        over = [r for r in plan.regions if r.headroom < 0]
        worst = over[0]
        biggest = max((i for i in items if i.region_in(board) == worst.region),
                      key=lambda i: i.size)
        raise MemoryPlanError(
            f"The model does not fit {board.name}: region '{worst.region}' needs "
            f"{worst.used:,} B but has {worst.capacity:,} B "
            f"({-worst.headroom:,} B over).\n{plan.table(items=True)}",
            _overflow_hint(board, biggest, (npu or npu_config(board)) if npu_items else None))
    return plan


def _overflow_hint(board: Board, biggest: PlanItem, npu: NpuConfig | None) -> str:
    hint = f"The largest item there is {biggest.name} ({biggest.size:,} B). "
    if npu is not None and biggest.kind in ("npu_scratch", "model"):
        where = "scratch" if biggest.kind == "npu_scratch" else "model"
        region = biggest.region_in(board)
        others = [m for m in npu.memory_modes
                  if npu.region_of(getattr(memory_mode_layout(m), where)) != region]
        if others:
            hint += (f"Another Vela memory mode puts the {where} elsewhere: "
                     + ", ".join(f"--npu-memory-mode {m}" for m in others) + ". ")
        larger = _npu_macs_above(npu)
        if larger and biggest.kind == "npu_scratch":
            hint += ("A larger MAC configuration changes Vela's schedule and may need less "
                     f"scratch: --npu-macs {larger[0]}. ")
        return hint + (f"Or give region '{region}' more room in the board file, or make the "
                       "model smaller.")
    return hint + (f"Place '{biggest.kind}' in a larger region in the board file's placement, "
                   "or make the model smaller (int8 export: --flow cortex_m_int8).")


def _npu_macs_above(npu: NpuConfig) -> list[int]:
    from .npu import NPU_MACS

    return [m for m in NPU_MACS[npu.type] if m > npu.macs]
