"""Reading a serialized ExecuTorch program (`.pte`): the one place that uses ExecuTorch's
private serialization API (`executorch.exir._serialize`), so that a change of it upstream
breaks one module, which tests/unit/test_pte_reader.py pins.

Conventions every reader of a `.pte` in deploykit shares:
- operators are named `name.overload` ("aten::add.out"), in the program's operator table order;
- planned buffers are given per memory id from 1: the program's `non_const_buffer_sizes[0]`
  is reserved by ExecuTorch and always 0, so it is dropped here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.util.errors import ConfigError

_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
                 6: "float32", 7: "float64", 11: "bool", 15: "bfloat16", 27: "uint16",
                 28: "uint32", 29: "uint64"}


def scalar_type_name(code: int) -> str:
    """ExecuTorch ScalarType code -> numpy dtype name (6 -> "float32")."""
    return _SCALAR_TYPES.get(code, f"scalar_type_{code}")


def load_program(data: bytes, source: str) -> Any:
    """The deserialized program (executorch.exir.schema.Program) of `.pte` bytes; `source`
    names them in the error."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    hint = "Re-export the model with the pinned executorch version."
    try:
        program = deserialize_pte_binary(data).program
    except Exception as exc:  # the flatbuffer parser raises many unrelated types
        raise ConfigError(f"{source} is not a readable ExecuTorch program: "
                          f"{type(exc).__name__}: {exc}", hint) from exc
    # Bytes that are no flatbuffer at all can parse into an empty table.
    if not isinstance(program.execution_plan, list):
        raise ConfigError(f"{source} is not a readable ExecuTorch program: it has no "
                          "execution plan.", hint)
    return program


def method_plan(program: Any, method: str, source: str) -> Any:
    """The execution plan of `method`."""
    plans = {p.name: p for p in program.execution_plan}
    if method not in plans:
        raise ConfigError(f"{source} has no method '{method}'.",
                          f"Methods: {', '.join(plans) or 'none'}. Re-export the model.")
    return plans[method]


def operator_names(plan: Any) -> tuple[str, ...]:
    return tuple(f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators)


def planned_buffers(plan: Any) -> tuple[int, ...]:
    """Bytes of each planned buffer, memory id 1 first (id 0 is reserved)."""
    return tuple(int(s) for s in plan.non_const_buffer_sizes[1:])


@dataclass(frozen=True)
class PteTensor:
    dtype: str  # numpy dtype name, e.g. "float32", "int8"
    sizes: list[int]
    dim_order: list[int]  # [0, 2, 3, 1] = NHWC memory for a logical NCHW tensor
    scalar_type: int  # ExecuTorch ScalarType code
    # In a planned buffer (the program's memory plan gave it room; the runtime copies an input
    # there), or not (the runtime reads or writes it where the caller's data lies).
    planned: bool = True

    @property
    def nbytes(self) -> int:
        import numpy as np

        n = 1
        for s in self.sizes:
            n *= s
        return n * np.dtype(self.dtype).itemsize


def io_tensor(plan: Any, index: int, source: str) -> PteTensor:
    """Value `index` of `plan`, which must be a tensor (a method input or output)."""
    from executorch.exir.schema import Tensor

    v = plan.values[index].val
    if not isinstance(v, Tensor):
        raise ConfigError(f"{source}: input/output {index} is not a tensor "
                          f"({type(v).__name__}).",
                          "deploykit supports tensor inputs and outputs only.")
    st = int(v.scalar_type)
    return PteTensor(dtype=scalar_type_name(st),
                     sizes=[int(s) for s in v.sizes], dim_order=[int(d) for d in v.dim_order],
                     scalar_type=st, planned=v.allocation_info is not None)


@dataclass
class PteInfo:
    """What the serialized program says about method `forward` (the export's view)."""

    operators: list[str]
    kernel_calls: dict[str, int]  # operator -> number of KernelCall instructions
    inputs: list[PteTensor]
    outputs: list[PteTensor]
    planned_buffers: list[int]  # per memory id from 1
    num_delegates: int


def read_pte_info(pte: Path | bytes, method: str = "forward") -> PteInfo:
    """Deserialize a `.pte` (path or bytes) and describe `method`. ConfigError if it is not
    a valid ExecuTorch program with that method."""
    if isinstance(pte, (bytes, bytearray)):
        data, source = bytes(pte), "the exported program"
    else:
        data, source = Path(pte).read_bytes(), str(pte)
    plan = method_plan(load_program(data, source), method, source)
    operators = list(operator_names(plan))
    calls: dict[str, int] = {}
    for chain in plan.chains:
        for instr in chain.instructions:
            if type(instr.instr_args).__name__ == "KernelCall":
                name = operators[instr.instr_args.op_index]
                calls[name] = calls.get(name, 0) + 1
    return PteInfo(operators=operators, kernel_calls=calls,
                   inputs=[io_tensor(plan, i, source) for i in plan.inputs],
                   outputs=[io_tensor(plan, i, source) for i in plan.outputs],
                   planned_buffers=list(planned_buffers(plan)),
                   num_delegates=len(plan.delegates))
