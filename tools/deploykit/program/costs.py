"""What a `.pte` costs, read from its instructions: multiply-accumulates, the activation-memory
lower bound, and the operators that fall back outside the flow's target kernels.

- **MACs.** Every convolution and linear/matmul kernel call: output elements x the products
  per output (weight elements / output channels; for a matmul, the shared dimension). Other
  operators (pools, adds, activations) are not counted: they are not multiply-accumulates.
  Delegates hide their operators; for an Ethos-U delegate, Vela's own count is added by the
  caller (program/inspect.py), from the export report.
- **Activation lower bound.** The largest sum of the planned tensors live at one instruction
  (from the first instruction that names a tensor to the last one), with scratch buffers.
  No memory plan can use less than this, so `planned / lower bound` measures the planner.
- **Fallbacks and islands.** The target kernels of an int8 program are the `cortex_m::` ones
  (CMSIS-NN, and the quantize/dequantize ops), deploykit's own int8 operators (`deploykit::`,
  such as its int8 LayerNorm: flows/deploykit_ops.py) and delegate calls; any other kernel
  (`aten::` portable kernels, dim-order copies) is a fallback. A run of consecutive fallback
  kernels, with the dequantize before it and the quantize after it, is an *island*; a float
  island computes in float between the two. An island of int8 dim-order copies alone is a
  *layout copy*: bytes moved between NCHW and NHWC (around a Conv1d lowered as a Conv2d,
  flows/conv1d_as_conv2d.py), nothing computed outside int8. A program with neither
  `cortex_m::` kernels nor delegates (the portable fp32 flow) has no target set, hence no
  fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Kernels that convert between int8 and float: the edges of an island, not fallbacks.
QDQ_KERNELS = (
    "cortex_m::quantize_per_tensor",
    "cortex_m::dequantize_per_tensor",
    "quantized_decomposed::quantize_per_tensor",
    "quantized_decomposed::dequantize_per_tensor",
)
TARGET_NAMESPACES = ("cortex_m::", "deploykit::")
LAYOUT_COPY_NAMESPACE = "dim_order_ops::"
_ITEM_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}
_FLOAT_TYPES = {5, 6, 7, 15}  # half, float, double, bfloat16
_MATMULS = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1}  # op -> index of the left matrix


@dataclass(frozen=True)
class Island:
    """Consecutive fallback kernels (instruction indices first..last of the chain), with the
    dequantize/quantize around them when there are."""

    ops: tuple[str, ...]  # in call order, including the bounding dequantize/quantize
    first: int
    last: int
    is_float: bool  # some fallback kernel reads or writes a float tensor
    macs: int
    is_layout_copy: bool = False  # int8 dim-order copies only: moves bytes, computes nothing

    def describe(self) -> str:
        kind = (
            "float island"
            if self.is_float
            else "layout copy"
            if self.is_layout_copy
            else "fallback"
        )
        macs = f", {self.macs:,} MACs" if self.macs else ""
        return f"{kind} at instructions {self.first}-{self.last}: {' -> '.join(self.ops)}{macs}"


@dataclass(frozen=True)
class ProgramCosts:
    macs: int  # convolution and linear MACs in CPU kernels (delegates not included)
    activation_lower_bound: int  # bytes: largest sum of planned tensors live at one instruction
    lower_bound_at: str  # the kernel (or delegate) where that peak is
    fallback_ops: tuple[str, ...]  # each once, in first-call order
    islands: tuple[Island, ...]
    has_target_kernels: bool  # False for a portable program: then nothing is a fallback


def _short(op: str) -> str:
    return op.split(".")[0]


def _tensor(plan: Any, index: int) -> Any | None:
    val = plan.values[index].val
    return val if type(val).__name__ == "Tensor" else None


def _numel(t: Any) -> int:
    n = 1
    for s in t.sizes:
        n *= int(s)
    return n


def _nbytes(t: Any) -> int:
    return _numel(t) * _ITEM_BYTES.get(int(t.scalar_type), 4)


def kernel_macs(plan: Any, op: str, args: list[int]) -> int:
    """MACs of one kernel call; 0 for an operator that is no convolution or matmul."""
    name = _short(op)
    tensors = [_tensor(plan, a) for a in args]
    out = tensors[-1] if tensors else None
    if out is None or not out.sizes:
        return 0
    if name in _MATMULS:
        left = tensors[_MATMULS[name]]
        return _numel(out) * int(left.sizes[-1]) if left is not None else 0
    if "conv" in name or "linear" in name:
        weight = tensors[1] if len(tensors) > 1 else None
        if weight is None:
            return 0
        channels = int(out.sizes[1] if "conv" in name and len(out.sizes) > 2 else out.sizes[-1])
        return _numel(out) * _numel(weight) // channels if channels else 0
    return 0


def program_costs(plan: Any, operators: tuple[str, ...]) -> ProgramCosts:
    """The costs of `plan` (an ExecutionPlan of the deserialized program)."""
    calls: list[tuple[str, list[int]]] = []  # (op or "delegate N", args) per instruction
    for chain in plan.chains:
        for instr in chain.instructions:
            kind = type(instr.instr_args).__name__
            if kind == "KernelCall":
                calls.append((operators[instr.instr_args.op_index], list(instr.instr_args.args)))
            elif kind == "DelegateCall":
                calls.append(
                    (f"delegate {instr.instr_args.delegate_index}", list(instr.instr_args.args))
                )
    macs = sum(kernel_macs(plan, op, args) for op, args in calls if not op.startswith("delegate "))
    bound, at = _live_peak(plan, calls)
    has_target = bool(plan.delegates) or any(op.startswith(TARGET_NAMESPACES) for op, _ in calls)
    fallback = [
        i
        for i, (op, _) in enumerate(calls)
        if has_target
        and not op.startswith(("delegate ", *TARGET_NAMESPACES))
        and _short(op) not in QDQ_KERNELS
    ]
    seen: dict[str, None] = {calls[i][0]: None for i in fallback}
    return ProgramCosts(
        macs=macs,
        activation_lower_bound=bound,
        lower_bound_at=at,
        fallback_ops=tuple(seen),
        islands=_islands(plan, calls, fallback),
        has_target_kernels=has_target,
    )


def _live_peak(plan: Any, calls: list[tuple[str, list[int]]]) -> tuple[int, str]:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (_, args) in enumerate(calls):
        for a in args:
            t = _tensor(plan, a)
            if t is not None and t.allocation_info is not None:
                first.setdefault(a, i)
                last[a] = i
    end = len(calls) - 1
    for a in plan.outputs:  # outputs stay live until the method returns
        if a in first:
            last[a] = end
    best, where = 0, "-"
    for i, (op, _) in enumerate(calls):
        live = sum(_nbytes(_tensor(plan, a)) for a in first if first[a] <= i <= last[a])
        if live > best:
            best, where = live, op
    return best, where


def _islands(
    plan: Any, calls: list[tuple[str, list[int]]], fallback: list[int]
) -> tuple[Island, ...]:
    runs: list[list[int]] = []
    for i in fallback:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    out = []
    for run in runs:
        first, last = run[0], run[-1]
        if first > 0 and _short(calls[first - 1][0]).endswith("dequantize_per_tensor"):
            first -= 1
        if (
            last + 1 < len(calls)
            and _short(calls[last + 1][0]).endswith("quantize_per_tensor")
            and not _short(calls[last + 1][0]).endswith("dequantize_per_tensor")
        ):
            last += 1
        is_float = any(
            t is not None and int(t.scalar_type) in _FLOAT_TYPES
            for i in run
            for t in (_tensor(plan, a) for a in calls[i][1])
        )
        out.append(
            Island(
                ops=tuple(calls[i][0] for i in range(first, last + 1)),
                first=first,
                last=last,
                is_float=is_float,
                macs=sum(kernel_macs(plan, *calls[i]) for i in run),
                is_layout_copy=not is_float
                and all(calls[i][0].startswith(LAYOUT_COPY_NAMESPACE) for i in run),
            )
        )
    return tuple(out)


def refuse_fallbacks(pte: Any, islands: tuple[Island, ...]) -> None:
    """`--strict`: a ConfigError listing every island of `pte` that computes outside the
    flow's target kernels, if it has any. Layout copies pass: they keep the program int8."""
    islands = tuple(i for i in islands if not i.is_layout_copy)
    if not islands:
        return
    from deploykit.util.errors import ConfigError

    listed = "; ".join(island.describe() for island in islands)
    raise ConfigError(
        f"{pte} is not strictly in the flow's target kernels: {len(islands)} "
        f"island{'s' if len(islands) > 1 else ''} run outside them: {listed}.",
        "Rewrite the layers named there into ones the flow lowers (docs/int8-coverage.md "
        "lists what the cortex_m flow lowers), or leave out --strict to accept the fallbacks.",
    )
