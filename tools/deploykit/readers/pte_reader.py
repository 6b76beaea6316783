"""Reading a serialized ExecuTorch program (`.pte`): the one place that uses ExecuTorch's
private serialization API (`executorch.exir._serialize`), so that a change of it upstream
breaks one module, which tests/unit/test_pte_reader.py pins.

Conventions every reader of a `.pte` in deploykit shares:
- operators are named `name.overload` ("aten::add.out"), in the program's operator table order;
- planned buffers are given per memory id from 1: the program's `non_const_buffer_sizes[0]`
  is reserved by ExecuTorch and always 0, so it is dropped here, once.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    problem = _inconsistency(program)
    if problem:
        raise ConfigError(f"{source} is not a consistent ExecuTorch program: {problem}.",
                          "The file is damaged: export the model again.")
    return program


# Bytes per element of the scalar types a planned tensor may have (the rest are not checked
# against their buffer).
_ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 27: 2, 28: 4, 29: 8}
# Logical elements of one tensor past which a program is taken for damaged: more than any
# planned buffer or input deploykit could hold (2**40 bytes at least).
_MAX_ELEMENTS = 1 << 40


def _inconsistency(program: Any) -> str | None:
    """What, if anything, makes the program's cross-references wrong: an index past its
    table (values, operators, delegates, constants, planned buffers, instructions), a planned
    tensor outside its buffer, sizes that are negative or absurd, a dim order that is no
    permutation. Everything that reads a program trusts these afterwards; the runtime's own
    loader checks the same before it runs one."""
    try:
        for plan in program.execution_plan:
            problem = _plan_inconsistency(program, plan)
            if problem:
                return f"method '{plan.name}': {problem}"
    except (AttributeError, TypeError, ValueError) as exc:  # a field of the wrong kind
        return f"{type(exc).__name__}: {exc}"
    return None


def _plan_inconsistency(program: Any, plan: Any) -> str | None:  # noqa: C901 (one check each)
    n_values, n_ops = len(plan.values), len(plan.operators)
    buffers = [int(s) for s in plan.non_const_buffer_sizes]
    constants = len(program.constant_buffer)

    def value(i: Any, what: str, optional: bool = False) -> str | None:
        if isinstance(i, int) and (0 <= i < n_values or (optional and i == -1)):
            return None
        return f"{what} names value {i} of {n_values}"

    if any(b < 0 for b in buffers):
        return f"a planned buffer has a negative size ({buffers})"
    for k, op in enumerate(plan.operators):
        if not isinstance(op.name, str) or not op.name or not isinstance(op.overload,
                                                                          str | None):
            return f"operator {k} has no name"
    for k, delegate in enumerate(plan.delegates):
        if not isinstance(delegate.id, str) or not delegate.id:
            return f"delegate {k} has no backend id"
        if any(not isinstance(spec.key, str) or not isinstance(spec.value, bytes | bytearray)
               for spec in delegate.compile_specs):
            return f"delegate {k} has a compile spec without a key or a value"
        where = delegate.processed
        if where.location == 0:  # inline: in the program's backend_delegate_data
            blobs = program.backend_delegate_data
            if not 0 <= where.index < len(blobs):
                return f"delegate {k} names inline data {where.index} of {len(blobs)}"
            if not isinstance(blobs[where.index].data, bytes | bytearray):
                return f"delegate {k}'s inline data {where.index} is missing"
        elif not 0 <= where.index < len(program.segments):
            return f"delegate {k} names segment {where.index} of {len(program.segments)}"
    for what, indices in (("an input", plan.inputs), ("an output", plan.outputs)):
        for i in indices:
            if (problem := value(i, what)) is not None:
                return problem
    for i, v in enumerate(plan.values):
        val, kind = v.val, type(v.val).__name__
        if kind == "Tensor":
            sizes, order = [int(s) for s in val.sizes], [int(d) for d in val.dim_order]
            if any(s < 0 for s in sizes):
                return f"value {i} has negative sizes {sizes}"
            count = 1
            for s in sizes:
                count *= s
            if count > _MAX_ELEMENTS:
                return f"value {i} has {count} elements (sizes {sizes})"
            if order and sorted(order) != list(range(len(sizes))):
                return f"value {i} has dim order {order} for {len(sizes)} dimensions"
            info = val.allocation_info
            if info is None:
                if val.data_buffer_idx != 0 and not 0 <= val.data_buffer_idx < constants:
                    return (f"value {i} names constant {val.data_buffer_idx} of "
                            f"{constants}")
                continue
            memory = int(info.memory_id)
            if not 0 < memory < len(buffers):
                return f"value {i} is planned in buffer {memory} of {len(buffers) - 1}"
            itemsize = _ITEMSIZE.get(int(val.scalar_type))
            end = int(info.memory_offset) + count * (itemsize or 0)
            if end > buffers[memory]:
                return (f"value {i} ends at byte {end} of planned buffer {memory}, which has "
                        f"{buffers[memory]}")
        elif kind in ("IntList", "TensorList", "OptionalTensorList"):
            for item in val.items:
                if (problem := value(item, f"value {i} ({kind})",
                                     optional=kind == "OptionalTensorList")) is not None:
                    return problem
    for c, chain in enumerate(plan.chains):
        count = len(chain.instructions)
        for n, instruction in enumerate(chain.instructions):
            args, kind = instruction.instr_args, type(instruction.instr_args).__name__
            where = f"instruction {n} of chain {c}"
            if kind == "KernelCall":
                if not 0 <= args.op_index < n_ops:
                    return f"{where} calls operator {args.op_index} of {n_ops}"
                indices = list(args.args)
            elif kind == "DelegateCall":
                if not 0 <= args.delegate_index < len(plan.delegates):
                    return (f"{where} calls delegate {args.delegate_index} of "
                            f"{len(plan.delegates)}")
                indices = list(args.args)
            elif kind == "MoveCall":
                indices = [args.move_from, args.move_to]
            elif kind == "JumpFalseCall":
                if not 0 <= args.destination_instruction <= count:
                    return f"{where} jumps to instruction {args.destination_instruction}"
                indices = [args.cond_value_index]
            elif kind == "FreeCall":
                indices = [args.value_index]
            else:
                return f"{where} is of no known kind ({kind})"
            for index in indices:
                if (problem := value(index, where)) is not None:
                    return problem
    return None


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


def kernel_calls(plan: Any) -> Iterator[tuple[str, list[int]]]:
    """(operator "name.overload", its value indices) of each KernelCall of `plan`, in order."""
    operators = operator_names(plan)
    for chain in plan.chains:
        for instr in chain.instructions:
            if type(instr.instr_args).__name__ == "KernelCall":
                yield operators[instr.instr_args.op_index], list(instr.instr_args.args)


# The convolutions deploykit's firmware runs in bands when their output is their input
# (firmware/kernels/cmsis_nn_in_place.c; tools/deploykit/flows/in_place.py writes them).
IN_PLACE_CONVOLUTIONS = ("cortex_m::quantized_conv2d.out",
                         "cortex_m::quantized_depthwise_conv2d.out")


def in_place_convolutions(program: Any) -> int:
    """How many convolution calls of `program` write over their input: the kernel's input and
    its out are one value (the emitter's layout: the schema's arguments, the out, what it
    returns)."""
    return sum(1 for plan in program.execution_plan for name, args in kernel_calls(plan)
               if name in IN_PLACE_CONVOLUTIONS and len(args) >= 3 and args[0] == args[-2])


def in_place_definition(pte_paths: list[Path]) -> dict[str, str]:
    """The firmware's DK_CMSIS_NN_IN_PLACE for these programs: OFF when none of them has a
    convolution in place, so that the bands' code (about 1 KB) is left out of the image."""
    found = any(in_place_convolutions(load_program(p.read_bytes(), str(p))) for p in pte_paths)
    return {"DK_CMSIS_NN_IN_PLACE": "ON" if found else "OFF"}


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
    for name, _args in kernel_calls(plan):
        calls[name] = calls.get(name, 0) + 1
    return PteInfo(operators=operators, kernel_calls=calls,
                   inputs=[io_tensor(plan, i, source) for i in plan.inputs],
                   outputs=[io_tensor(plan, i, source) for i in plan.outputs],
                   planned_buffers=list(planned_buffers(plan)),
                   num_delegates=len(plan.delegates))
