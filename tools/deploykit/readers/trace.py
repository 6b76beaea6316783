"""Per-operator times from the event records of profiling firmware (docs/profiling.md).

The firmware's tracer (firmware/runner/event_tracer.cpp) sends each event when it ends, with
its start and end on the board's event clock and its own ticks already taken out. What it could
not take out, the calls into it, was measured at start-up (`TraceClock.event_cost` ticks per
event); it is subtracted here once for every event nested inside another. Pure host code: the
tests feed it recorded event streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deploykit.readers.protocol.decoder import RunRecords
from deploykit.readers.protocol.records import TraceEvent

EXECUTE = "Method::execute"
OPERATOR_CALL = "OPERATOR_CALL"
DELEGATE_CALL = "DELEGATE_CALL"
NATIVE_CALL_PREFIX = "native_call_"


class TraceError(Exception):
    """The run's records cannot be read as a profile (says what is missing)."""


@dataclass(frozen=True)
class Instruction:
    """What one instruction of the program runs: an operator (`aten::add.out`) on a kernel
    library (portable, cortex_m), or a delegate call (`delegate`, its backend)."""

    name: str
    kernel: str


def kernel_of(operator: str) -> str:
    """The kernel library an operator of the program's table runs on in deploykit firmware:
    cortex_m (CMSIS-NN), deploykit (its own kernels, firmware/kernels) or portable."""
    from deploykit.readers.op_coverage import deploykit_kernel_ops

    if operator.startswith("cortex_m::"):
        return "cortex_m"
    if operator in deploykit_kernel_ops():
        return "deploykit"
    return "portable"


@dataclass
class EventTime:
    """One event with its corrected duration (ticks of the event clock)."""

    event: TraceEvent
    ticks: float
    nested: int


@dataclass
class OperatorRow:
    operator: str
    kernel: str
    calls: int
    ticks: float
    instructions: list[int] = field(default_factory=list)


@dataclass
class InstructionTime:
    """The time of one instruction of the program (chain, index), over every run."""

    chain: int
    instruction: int
    operator: str
    calls: int
    ticks: float


@dataclass
class Profile:
    """One profiling run: per-operator rows (largest first), the execute() total, the clock."""

    clock: str
    clock_hz: int
    event_cost: float  # ticks per event, subtracted for nested events
    iterations: int
    total_ticks: float  # every execute(), corrected
    rows: list[OperatorRow]
    events: list[EventTime]
    runner_ticks: float | None = None  # the runner's own execute() ticks minus the tracer's
    tracer_bytes: int = 0
    unit: str = "ticks"  # what `scale` converts ticks into: instructions (QEMU icount), cycles
    scale: float = 1.0  # units per tick
    # Per instruction, in execution order: what `explore` overlays on each node of the graph.
    instructions: list[InstructionTime] = field(default_factory=list)

    @property
    def operator_ticks(self) -> float:
        return sum(r.ticks for r in self.rows)

    def value(self, ticks: float) -> float:
        return ticks * self.scale

    def micros(self, ticks: float) -> float:
        return ticks * 1e6 / self.clock_hz

    def table(self) -> str:
        total = self.total_ticks or 1.0
        head = (
            f"{'operator':<44} {'kernel':<18} {'calls':>5} {self.unit:>13} {'us':>10} "
            f"{'share':>7} {'cum.':>7}"
        )
        lines = [head, "-" * len(head)]
        cumulative = 0.0
        for r in self.rows:
            cumulative += r.ticks
            lines.append(
                f"{r.operator:<44} {r.kernel:<18} {r.calls:>5} "
                f"{self.value(r.ticks):>13,.0f} {self.micros(r.ticks):>10,.1f} "
                f"{100 * r.ticks / total:>6.1f}% {100 * cumulative / total:>6.1f}%"
            )
        rest = self.total_ticks - self.operator_ticks
        lines.append(
            f"{'(runtime between operators)':<44} {'':<18} {'':>5} "
            f"{self.value(rest):>13,.0f} {self.micros(rest):>10,.1f} "
            f"{100 * rest / total:>6.1f}%"
        )
        lines.append(
            f"{'execute() total':<44} {'':<18} {self.iterations:>5} "
            f"{self.value(self.total_ticks):>13,.0f} "
            f"{self.micros(self.total_ticks):>10,.1f}"
        )
        return "\n".join(lines)


def _nested_counts(events: list[TraceEvent]) -> list[int]:
    """For each event, how many other events lie inside its [start, end]."""
    order = sorted(range(len(events)), key=lambda i: (events[i].start, -events[i].end))
    counts = [0] * len(events)
    stack: list[int] = []
    for i in order:
        e = events[i]
        while stack and events[stack[-1]].end < e.start:
            stack.pop()
        for j in stack:
            if events[j].end >= e.end:
                counts[j] += 1
        stack.append(i)
    return counts


def profile_from_records(
    records: RunRecords, instructions: dict[tuple[int, int], Instruction]
) -> Profile:
    """The profile of a run of profiling firmware. `instructions` maps (chain, instruction
    index) to what the program runs there (from the .pte, `program_instructions`)."""
    clock = records.trace_clock
    if clock is None:
        raise TraceError("no trace_clock record: the firmware was not built for profiling")
    events = [e for e in records.trace_events]
    executes = [e for e in events if e.name == EXECUTE]
    if not executes:
        raise TraceError("no Method::execute event: the run ended before execute() returned")
    nested = _nested_counts(events)
    timed = [
        EventTime(e, max(0.0, e.duration - clock.event_cost * n), n)
        for e, n in zip(events, nested, strict=True)
    ]
    total = sum(t.ticks for t in timed if t.event.name == EXECUTE)
    rows: dict[str, OperatorRow] = {}
    per_instruction: dict[tuple[int, int], InstructionTime] = {}
    for t in timed:
        e = t.event
        if e.name not in (OPERATOR_CALL, DELEGATE_CALL):
            continue
        what = instructions.get((e.chain, e.debug_handle))
        if what is None:
            name, kernel = f"instruction {e.chain}:{e.debug_handle}", "unknown"
        else:
            name, kernel = what.name, what.kernel
        row = rows.setdefault(name, OperatorRow(name, kernel, 0, 0.0))
        row.calls += 1
        row.ticks += t.ticks
        row.instructions.append(e.debug_handle)
        at = per_instruction.setdefault(
            (e.chain, e.debug_handle), InstructionTime(e.chain, e.debug_handle, name, 0, 0.0)
        )
        at.calls += 1
        at.ticks += t.ticks
    runner_ticks = None
    summary = records.trace_summary
    timing = records.timing
    if summary is not None and timing is not None and timing.tick_hz == clock.hz:
        runner_ticks = (
            summary.execute_ticks - summary.tracer_ticks - clock.event_cost * summary.events
        )
    return Profile(
        clock=clock.clock,
        clock_hz=clock.hz,
        event_cost=clock.event_cost,
        iterations=len(executes),
        total_ticks=total,
        rows=sorted(rows.values(), key=lambda r: -r.ticks),
        events=timed,
        runner_ticks=runner_ticks,
        tracer_bytes=clock.tracer_bytes,
        instructions=[per_instruction[k] for k in sorted(per_instruction)],
    )


def program_instructions(pte: bytes) -> dict[tuple[int, int], Instruction]:
    """(chain, instruction index) -> what runs there, read from the .pte."""
    from deploykit.readers.pte_reader import load_program, method_plan, operator_names

    program = load_program(pte, "the profiled program")
    plan = method_plan(program, "forward", "the profiled program")
    operators = operator_names(plan)
    backends = [d.id for d in plan.delegates]
    out: dict[tuple[int, int], Instruction] = {}
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            kind = type(instr.instr_args).__name__
            if kind == "KernelCall":
                op = operators[instr.instr_args.op_index]
                out[(c, i)] = Instruction(op, kernel_of(op))
            elif kind == "DelegateCall":
                index = instr.instr_args.delegate_index
                out[(c, i)] = Instruction(f"delegate {index} ({backends[index]})", "delegate")
    return out
