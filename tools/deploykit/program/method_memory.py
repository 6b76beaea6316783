"""Model of what ExecuTorch's `Method::load` takes from the method and temp allocators.

The method allocator's need is not stored in the `.pte`, but it follows from it: `Method::init`
(runtime/executor/method.cpp, v1.4.1) makes a fixed sequence of bump allocations for every value
and instruction of the execution plan. This module replays that sequence on the deserialized
plan, with the 32-bit Arm sizes of the runtime's types (measured with arm-none-eabi-g++ on the
v1.4.1 headers), so the estimate is the allocator's high-water mark, padding included:

    values_        n_values x EValue (16 B, 8-aligned); input_set_: n_inputs x bool
    Tensor         strides (4 B x dim); TensorImpl (32 B); for a dynamic shape also
                   sizes (4 B x dim) and dim order (1 B x dim)
    IntList        n x EValue* (4 B), n x int64 (8-aligned), BoxedEvalueList (12 B)
    TensorList     n x Tensor (4 B), n x EValue*, BoxedEvalueList (12 B)
    Optional...    n x EValue*, n x optional<Tensor> (8 B), BoxedEvalueList (12 B)
    Bool/DoubleList, String   an ArrayRef (8 B)
    delegates_     n x BackendDelegate; each delegate's init takes its compile specs
                   (12 B each) and whatever the backend allocates (not modelled: allowance)
    chains_        n x Chain (16 B); per chain n_instr x (OpFunction 4 B + Span 8 B);
                   per kernel or delegate call n_args x EValue* (4 B)

While resolving each kernel, `Method::resolve_operator` puts the call's TensorMeta list (12 B
per argument) and each tensor argument's dim order (1 B per dim) in the *temp* allocator and
resets it afterwards (with a zero-sized temp pool they go to the method pool for good). That
peak is the temp pool's need at load. At execute, portable kernels take temp memory only in
`aten::topk` (a (value, index) queue of the sorted dimension); the cortex_m operators of
v1.4.1 take their CMSIS-NN scratch from a memory-planned `scratch` argument instead, so it is
part of the planned buffers and is reported here only to say where it is.

Checked against the firmware's counting allocators on QEMU (docs/memory.md): equal for a plan
without IntList values, 4 B under with them (an alignment detail not reproduced); temp exact.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Sizes and alignments of the runtime types on 32-bit Arm (ExecuTorch v1.4.1, GCC 12.2).
EVALUE = (16, 8)
TENSOR_IMPL = (32, 4)
BOXED_LIST = (12, 4)
ARRAY_REF = (8, 4)
CHAIN = (16, 4)
BACKEND_DELEGATE = (32, 4)  # FreeableBuffer, backend, handle (rounded up)
COMPILE_SPEC = (12, 4)
TENSOR_META = (12, 4)
POINTER = (4, 4)
SPAN = (8, 4)
# What a backend's init() allocates for its handle is backend code: an allowance per delegate.
DELEGATE_INIT_ALLOWANCE = 256

CMSIS_SCRATCH_ARGS = ("scratch", "output_scratch")


@dataclass(frozen=True)
class ScratchUse:
    """A CMSIS-NN scratch argument of a cortex_m operator call."""

    op: str
    nbytes: int
    memory_id: int | None  # the planned buffer it lives in (None: not memory planned)


@dataclass(frozen=True)
class MethodLoad:
    """What loading and running the method takes from the method and temp pools."""

    method_bytes: int  # method allocator high-water mark after Method::load
    temp_load_bytes: int  # temp allocator peak while resolving operators at load
    temp_kernel_bytes: int  # temp memory kernels ask for at execute (aten::topk only)
    delegate_allowance: int  # included in method_bytes: backend init, not modelled
    cmsis_scratch: tuple[ScratchUse, ...] = ()
    notes: tuple[str, ...] = ()
    breakdown: dict[str, int] = field(default_factory=dict)  # method bytes by cause

    @property
    def temp_bytes(self) -> int:
        return max(self.temp_load_bytes, self.temp_kernel_bytes)


class _Bump:
    """A bump allocator that only counts, like executorch::runtime::MemoryAllocator."""

    def __init__(self) -> None:
        self.cur = 0
        self.peak = 0

    def take(self, size: int, align: int = 4) -> None:
        start = (self.cur + align - 1) // align * align
        self.cur = start + size
        self.peak = max(self.peak, self.cur)

    def reset(self) -> None:
        self.cur = 0


def _sizeof(t: tuple[int, int], n: int = 1) -> tuple[int, int]:
    return t[0] * n, t[1]


@functools.cache
def _cortex_m_scratch_positions() -> dict[str, tuple[int, ...]]:
    """cortex_m operator name -> positions of its scratch arguments, from the operators.yaml
    that ships with the executorch package (the kernel call's arguments are the schema's, out
    last)."""
    try:
        import executorch

        yaml_path = Path(next(iter(executorch.__path__))) / "backends/cortex_m/ops/operators.yaml"
        text = yaml_path.read_text()
    except (ImportError, OSError, StopIteration):
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for m in re.finditer(r"func:\s*([\w:]+)(?:\.(\w+))?\((.*)\)\s*->", text):
        names = [a.strip().split()[-1] for a in m.group(3).split(",")
                 if a.strip() and a.strip() != "*"]
        hits = tuple(i for i, n in enumerate(names) if n in CMSIS_SCRATCH_ARGS)
        if hits:
            out[m.group(1)] = hits
    return out


_ELEMENT_SIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}


def _tensor_nbytes(t: Any) -> int:
    n = 1
    for s in t.sizes:
        n *= int(s)
    return n * _ELEMENT_SIZE.get(int(t.scalar_type), 4)


def model_method_load(plan: Any) -> MethodLoad:
    """Replay Method::init's allocations for an execution plan (executorch.exir.schema)."""
    method, temp = _Bump(), _Bump()
    causes: dict[str, int] = {}

    def take(cause: str, size_align: tuple[int, int]) -> None:
        before = method.cur
        method.take(*size_align)
        causes[cause] = causes.get(cause, 0) + method.cur - before

    values = plan.values
    take("values", _sizeof(EVALUE, len(values)))
    if plan.inputs:
        take("values", (len(plan.inputs), 1))
    for v in values:
        kind, val = type(v.val).__name__, v.val
        if kind == "Tensor":
            dim = len(val.sizes)
            if int(getattr(val, "shape_dynamism", 0)) != 0:
                take("tensors", (4 * dim, 4))
                take("tensors", (dim, 1))
            take("tensors", (4 * dim, 4))
            take("tensors", TENSOR_IMPL)
        elif kind == "IntList":
            n = len(val.items)
            take("lists", _sizeof(POINTER, n))
            take("lists", (8 * n, 8))
            take("lists", BOXED_LIST)
        elif kind == "TensorList":
            n = len(val.items)
            take("lists", _sizeof(POINTER, n))
            take("lists", _sizeof(POINTER, n))
            take("lists", BOXED_LIST)
        elif kind == "OptionalTensorList":
            n = len(val.items)
            take("lists", _sizeof(POINTER, n))
            take("lists", (8 * n, 4))
            take("lists", BOXED_LIST)
        elif kind in ("BoolList", "DoubleList", "String"):
            take("lists", ARRAY_REF)
    take("delegates", _sizeof(BACKEND_DELEGATE, len(plan.delegates)))
    allowance = 0
    for d in plan.delegates:
        take("delegates", _sizeof(COMPILE_SPEC, len(d.compile_specs)))
        method.take(DELEGATE_INIT_ALLOWANCE, 8)
        allowance += DELEGATE_INIT_ALLOWANCE
    causes["delegates"] = causes.get("delegates", 0) + allowance
    take("instructions", _sizeof(CHAIN, len(plan.chains)))

    scratch_args = _cortex_m_scratch_positions()
    scratch: list[ScratchUse] = []
    topk = 0
    notes: list[str] = []
    for chain in plan.chains:
        n = len(chain.instructions)
        take("instructions", _sizeof(POINTER, n))
        take("instructions", _sizeof(SPAN, n))
        for ins in chain.instructions:
            args = ins.instr_args
            kind = type(args).__name__
            if kind not in ("KernelCall", "DelegateCall"):
                continue
            take("instructions", _sizeof(POINTER, len(args.args)))
            if kind != "KernelCall":
                continue
            op = plan.operators[args.op_index]
            temp.reset()
            temp.take(*_sizeof(TENSOR_META, len(args.args)))
            tensors = [values[i].val for i in args.args
                       if type(values[i].val).__name__ == "Tensor"]
            for t in tensors:
                temp.take(len(t.sizes), 1)
            for pos in scratch_args.get(op.name, ()):
                if pos < len(args.args) and type(values[args.args[pos]].val).__name__ == "Tensor":
                    t = values[args.args[pos]].val
                    info = t.allocation_info
                    scratch.append(ScratchUse(op.name, _tensor_nbytes(t),
                                              int(info.memory_id) if info else None))
            if op.name == "aten::topk" and tensors:
                # (value, int64 index) pairs for the sorted dimension: 16 B each at most.
                topk = max(topk, 16 * max((int(s) for s in tensors[0].sizes), default=1))
                notes.append("aten::topk asks the temp allocator for its sort queue")
    return MethodLoad(method_bytes=method.peak, temp_load_bytes=temp.peak,
                      temp_kernel_bytes=topk, delegate_allowance=allowance,
                      cmsis_scratch=tuple(scratch), notes=tuple(dict.fromkeys(notes)),
                      breakdown=causes)
