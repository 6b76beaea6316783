"""Activation memory planning for the CPU flows' ``to_executorch`` (ExportOptions.backend_config).

ExecuTorch's default planner (``greedy`` in ``exir/memory_planning.py``) packs the planned
tensors, largest first, into *shared objects* laid end to end; a smaller tensor goes into an
object whose other tensors it does not overlap in time, at offset 0 or above the ones it
does overlap. On a network whose tensor sizes shrink and grow (MobileNet's strided blocks)
the objects fragment: mobilenet_v1_025 is planned at 64,512 B where 55,296 B are live at
once at most (program/costs.py computes that lower bound from the ``.pte``).

``greedy_by_size`` is the planner TensorFlow Lite Micro uses ("greedy by size"): one arena,
tensors placed largest first, each at the lowest offset where it overlaps no tensor already
placed that is live at the same time. ``greedy_by_death`` places them the same way in the
order they die, which packs a patched stage's tiles (flows/patches.py) tighter. All run
through ExecuTorch's ``MemoryPlanningAlgorithmSuite``, which keeps the smallest plan; on a tie
it keeps the first (``greedy``'s), so a program that ExecuTorch already plans at its best is
byte-identical to before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deploykit.flows.in_place import InPlace, write_in_place

if TYPE_CHECKING:
    import torch
    from executorch.exir.memory_planning import MemoryAlgoResult
    from executorch.exir.tensor import TensorSpec
    from torch.export import ExportGraphSignature

@dataclass
class InPlacePlanning:
    """What in-place planning needs (the board CPU's ``cmsis_nn.Backend``), and what it made."""
    backend: Any
    made: list[InPlace] = field(default_factory=list)


# ExecuTorch's greedy puts a spec without a memory id into buffer 1 (0 is reserved for
# constants); so does this planner, so the two return plans of the same shape.
DEFAULT_MEM_ID = 1


def _overlap_in_time(a: TensorSpec, b: TensorSpec) -> bool:
    return not (a.lifetime[1] < b.lifetime[0] or a.lifetime[0] > b.lifetime[1])


def _lowest_free_offset(size: int, busy: list[tuple[int, int]]) -> int:
    """The lowest offset where [offset, offset + size) misses every (start, end) in busy."""
    offset = 0
    for start, end in sorted(busy):
        if start >= offset + size:
            break
        offset = max(offset, end)
    return offset


def _graph_order(graph_module: torch.fx.GraphModule) -> dict[int, int]:
    """id(spec) -> the position where the graph first names it: a tie-break that does not
    depend on set iteration order, so the plan (and the .pte) is reproducible."""
    from executorch.exir.memory_planning import get_node_tensor_specs

    order: dict[int, int] = {}
    for node in graph_module.graph.nodes:
        for spec in get_node_tensor_specs(node):
            order.setdefault(id(spec), len(order))
    return order


def greedy_by_size(
    alignment: int,
    specs: set[TensorSpec],
    graph_module: torch.fx.GraphModule,
    graph_signature: ExportGraphSignature,
    extra_padding: int = 0,
) -> MemoryAlgoResult:
    """Largest first, each tensor at the lowest offset free over its lifetime (one arena per
    memory id). In-place results share their base's place, as in ExecuTorch's greedy."""
    return _first_fit(alignment, specs, graph_module, extra_padding,
                      lambda s: (-s.allocated_memory, s.lifetime[0], s.lifetime[1]))


def greedy_by_death(
    alignment: int,
    specs: set[TensorSpec],
    graph_module: torch.fx.GraphModule,
    graph_signature: ExportGraphSignature,
    extra_padding: int = 0,
) -> MemoryAlgoResult:
    """In the order the tensors die (the largest first among those that die together), each
    at the lowest offset free over its lifetime. A patched stage's many short-lived tiles
    then fill the bottom of the arena one after the other, and what outlives them (the tiles'
    outputs, held until they are joined) goes above; largest first scatters those outputs
    between tiles of the same size and leaves holes (mobilenet_v1_025 in 1x4 tiles: 31,200 B
    by size, 26,496 B by death, 23,040 B live at most)."""
    return _first_fit(alignment, specs, graph_module, extra_padding,
                      lambda s: (s.lifetime[1], -s.allocated_memory))


def _first_fit(alignment: int, specs: set[TensorSpec], graph_module: torch.fx.GraphModule,
               extra_padding: int, rank: Any) -> MemoryAlgoResult:
    from executorch.exir.memory_planning import (
        AllocationSpec,
        MemoryAlgoResult,
        SharedObject,
        SpecAllocResult,
        _compute_total_sizes,
        _resolve_inplace_specs,
    )

    result = MemoryAlgoResult({}, [])
    order = _graph_order(graph_module)
    for spec in specs:
        spec.realign(alignment)
    ranked = sorted(specs, key=lambda s: (*rank(s), order.get(id(s), len(order))))
    arenas: dict[int, SharedObject] = {}
    spec2obj: dict[TensorSpec, SharedObject] = {}
    deferred_inplace: list[TensorSpec] = []
    for spec in ranked:
        mem_id = DEFAULT_MEM_ID if spec.mem_id is None else spec.mem_id
        result.spec_dict[spec] = SpecAllocResult(mem_id, 0, 0)
        if spec.inplace_base is not None:
            deferred_inplace.append(spec)
            continue
        arena = arenas.get(mem_id)
        if arena is None:
            arena = arenas[mem_id] = SharedObject(0, -1, 0, spec.lifetime[0], spec.lifetime[1])
        busy = [(a.offset, a.offset + a.spec.allocated_memory) for a in arena.allocations
                if _overlap_in_time(a.spec, spec)]
        offset = _lowest_free_offset(spec.allocated_memory, busy)
        arena.allocations.append(AllocationSpec(offset, spec))
        arena.size = max(arena.size, offset + spec.allocated_memory)
        arena.first_used_index = min(arena.first_used_index, spec.lifetime[0])
        arena.last_used_index = max(arena.last_used_index, spec.lifetime[1])
        spec2obj[spec] = arena
    _resolve_inplace_specs(deferred_inplace, spec2obj, result)
    result.bufsizes = _compute_total_sizes({m: [a] for m, a in arenas.items()}, graph_module,
                                           extra_padding, result, len(spec2obj))
    return result


# The out-variant copies whose kernels in deploykit's firmware copy in memory order
# (firmware/kernels/op_memory_order_copy.cpp): any dim order, as long as input and output share it.
_MEMORY_ORDER_COPIES = ("aten::slice_copy.Tensor_out", "aten::cat.out")


def copies_keep_dim_order(graph_module: Any) -> int:
    """Give each slice and join of `graph_module` (after ToOutVarPass, before memory planning:
    the tensor specs the emitter writes) its input's dim order; returns how many changed.

    PyTorch gives a slice of a channels-last map that is not dense (a run of columns) and a
    join of such slices contiguous strides, so the program would ask for a layout change the
    copy kernels do not make (they check that input and output share a dim order). The specs
    are set here and not in the graph's values because every pass of to_executorch retraces
    those (SpecPropPass). Only for firmware with deploykit's kernels: ExecuTorch's portable
    slice and cat would copy a channels-last tensor in the logical order, which is wrong."""
    from executorch.exir.tensor import stride_from_dim_order

    changed = 0
    for node in graph_module.graph.nodes:
        name = getattr(node.target, "name", None)  # an OpOverload's "namespace::op.overload"
        if node.op != "call_function" or not callable(name) or name() not in _MEMORY_ORDER_COPIES:
            continue
        first = node.args[0][0] if isinstance(node.args[0], (list, tuple)) else node.args[0]
        want = tuple(first.meta["spec"].dim_order)
        specs = {id(s): s for s in (node.meta.get("spec"), node.kwargs["out"].meta.get("spec"))
                 if s is not None}
        for spec in specs.values():
            if tuple(spec.dim_order) == want:
                continue
            spec.dim_order = want
            spec.stride = tuple(stride_from_dim_order(list(spec.shape), list(want)))
            changed += 1
    return changed


def memory_planning_pass(alloc_graph_input: bool, copies_in_memory_order: bool = False,
                         in_place: InPlacePlanning | None = None) -> Any:
    """ExecuTorch's MemoryPlanningPass with the smallest of its greedy plan, greedy_by_size and
    greedy_by_death;
    with `copies_in_memory_order`, slices and joins first take their input's dim order
    (:func:`copies_keep_dim_order`); with `in_place`, the layers flows/in_place.py finds write
    over their inputs (and `in_place.made` lists them after the pass)."""
    from executorch.exir.memory_planning import MemoryPlanningAlgorithmSuite, greedy
    from executorch.exir.passes import MemoryPlanningPass

    class _Planning(MemoryPlanningPass):
        def run(self, graph_module: Any, graph_signature: Any = None) -> Any:
            if copies_in_memory_order:
                copies_keep_dim_order(graph_module)
            if in_place is not None:
                in_place.made = write_in_place(graph_module, in_place.backend,
                                               graph_signature)
            return super().run(graph_module, graph_signature)

    return _Planning(
        memory_planning_algo=MemoryPlanningAlgorithmSuite(
            algo_list=[greedy, greedy_by_size, greedy_by_death]),
        alloc_graph_input=alloc_graph_input)
