"""Plan stage: size every memory item a model needs and place it in the board's regions.

The numbers come from the `.pte` (constant data, planned buffers per memory id, CMSIS-NN scratch,
Vela scratch), from a model of ExecuTorch's `Method::load` (method and temp pools,
`program/method_memory.py`), from the board file (stack, heap, placement), and, once the model
has run, from measurements (`deploykit build --fit`, `memory/fit.py`), which then replace the
estimates and the board's stack and heap defaults. docs/memory.md gives the formulas and margins.

For a `.pte` with Ethos-U delegates on a board with an `npu:` section, the Vela memory mode the
delegates were compiled for decides where the `.pte` and the NPU's scratch arena go
(`deploykit.readers.npu.memory_mode_layout`: Shared_Sram puts the scratch in the SRAM behind
the NPU's AXI0 port, Dedicated_Sram_<N>KB puts it behind AXI1 plus N KB of fast scratch in
SRAM, Sram_Only puts the model in SRAM too); the scratch is the largest delegate's Vela
scratch, read from the `.pte`.

Every item is placed in a region; per region the plan gives used, available and headroom. When a
region overflows, `plan_memory` raises MemoryPlanError with the table and a concrete suggestion
naming the region, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from deploykit.program.inspect import ProgramInfo
from deploykit.readers.boards import PLACEMENT_KINDS, Board, parse_size
from deploykit.readers.npu import NpuConfig, memory_mode_layout
from deploykit.util.errors import ConfigError, MemoryPlanError

_POOL_ALIGN = 16

# Estimates (before a measurement): the model of Method::load is within a few bytes of the
# counting allocators on the models measured here (docs/memory.md); the margin, 1/16 + 64 B,
# covers what it does not model (a backend's own allocations, another runtime patch release).
ESTIMATE_FRACTION = 16  # margin = need // ESTIMATE_FRACTION + ESTIMATE_FIXED
ESTIMATE_FIXED = 64
# Coarse fallback for a ProgramInfo without the Method::load model: per value, per
# instruction, and fixed bytes (the pre-model formula, 4-5x over on the test models).
_METHOD_BYTES_PER_VALUE = 160
_METHOD_BYTES_PER_INSTRUCTION = 96
_METHOD_BYTES_FIXED = 2048
_COARSE_TEMP_POOL = 32 * 1024

SOURCES = {
    "pte": "read from the .pte",
    "estimate": "modelled from the .pte (program/method_memory.py) plus margin",
    "board": "board file default",
    "fit": "measured peak plus margin (deploykit build --fit)",
    "given": "given by the caller",
}


def align(n: int, to: int = _POOL_ALIGN) -> int:
    return (n + to - 1) // to * to


_align = align  # older name


def with_estimate_margin(need: int) -> int:
    """An estimate's size: the modelled need plus 1/16 plus 64 B, 16-byte aligned."""
    return align(need + need // ESTIMATE_FRACTION + ESTIMATE_FIXED) if need > 0 else 0


@dataclass(frozen=True)
class PlanItem:
    name: str
    kind: str  # a board placement kind: model, pools, stack, heap; or npu_scratch, info
    size: int
    source: str  # where the number comes from: pte, estimate, board, fit, given
    region: str | None = None  # set when not the board's placement of `kind` (NPU items)
    detail: str = ""  # how the number was found, in words

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
class Sizing:
    """Sizes that replace the estimates and board defaults: from a measurement on the target
    (memory/fit.py: peak + margin), or given (the generous pools of a measurement run)."""

    method_pool: int
    temp_pool: int
    stack: int | None = None  # None: the board file's
    heap: int | None = None
    source: str = "fit"  # "fit" or "given"
    peaks: dict[str, int] = field(default_factory=dict)  # measured high-water marks
    note: str = ""  # where the peaks were measured, when not on the board itself (a proxy)
    extra_stack: int = 0  # in `stack`: the board's own runtime's use beyond the proxy's peak


@dataclass(frozen=True)
class MemoryPlan:
    board: str
    items: tuple[PlanItem, ...]
    regions: tuple[RegionUse, ...]
    method_pool: int
    temp_pool: int
    planned_buffers: tuple[int, ...]
    notes: list[str] = field(default_factory=list)
    stack_size: int | None = None  # None: the board file's (render uses the board's then)
    heap_size: int | None = None
    estimates: dict[str, int] = field(default_factory=dict)  # method/temp before measurement
    peaks: dict[str, int] = field(default_factory=dict)  # measured, when sized from a fit
    pte: dict[str, Any] = field(default_factory=dict)  # path, size, sha256

    @property
    def fits(self) -> bool:
        return all(r.headroom >= 0 for r in self.regions)

    def item(self, name: str) -> PlanItem:
        return next(i for i in self.items if i.name == name)

    def table(self, items: bool = True) -> str:
        """Per item: region, bytes, source; per region: used, available, headroom."""
        lines = []
        if items:
            w = max([34, *(len(i.name) + 1 for i in self.items)])
            lines.append(f"  {'item':<{w}}{'region':<9}{'bytes':>11}  source")
            for i in self.items:
                size = f"{i.size:>11,}" if i.kind != "info" else f"{'-':>11}"
                lines.append(f"  {i.name:<{w}}{i.region or '-':<9}{size}  {i.source}"
                             + (f": {i.detail}" if i.detail else ""))
        lines.append(f"  {'region':<12}{'used':>12}{'available':>14}{'headroom':>14}")
        for r in self.regions:
            pct = f"{100 * r.used / r.capacity:5.1f}%" if r.capacity else ""
            lines.append(f"  {r.region:<12}{r.used:>12,}{r.capacity:>14,}{r.headroom:>14,}"
                         f"  {pct}" + ("  OVER" if r.headroom < 0 else ""))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"board": self.board, "fits": self.fits, "pte": self.pte,
                "method_pool": self.method_pool, "temp_pool": self.temp_pool,
                "planned_buffers": list(self.planned_buffers),
                "stack_size": self.stack_size, "heap_size": self.heap_size,
                "estimates": self.estimates, "measured_peaks": self.peaks,
                "items": [dataclasses.asdict(i) for i in self.items],
                "regions": [{**dataclasses.asdict(r), "headroom": r.headroom}
                            for r in self.regions],
                "notes": list(self.notes)}


def estimate_pools(program: ProgramInfo) -> tuple[int, int, str, str]:
    """(method pool, temp pool, how, how) before any measurement."""
    load = program.method_load
    if load is None:
        method = align(_METHOD_BYTES_FIXED + _METHOD_BYTES_PER_VALUE * program.num_values
                       + _METHOD_BYTES_PER_INSTRUCTION * program.num_instructions)
        return (method, _COARSE_TEMP_POOL, "coarse: 2 KiB + 160 B/value + 96 B/instruction",
                "coarse default")
    method = with_estimate_margin(load.method_bytes)
    how_method = (f"Method::load modelled {load.method_bytes:,} B ({program.num_values} values, "
                  f"{program.num_instructions} instructions) + 1/16 + 64 B")
    temp = with_estimate_margin(load.temp_bytes)
    how_temp = (f"operator metadata at load {load.temp_load_bytes:,} B"
                + (f", aten::topk queue {load.temp_kernel_bytes:,} B" if load.temp_kernel_bytes
                   else "") + " + 1/16 + 64 B")
    return method, temp, how_method, how_temp


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
    notes.append("ExecuTorch's EthosUBackend takes the Vela scratch from the temp allocator at "
                 "execute: the firmware's temp pool is the 'temp pool' item plus the 'Ethos-U "
                 "scratch' item, one block placed where the memory mode needs the scratch.")
    layout = memory_mode_layout(mode)
    scratch = max(d.scratch_size or 0 for d in vela)
    items = [PlanItem(f"Ethos-U scratch ({mode}, largest of {len(vela)} delegate"
                      f"{'s' if len(vela) > 1 else ''})", "npu_scratch", align(scratch),
                      "pte", npu.region_of(layout.scratch),
                      f"Vela scratch_size block, {scratch:,} B")]
    if layout.fast_scratch:
        items.append(PlanItem(f"Ethos-U fast scratch ({mode})", "npu_scratch",
                              layout.fast_scratch, "board", npu.sram_region,
                              "the memory mode's SRAM cache of the scratch"))
    return npu.region_of(layout.model), items, notes


def _npu_scratch_region(npu_items: list[PlanItem]) -> str | None:
    return next((i.region for i in npu_items if not i.name.startswith("Ethos-U fast")), None)


def _cmsis_item(program: ProgramInfo) -> PlanItem | None:
    load = program.method_load
    if load is None or not load.cmsis_scratch:
        return None
    uses = load.cmsis_scratch
    largest = max(uses, key=lambda u: u.nbytes)
    ids = sorted({u.memory_id for u in uses if u.memory_id is not None})
    where = (", ".join(f"planned buffer {i}" for i in ids) if ids else "not memory planned")
    return PlanItem("CMSIS-NN scratch", "info", 0, "pte", None,
                    f"already planned: inside {where} ({len(uses)} call"
                    f"{'s' if len(uses) > 1 else ''}, largest {largest.nbytes:,} B in "
                    f"{largest.op}); no pool of its own, not in the temp pool")


def plan_memory(board: Board, program: ProgramInfo, *, method_pool: int | None = None,
                temp_pool: int | None = None, npu: NpuConfig | None = None,
                sizing: Sizing | None = None) -> MemoryPlan:
    """Size and place every item; raise MemoryPlanError when a region overflows.

    `sizing` replaces the estimates (and, when it has them, the board's stack and heap) with
    measured or given sizes; `method_pool`/`temp_pool` override single pools ("given").
    `npu` defaults to the board's `npu:` section; it is used only when the program has
    Ethos-U delegates."""
    est_method, est_temp, how_method, how_temp = estimate_pools(program)
    # A board may set a floor under the estimates (min_pools): the 64-bit Linux boards, whose
    # pointers the model of Method::load (32-bit) undercounts and whose delegate (XNNPACK)
    # allocates from the method pool; there a pool in .bss costs only the pages it touches.
    floor = parse_size(board.raw.get("min_pools", 0)) if board.raw else 0
    if est_method < floor:
        est_method, how_method = floor, f"the board's min_pools (model: {how_method})"
    if est_temp < floor:
        est_temp, how_temp = floor, f"the board's min_pools (model: {how_temp})"
    method_src, method_how = "estimate", how_method
    temp_src, temp_how = "estimate", how_temp
    method, temp = est_method, est_temp
    stack, stack_src, stack_how = board.stack_size, "board", f"stack_size in {board.path.name}"
    heap, heap_src, heap_how = board.heap_size, "board", f"heap_size in {board.path.name}"
    peaks: dict[str, int] = {}
    if sizing is not None:
        peaks = dict(sizing.peaks)

        def how(name: str) -> str:
            if sizing.source != "fit":
                return "given"
            peak = peaks.get(name)
            where = f", {sizing.note}" if sizing.note else ""
            extra = (f" + {sizing.extra_stack:,} B for {board.name}'s own runtime"
                     if name == "stack" and sizing.extra_stack else "")
            return (f"peak {peak:,} B + margin{extra}{where}" if peak is not None
                    else "measured")

        method, method_src = sizing.method_pool, sizing.source
        method_how = how("method_pool") + f" (estimate was {est_method:,} B)"
        temp, temp_src = sizing.temp_pool, sizing.source
        temp_how = how("temp_pool") + f" (estimate was {est_temp:,} B)"
        if sizing.stack is not None:
            stack, stack_src = sizing.stack, sizing.source
            stack_how = how("stack") + f" (board file: {board.stack_size:,} B)"
        if sizing.heap is not None:
            heap, heap_src = sizing.heap, sizing.source
            heap_how = how("heap") + f" (board file: {board.heap_size:,} B)"
    if method_pool is not None:
        method, method_src, method_how = method_pool, "given", "given"
    if temp_pool is not None:
        temp, temp_src, temp_how = temp_pool, "given", "given"
    method, temp = align(method), align(temp)
    planned = tuple(align(s) for s in program.planned_buffers)
    model_region, npu_items, notes = _npu_items(board, program, npu or board.npu)
    constant = (f"the whole file, {program.constant_bytes:,} B of it weights and constants; "
                "read in place")
    items = [
        PlanItem("model (.pte constant data)", "model", program.size, "pte", model_region,
                 constant),
        *(PlanItem(f"planned buffer {i + 1}", "pools", s, "pte", None,
                   f"memory id {i + 1}: {program.planned_buffers[i]:,} B")
          for i, s in enumerate(planned)),
    ]
    cmsis = _cmsis_item(program)
    if cmsis is not None:
        items.append(cmsis)
    items += [
        *npu_items,
        PlanItem("method pool", "pools", method, method_src, None, method_how),
        # EthosUBackend allocates the Vela scratch from the temp allocator: the firmware puts
        # the temp pool beside the scratch (the same block, DK_NPU_SCRATCH in memory.ld).
        PlanItem("temp pool", "pools", temp, temp_src, _npu_scratch_region(npu_items),
                 temp_how),
        PlanItem("stack", "stack", stack, stack_src, None, stack_how),
        PlanItem("heap", "heap", heap, heap_src, None, heap_how),
    ]
    if program.method_load is not None:
        notes += list(program.method_load.notes)
    # Every item names its region, so the plan reads without the board. The CMSIS-NN scratch
    # is information only (it lies inside the planned buffers, in the pools region).
    items = [dataclasses.replace(i, region=board.placement["pools"] if planned else None)
             if i.kind == "info" else dataclasses.replace(i, region=i.region_in(board))
             for i in items]
    used: dict[str, int] = {}
    for item in items:
        if item.kind != "info":
            used[item.region] = used.get(item.region, 0) + item.size
    regions = tuple(RegionUse(r.name, r.size, used.get(r.name, 0)) for r in board.memory
                    if r.name in used)
    plan = MemoryPlan(
        board.name, tuple(items), regions, method, temp, planned, notes,
        stack_size=stack if stack_src != "board" else None,
        heap_size=heap if heap_src != "board" else None,
        estimates={"method_pool": est_method, "temp_pool": est_temp}, peaks=peaks,
        pte={"path": str(program.path), "size": program.size, "sha256": program.sha256})
    if not plan.fits:
        over = [r for r in plan.regions if r.headroom < 0]
        worst = over[0]
        biggest = max((i for i in plan.items if i.region == worst.region and i.kind != "info"),
                      key=lambda i: i.size)
        exc = MemoryPlanError(
            f"The model does not fit {board.name}: region '{worst.region}' needs "
            f"{worst.used:,} B but has {worst.capacity:,} B "
            f"({-worst.headroom:,} B over).\n{plan.table()}",
            _overflow_hint(board, plan, worst, biggest, program,
                           (npu or board.npu) if npu_items else None))
        exc.plan = plan  # type: ignore[attr-defined]  # for plan.json
        raise exc
    return plan


def _overflow_hint(board: Board, plan: MemoryPlan, worst: RegionUse, biggest: PlanItem,
                   program: ProgramInfo, npu: NpuConfig | None) -> str:
    hint = f"The largest item in '{worst.region}' is {biggest.name} ({biggest.size:,} B). "
    if npu is not None and biggest.kind in ("npu_scratch", "model"):
        where = "scratch" if biggest.kind == "npu_scratch" else "model"
        region = biggest.region
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
    hints = []
    # Move a placement kind to another region that holds it and has room for it.
    free = {r.region: r.headroom for r in plan.regions}
    for kind in PLACEMENT_KINDS:
        if board.placement.get(kind) != worst.region:
            continue
        need = sum(i.size for i in plan.items if i.kind == kind and i.region == worst.region)
        if need == 0:
            continue
        for r in board.memory:
            if r.name == worst.region or kind not in r.holds:
                continue
            room = free.get(r.name, r.size)
            if room >= need and need >= -worst.headroom:
                hints.append(f"move {kind} ({need:,} B) to region '{r.name}' ({room:,} B "
                             f"free): set placement.{kind}: {r.name} in {board.path}")
                break
    defaults = [i for i in plan.items if i.region == worst.region
                and i.source in ("board", "estimate")]
    if defaults:
        hints.append("size " + ", ".join(f"{i.name} ({i.size:,} B, {i.source})"
                                         for i in defaults)
                     + " from a measurement: deploykit build --fit (runs the model once on the "
                     "simulator and links pools and stack at peak + margin)")
    if any(op.startswith("aten::") for op in program.operators) and not any(
            op.startswith("cortex_m::") for op in program.operators):
        hints.append("export int8 (--flow cortex_m_int8): int8 weights and activations take "
                     "about a quarter of the fp32 bytes")
    hints.append(f"or give region '{worst.region}' more room in {board.path}")
    return hint + "To fit: " + "; ".join(hints) + "."


def _npu_macs_above(npu: NpuConfig) -> list[int]:
    from deploykit.readers.npu import NPU_MACS

    return [m for m in NPU_MACS[npu.type] if m > npu.macs]
