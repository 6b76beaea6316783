"""Operator-by-operator numerical debugging: every operator's output on the device against the
host's, in execution order (`deploykit run --debug-intermediates`, docs/profiling.md).

The device streams each operator's output tensors (`trace_tensor` records of profiling firmware
built with DK_TRACE_INTERMEDIATES). The host runs the same program on the same inputs: it
interprets the `.pte`'s instructions one by one, calling each operator's functional PyTorch
implementation (ATen for the portable kernels; the cortex_m operators' integer reference, which
CMSIS-NN matches bit for bit) with the program's own constants and arguments. The first
instruction whose output differs beyond the tolerance is the first divergence.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploykit.readers.protocol.decoder import RunRecords


class InterpretError(Exception):
    """The host cannot run an instruction of the program (says which and why)."""


@dataclass
class OperatorError:
    chain: int
    instruction: int
    operator: str
    output: int  # which output of the operator
    max_abs: float | None  # None: no comparable device output (the note says why)
    mean_abs: float | None
    max_ref: float  # largest magnitude in the host's output (for scale)
    steps: bool  # integer outputs: errors in integer steps
    passed: bool
    note: str = ""


@dataclass
class IntermediatesReport:
    rows: list[OperatorError]
    atol: float
    rtol: float
    int_steps: int

    @property
    def first_divergence(self) -> OperatorError | None:
        return next((r for r in self.rows if not r.passed), None)

    def table(self) -> str:
        head = f"{'#':>4} {'operator':<40} {'out':>3} {'max abs':>12} {'mean abs':>12} {'':>6}"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            unit = " steps" if r.steps else ""
            lines.append(
                f"{r.instruction:>4} {r.operator:<40} {r.output:>3} "
                f"{_figure(r.max_abs)} {_figure(r.mean_abs)} "
                f"{'ok' if r.passed else 'DIFF'}{unit}{' ' + r.note if r.note else ''}"
            )
        first = self.first_divergence
        if first is None:
            lines.append(
                f"every operator's output agrees with the host's (tolerance: "
                f"{self.int_steps} step(s) for integers, atol {self.atol:g} + rtol "
                f"{self.rtol:g} for floats)"
            )
        else:
            figures = (
                first.note
                if first.max_abs is None
                else f"max abs error {first.max_abs:.6g}{' steps' if first.steps else ''}, "
                f"mean {first.mean_abs:.6g} (host output up to {first.max_ref:.6g})"
            )
            lines.append(
                f"first divergence: instruction {first.instruction}, {first.operator} "
                f"output {first.output}: {figures}"
            )
        return "\n".join(lines)

    def json(self) -> dict:
        first = self.first_divergence
        return {
            "tolerance": {"atol": self.atol, "rtol": self.rtol, "int_steps": self.int_steps},
            "first_divergence": None if first is None else first.__dict__,
            "operators": [r.__dict__ for r in self.rows],
        }


def _figure(x: float | None) -> str:
    return f"{'-':>12}" if x is None else f"{x:>12.6g}"


# ---- the host side: a .pte interpreter over PyTorch's functional operators ----------------

_TORCH_DTYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    6: "float32",
    7: "float64",
    11: "bool",
}


def _torch_dtype(code: int) -> Any:
    import torch

    name = _TORCH_DTYPES.get(code)
    if name is None:
        raise InterpretError(f"scalar type {code} is not supported")
    return getattr(torch, name)


def _from_memory_order(data: np.ndarray, sizes: list[int], dim_order: list[int]) -> np.ndarray:
    """Raw bytes in a tensor's memory order (its dim order) -> its logical layout."""
    order = list(dim_order) if dim_order else list(range(len(sizes)))
    stored = data.reshape([sizes[d] for d in order])
    return np.ascontiguousarray(np.transpose(stored, np.argsort(order)))


def _program_inputs(plan: Any, inputs: list[np.ndarray]) -> dict[int, Any]:
    import torch

    if len(plan.inputs) != len(inputs):
        raise InterpretError(f"the program takes {len(plan.inputs)} inputs, got {len(inputs)}")
    return {
        index: torch.from_numpy(np.ascontiguousarray(a))
        for index, a in zip(plan.inputs, inputs, strict=True)
    }


@dataclass
class HostRun:
    """Every KernelCall's outputs (logical layout) by (chain, instruction), its operator, and
    the dim order of each output (how the device's bytes of it lie in memory)."""

    outputs: dict[tuple[int, int], list[np.ndarray]]
    operators: dict[tuple[int, int], str]
    dim_orders: dict[tuple[int, int], list[list[int]]]


def run_program(pte: bytes, inputs: list[np.ndarray]) -> HostRun:
    """Run `pte`'s forward method on the host, instruction by instruction."""
    import torch

    from deploykit.readers.pte_reader import load_program, method_plan, operator_names

    # The cortex_m operators' reference implementations register with torch on import.
    with contextlib.suppress(ImportError):
        # Through the pass manager, as the flow imports it: the package needs that order.
        import executorch.backends.cortex_m.passes.cortex_m_pass_manager  # noqa: F401
    program = load_program(pte, "the program")
    plan = method_plan(program, "forward", "the program")
    names = operator_names(plan)
    values: dict[int, Any] = _program_inputs(plan, inputs)
    storage: dict[tuple[int, int, int], Any] = {}  # planned address -> the tensor written there

    def tensor_value(i: int, t: Any) -> Any:
        if i in values:
            return values[i]
        if t.data_buffer_idx > 0 and t.allocation_info is None:  # a constant
            raw = np.frombuffer(
                bytes(program.constant_buffer[t.data_buffer_idx].storage),
                dtype=np.dtype(_TORCH_DTYPES[int(t.scalar_type)]),
            )
            count = int(np.prod(t.sizes)) if t.sizes else 1
            logical = _from_memory_order(raw[:count], list(t.sizes), list(t.dim_order))
            values[i] = torch.from_numpy(logical.copy())
            return values[i]
        # Memory planning may let one value be another's bytes under other sizes (a view the
        # program does not copy): read what was written at the same planned address.
        written = storage.get(_address(t))
        if written is not None and written.numel() == int(np.prod(t.sizes or [1])):
            values[i] = written.reshape(list(t.sizes))
            return values[i]
        raise InterpretError(f"value {i} is read before any instruction wrote it")

    def value(i: int, schema_type: Any = None) -> Any:
        v = plan.values[i].val
        kind = type(v).__name__
        if kind == "Tensor":
            return tensor_value(i, v)
        if kind == "Int":
            if schema_type is not None and "ScalarType" in str(schema_type):
                return _torch_dtype(v.int_val)
            return v.int_val
        if kind == "Double":
            return v.double_val
        if kind == "Bool":
            return v.bool_val
        if kind == "Null":
            return None
        if kind == "String":
            return v.string_val
        if kind == "IntList":
            return [plan.values[j].val.int_val for j in v.items]
        if kind in ("DoubleList", "BoolList"):
            return list(v.items)
        if kind == "TensorList":
            return [value(j) for j in v.items]
        if kind == "OptionalTensorList":
            return [None if j < 0 else value(j) for j in v.items]
        raise InterpretError(f"value {i} of kind {kind} is not supported")

    run = HostRun({}, {}, {})
    for c, chain in enumerate(plan.chains):
        for n, instr in enumerate(chain.instructions):
            kind = type(instr.instr_args).__name__
            if kind == "DelegateCall":
                raise InterpretError(
                    f"instruction {n} is a delegate call: the host cannot run "
                    "a delegate's blob operator by operator"
                )
            if kind != "KernelCall":
                continue
            name = names[instr.instr_args.op_index]
            run.operators[(c, n)] = name
            namespace, _, rest = name.partition("::")
            op_name = rest.rsplit(".", 1)[0]
            packet = getattr(getattr(torch.ops, namespace), op_name)
            out_schema = getattr(packet, rest.rsplit(".", 1)[1])._schema
            functional = _functional_schema(packet, out_schema, name)
            overload = getattr(packet, functional.overload_name or "default")
            args = list(instr.instr_args.args)
            out_positions = [k for k, a in enumerate(out_schema.arguments) if a.is_out]
            call_args = [
                value(args[k], a.type)
                for k, a in enumerate(functional.arguments)
                if not a.kwarg_only
            ]
            call_kwargs = {
                a.name: value(args[k], a.type)
                for k, a in enumerate(functional.arguments)
                if a.kwarg_only
            }
            try:
                result = overload(*call_args, **call_kwargs)
            except Exception as exc:
                raise InterpretError(f"instruction {n} ({name}) failed on the host: {exc}") from exc
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            outs, orders = [], []
            for k, r in zip(out_positions, results, strict=False):
                values[args[k]] = r
                address = _address(plan.values[args[k]].val)
                if address is not None:
                    storage[address] = r.contiguous()
                outs.append(r.detach().numpy().copy())
                orders.append(list(plan.values[args[k]].val.dim_order))
            run.outputs[(c, n)] = outs
            run.dim_orders[(c, n)] = orders
    return run


def _address(t: Any) -> tuple[int, int, int] | None:
    """Where memory planning put a tensor (memory id, offset), None for constants."""
    info = t.allocation_info
    if info is None:
        return None
    return (info.memory_id, info.memory_offset_low, info.memory_offset_high)


def _functional_schema(packet: Any, out_schema: Any, name: str) -> Any:
    """The functional overload an out variant computes: the one whose arguments are the out
    variant's without its outs (`mean.out` -> `mean.dim`)."""
    wanted = [a.name for a in out_schema.arguments if not a.is_out]
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if [a.name for a in schema.arguments] == wanted and not any(
            a.is_out for a in schema.arguments
        ):
            return schema
    raise InterpretError(f"{name} has no functional overload with the same arguments")


def compare_intermediates(
    records: RunRecords,
    pte: bytes,
    inputs: list[np.ndarray],
    *,
    atol: float,
    rtol: float,
    int_steps: int = 1,
) -> IntermediatesReport:
    """The device's traced operator outputs (the first input set's) against the host's."""
    host = run_program(pte, inputs)
    ops = host.operators
    device: dict[tuple[int, int, int], np.ndarray] = {}
    for t in records.trace_tensors:
        key = (t.chain, t.debug_handle, t.ordinal)
        if t.kind == 0 and key not in device:  # the first execute() only
            device[key] = t.tensor.data
    rows: list[OperatorError] = []
    for (c, n), outs in sorted(host.outputs.items()):
        for k, ref in enumerate(outs):
            got = device.get((c, n, k))
            if got is None:
                rows.append(
                    OperatorError(
                        c,
                        n,
                        ops[(c, n)],
                        k,
                        None,
                        None,
                        0.0,
                        False,
                        False,
                        "no device output",
                    )
                )
                continue
            got = _device_logical(got, host.dim_orders[(c, n)][k], ref)
            integer = np.issubdtype(ref.dtype, np.integer)
            diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            max_abs = float(diff.max()) if diff.size else 0.0
            mean_abs = float(diff.mean()) if diff.size else 0.0
            max_ref = float(np.abs(ref.astype(np.float64)).max()) if ref.size else 0.0
            if got.shape != ref.shape:
                rows.append(
                    OperatorError(
                        c,
                        n,
                        ops[(c, n)],
                        k,
                        None,
                        None,
                        max_ref,
                        integer,
                        False,
                        f"shape {got.shape} != host {ref.shape}",
                    )
                )
                continue
            if integer:
                passed = max_abs <= int_steps
            else:
                passed = bool(np.all(diff <= atol + rtol * np.abs(ref.astype(np.float64))))
            rows.append(
                OperatorError(c, n, ops[(c, n)], k, max_abs, mean_abs, max_ref, integer, passed)
            )
    return IntermediatesReport(rows, atol, rtol, int_steps)


def _device_logical(data: np.ndarray, dim_order: list[int], ref: np.ndarray) -> np.ndarray:
    """A device tensor (memory-order bytes, logical sizes) in logical layout."""
    sizes = list(data.shape)
    if dim_order and dim_order != sorted(dim_order) and len(dim_order) == len(sizes):
        return _from_memory_order(data.reshape(-1), sizes, dim_order)
    return data.reshape(ref.shape) if data.size == ref.size else data
