"""Operator-by-operator numerical debugging: every operator's output on the device against the
host's, in execution order (`deploykit run --debug-intermediates`, docs/profiling.md).

The device streams each operator's output tensors (`trace_tensor` records of profiling firmware
built with DK_TRACE_INTERMEDIATES). The host runs the same program on the same inputs: it
interprets the `.pte`'s instructions one by one (program/pte_interpreter.py), calling each
operator's PyTorch implementation (ATen for the portable kernels; the cortex_m operators'
integer reference, which CMSIS-NN matches bit for bit) with the program's own constants,
arguments and planned memory. The first instruction whose output differs beyond the tolerance
is the first divergence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deploykit.readers.protocol.decoder import RunRecords


class InterpretError(Exception):
    """The host cannot run the program, or an instruction of it (says which and why)."""


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


# ---- the host side: the program run on the host, kernel call by kernel call ------------------


def _from_memory_order(data: np.ndarray, sizes: list[int], dim_order: list[int]) -> np.ndarray:
    """Raw bytes in a tensor's memory order (its dim order) -> its logical layout."""
    order = list(dim_order) if dim_order else list(range(len(sizes)))
    stored = data.reshape([sizes[d] for d in order])
    return np.ascontiguousarray(np.transpose(stored, np.argsort(order)))


@dataclass
class HostRun:
    """Every KernelCall's outputs (logical layout) by (chain, instruction), its operator, and
    the dim order of each output (how the device's bytes of it lie in memory)."""

    outputs: dict[tuple[int, int], list[np.ndarray]]
    operators: dict[tuple[int, int], str]
    dim_orders: dict[tuple[int, int], list[list[int]]]


def run_program(pte: bytes, inputs: list[np.ndarray]) -> HostRun:
    """Run `pte`'s forward method on the host (program/pte_interpreter.py, the interpreter of
    a .pte given as the model: planned memory, dim orders and kernel calls as the runtime has
    them) and keep what each KernelCall writes to its outs, which is what the device's event
    tracer logs for it."""
    from deploykit.program.pte_interpreter import KernelOutputs
    from deploykit.program.pte_interpreter import run_program as interpret
    from deploykit.readers.pte_reader import load_program, method_plan
    from deploykit.util.errors import DeployKitError

    run = HostRun({}, {}, {})
    try:
        plan = method_plan(load_program(pte, "the program"), "forward", "the program")

        def keep(call: KernelOutputs) -> None:
            key = (call.chain, call.instruction)
            run.operators[key] = call.operator
            # Copies: later kernels write again the planned memory these outputs live in.
            run.outputs[key] = [t.detach().contiguous().numpy().copy() for _, t in call.outputs]
            run.dim_orders[key] = [[int(d) for d in plan.values[i].val.dim_order]
                                   for i, _ in call.outputs]

        interpret(pte, inputs, "the program", on_kernel=keep)
    except DeployKitError as exc:
        raise InterpretError(exc.cause) from exc
    return run


def compare_intermediates(
    records: RunRecords,
    pte: bytes,
    inputs: list[np.ndarray],
    *,
    atol: float,
    rtol: float,
    int_steps: int = 1,
    failed_at: tuple[int, int] | None = None,
) -> IntermediatesReport:
    """The device's traced operator outputs (the first input set's) against the host's.
    `failed_at`: the (chain, instruction) where the device's execute() failed; it and the
    instructions after it did not run there, whatever the device sent for them."""
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
            if failed_at is not None and (c, n) >= failed_at:
                problem = ("execute() failed here" if (c, n) == failed_at
                           else "not run: execute() failed before it")
                rows.append(OperatorError(c, n, ops[(c, n)], k, None, None, 0.0, False, False,
                                          problem))
                continue
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
