"""Where a failed `execute()` stopped, in the program and in the model.

The firmware's `execute_error` record (docs/protocol.md) carries the step: how many
instructions `execute()` ran before the one that failed. The program (.pte) says which
instruction that is and which operator it calls; the export's `instruction_sources` (written
into export.json from the final program's graph, whose nodes carry the instruction index the
emitter gave them) say which model line it comes from:

    execute failed at instruction 0 (cortex_m::quantized_conv2d.out, model.py:17 in forward):
    arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_FAILURE
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.readers.op_coverage import model_line, op_name
from deploykit.readers.protocol.error_codes import label
from deploykit.readers.protocol.outcome import execute_failure_text
from deploykit.readers.protocol.records import CMSIS_NN_STATUS, ExecuteError

KERNEL_CALL = "KernelCall"
DELEGATE_CALL = "DelegateCall"
JUMP_CALL = "JumpFalseCall"


@dataclass(frozen=True)
class ProgramStep:
    """What one instruction of the program is: its chain and index, and what it calls."""

    chain: int
    index: int
    what: str  # "cortex_m::quantized_conv2d.out", "delegate 0 (EthosUBackend)", "move", ...

    @property
    def place(self) -> str:
        """ "instruction 3", or "instruction 1:3" outside the first chain."""
        return f"instruction {self.index}" if self.chain == 0 else \
            f"instruction {self.chain}:{self.index}"


def program_steps(pte: bytes) -> tuple[list[ProgramStep], bool]:
    """Every instruction of the program's first method, in the order `execute()` runs them
    without jumps, and whether it has a jump (then a step count is no position)."""
    from deploykit.readers.pte_reader import load_program, operator_names

    program = load_program(pte, "the program")
    plan = program.execution_plan[0]
    operators = operator_names(plan)
    backends = [d.id for d in plan.delegates]
    steps: list[ProgramStep] = []
    jumps = False
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            kind = type(instr.instr_args).__name__
            if kind == KERNEL_CALL:
                what = operators[instr.instr_args.op_index]
            elif kind == DELEGATE_CALL:
                index = instr.instr_args.delegate_index
                what = f"delegate {index} ({backends[index]})"
            else:
                jumps = jumps or kind == JUMP_CALL
                what = kind.removesuffix("Call").lower()
            steps.append(ProgramStep(c, i, what))
    return steps, jumps


def instruction_sources(graph_module: Any, pte: bytes, model_file: Path | None) -> dict[int, str]:
    """Instruction index (first chain) -> the model line it comes from ("model.py:17 in
    forward: y = self.conv(x)"). The emitter sets each emitted node's `debug_handle` to its
    instruction's index; a node is taken only where the program's instruction at that index
    calls the node's operator (other nodes keep their own debug handles, which may collide)."""
    if graph_module is None:
        return {}
    steps, _ = program_steps(pte)
    first_chain = {s.index: s.what for s in steps if s.chain == 0}
    out: dict[int, str] = {}
    for node in graph_module.graph.nodes:
        handle = node.meta.get("debug_handle")
        if node.op != "call_function" or not isinstance(handle, int):
            continue
        name = op_name(node.target)
        if name is None or first_chain.get(handle) != name:
            continue
        line = model_line(node.meta.get("stack_trace") or "", model_file)
        if line is not None:
            out[handle] = line
    return out


@dataclass(frozen=True)
class LocatedFailure:
    """A failed execute(), placed: the report's line (`text`) and its parts (run --json)."""

    text: str
    error: str  # "Internal (0x01)"
    step: int | None
    chain: int | None = None
    instruction: int | None = None
    operator: str | None = None
    source: str | None = None  # "model.py:17 in forward: y = self.conv(x)"
    kernel_call: str | None = None  # "arm_convolve_wrapper_s8"
    kernel_status: str | None = None  # "ARM_CMSIS_NN_FAILURE"


def locate(failure: ExecuteError, pte: bytes | None,
           sources: Mapping[int, str] | None = None) -> LocatedFailure:
    """Where execute() failed and why (the kernel's message, else the Error), in one line:
    "execute failed at instruction 0 (cortex_m::quantized_conv2d.out, model.py:17 in
    forward): arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_FAILURE"."""
    kernel = {}
    if failure.kernel_call:
        kernel = {"kernel_call": failure.kernel_call,
                  "kernel_status": CMSIS_NN_STATUS.get(failure.kernel_status,
                                                       str(failure.kernel_status))}
    error = label(failure.code)
    if failure.step is None or pte is None:
        return LocatedFailure(execute_failure_text(failure), error, failure.step, **kernel)
    why = failure.kernel_message or error
    steps, jumps = program_steps(pte)
    if jumps or failure.step >= len(steps):
        whereabouts = ("the program jumps, so the step is no instruction index" if jumps
                       else f"past the program's {len(steps)} instructions")
        return LocatedFailure(f"execute failed at step {failure.step} ({whereabouts}): {why}",
                              error, failure.step, **kernel)
    step = steps[failure.step]
    line = (sources or {}).get(step.index) if step.chain == 0 else None
    inside = [step.what] + ([line.split(": ", 1)[0]] if line else [])  # "model.py:17 in forward"
    return LocatedFailure(f"execute failed at {step.place} ({', '.join(inside)}): {why}", error,
                          failure.step, step.chain, step.index, step.what, line, **kernel)
