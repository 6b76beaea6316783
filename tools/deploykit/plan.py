"""Plan stage: size every memory item a model needs and place it in the board's regions.

The numbers come from the `.pte` (planned buffers, constant data, values, instructions) and
the board file (stack, heap, placement). The method allocator's need is not stored in the
`.pte`; until it is measured on the target it is estimated generously from the number of
values and instructions, and the estimate is labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .boards import Board
from .errors import MemoryPlanError
from .inspect_pte import ProgramInfo

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
    kind: str  # a board placement kind: model, pools, stack, heap
    size: int
    source: str  # where the number comes from: "pte", "estimate", "board", "measured"


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

    def table(self) -> str:
        lines = [f"{'region':<10}{'used':>12}{'capacity':>12}{'headroom':>12}"]
        for r in self.regions:
            lines.append(f"{r.region:<10}{r.used:>12,}{r.capacity:>12,}{r.headroom:>12,}")
        return "\n".join(lines)


def plan_memory(board: Board, program: ProgramInfo, *, method_pool: int | None = None,
                temp_pool: int | None = None) -> MemoryPlan:
    """Size and place every item; raise MemoryPlanError when a region overflows."""
    method_source = "measured" if method_pool is not None else "estimate"
    if method_pool is None:
        method_pool = (_METHOD_BYTES_FIXED + _METHOD_BYTES_PER_VALUE * program.num_values
                       + _METHOD_BYTES_PER_INSTRUCTION * program.num_instructions)
    temp_source = "measured" if temp_pool is not None else "estimate"
    if temp_pool is None:
        temp_pool = DEFAULT_TEMP_POOL
    method_pool, temp_pool = _align(method_pool), _align(temp_pool)
    planned = tuple(_align(s) for s in program.planned_buffers)
    items = (
        PlanItem("model (.pte)", "model", program.size, "pte"),
        PlanItem("method pool", "pools", method_pool, method_source),
        PlanItem("temp pool", "pools", temp_pool, temp_source),
        *(PlanItem(f"planned buffer {i + 1}", "pools", s, "pte") for i, s in enumerate(planned)),
        PlanItem("stack", "stack", board.stack_size, "board"),
        PlanItem("heap", "heap", board.heap_size, "board"),
    )
    used: dict[str, int] = {}
    for item in items:
        region = board.placement[item.kind]
        used[region] = used.get(region, 0) + item.size
    regions = tuple(RegionUse(r.name, r.size, used.get(r.name, 0)) for r in board.memory
                    if r.name in used)
    plan = MemoryPlan(board.name, items, regions, method_pool, temp_pool, planned)
    if not plan.fits:
        over = [r for r in plan.regions if r.headroom < 0]
        worst = over[0]
        biggest = max((i for i in items if board.placement[i.kind] == worst.region),
                      key=lambda i: i.size)
        raise MemoryPlanError(
            f"The model does not fit {board.name}: region '{worst.region}' needs "
            f"{worst.used:,} B but has {worst.capacity:,} B "
            f"({-worst.headroom:,} B over).\n{plan.table()}",
            f"The largest item there is {biggest.name} ({biggest.size:,} B). Place "
            f"'{biggest.kind}' in a larger region in the board file's placement, or make "
            "the model smaller (int8 export: --flow cortex_m_int8).")
    return plan
