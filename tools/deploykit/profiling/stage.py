"""`deploykit profile`: build profiling firmware, run it, and write the per-operator profile.

The profiling firmware is the plain firmware plus deploykit's streaming EventTracer
(firmware/runner/event_tracer.cpp) on the board's event clock (boards/*.yaml
`timer.event_clock`), built into `<out>/firmware-profile`. The plain firmware is built and run
too, so that the RAM profiling adds is measured, not estimated: static RAM from the two
images, stack from the two runs' high-water marks.

Written to `<out>/profile/`: profile.json, profile.svg, model.etdump (ExecuTorch's ETDump,
rebuilt from the records; open it with the export's model.etrecord).

`deploykit run --debug-intermediates` (`debug_intermediates`): firmware that also streams every
operator's output tensor, built into `<out>/firmware-debug`, compared with the host operator by
operator (intermediates.py); written to `<out>/debug/intermediates.json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.profiling.chart import write_svg
from deploykit.profiling.etdump import write_etdump
from deploykit.profiling.intermediates import (
    IntermediatesReport,
    InterpretError,
    compare_intermediates,
)
from deploykit.program.costs import Island
from deploykit.program.inspect import NpuEstimate
from deploykit.readers.boards import Board

if TYPE_CHECKING:
    from deploykit.pipeline.target import Target
    from deploykit.program.export import ExportResult
    from deploykit.readers.execute_failure import LocatedFailure
    from deploykit.readers.protocol import RunRecords
    from deploykit.run.runners.base import RunResult
from deploykit.readers.trace import (
    Instruction,
    Profile,
    TraceError,
    profile_from_records,
    program_instructions,
)
from deploykit.run.runners.hang import EXECUTE_EVENT, OPERATOR_EVENTS
from deploykit.util.errors import ConfigError, DeployKitError, ExitCode, RunError
from deploykit.util.fsutil import write_atomic
from deploykit.util.jsonable import to_jsonable

PROFILE_DIR = "firmware-profile"


class ProfileError(DeployKitError):
    exit_code = ExitCode.PROTOCOL


DEBUG_DIR = "firmware-debug"


def event_clock(board: Board) -> dict:
    """The board's event clock (`timer.event_clock`), or a clear error without one."""
    clock = (board.timer or {}).get("event_clock")
    if not clock:
        raise ConfigError(
            f"board {board.name} names no event clock for profiling.",
            "Add timer.event_clock (kind: systick, dwt-cyccnt or pmu-ccnt; hz) to its board file.",
        )
    return clock


def trace_definitions(board: Board, intermediates: bool) -> dict[str, str]:
    """The CMake definitions of profiling firmware for `board`."""
    clock = event_clock(board)
    return {
        "DK_PROFILE_EVENTS": "ON",
        "DK_EVENT_CLOCK": str(clock["kind"]),
        "DK_EVENT_CLOCK_HZ": str(int(clock["hz"])),
        "DK_TRACE_INTERMEDIATES": "ON" if intermediates else "OFF",
    }


@dataclass
class RamCost:
    static_bytes: int  # .data + .bss of the profiling firmware minus the plain one's
    stack_bytes: int  # stack high-water mark of the profiling run minus the plain run's

    @property
    def total(self) -> int:
        return self.static_bytes + self.stack_bytes


@dataclass(frozen=True)
class IslandTime:
    """A fallback run or float island (program_costs.Island) and its time in the profile."""

    description: str  # Island.describe(): its instructions, operators and MACs
    is_float: bool
    ticks: float


def island_times(profile: Profile, islands: tuple[Island, ...],
                 program: dict[tuple[int, int], Instruction]) -> list[IslandTime]:
    """The time of each island. program_costs numbers the kernel and delegate calls of every
    chain in order, as the sorted (chain, instruction) keys of `program` do."""
    calls = sorted(program)
    ticks = {(i.chain, i.instruction): i.ticks for i in profile.instructions}
    return [IslandTime(island.describe(), island.is_float,
                       sum(ticks.get(k, 0.0) for k in calls[island.first:island.last + 1]))
            for island in islands]


def float_island_operators(profile: Profile, islands: tuple[Island, ...],
                           program: dict[tuple[int, int], Instruction]) -> frozenset[str]:
    """The operators that compute in a float island (their bars are hatched in the chart): its
    fallback kernels, not the dequantize and quantize around them, which are int8 kernels that
    mostly run outside islands."""
    calls = sorted(program)
    inside = set()
    for island in (i for i in islands if i.is_float):
        first, last = island.first, island.last
        # program/costs.py widens an island by the dequantize before it and the quantize after
        if last > first and island.ops[0].split(".")[0].endswith("dequantize_per_tensor"):
            first += 1
        tail = island.ops[-1].split(".")[0]
        if (last > first and tail.endswith("quantize_per_tensor")
                and not tail.endswith("dequantize_per_tensor")):
            last -= 1
        inside.update(calls[first:last + 1])
    return frozenset(i.operator for i in profile.instructions
                     if (i.chain, i.instruction) in inside)


@dataclass
class ProfileReport:
    board: str
    model: str
    flow: str
    profile: Profile
    ram: RamCost | None
    out_dir: Path
    files: dict[str, Path]
    plain_ticks: int | None  # the plain firmware's execute() ticks, for comparison
    # Ethos-U delegates: each call is one event (a DELEGATE_CALL row); the NPU's own cycles
    # come from the NPU firmware's records once an FVP runs it. Until then: Vela's estimate,
    # labelled as such, with Vela's per-operator split under it (also once the delegate's time
    # is measured: the split stays Vela's). delegate index -> Vela's estimate.
    npu_estimates: dict[int, NpuEstimate] = field(default_factory=dict)
    # The program's CPU fallbacks and float islands (inspect's list), with their time.
    islands: list[IslandTime] = field(default_factory=list)

    def text(self) -> str:
        p = self.profile
        lines = [
            f"profile of {self.model} ({self.flow}) on {self.board}: event clock {p.clock} "
            f"at {p.clock_hz:,} Hz, {p.unit} per tick {p.scale:.4g}",
            p.table(),
            "",
        ]
        ops = p.operator_ticks
        lines.append(
            f"operators add up to {p.value(ops):,.0f} of {p.value(p.total_ticks):,.0f} "
            f"{p.unit} of execute() ({100 * ops / (p.total_ticks or 1):.2f}%); the rest "
            "is the runtime between operators"
        )
        lines.append(
            f"tracer cost subtracted: its own ticks (counted on the device) and "
            f"{p.event_cost:.2f} ticks per event it cannot see (measured at start-up)"
        )
        if p.runner_ticks is not None and self.plain_ticks:
            lines.append(
                f"execute() as the runner timed it: plain firmware "
                f"{p.value(self.plain_ticks / p.iterations):,.0f} {p.unit}, "
                f"profiling firmware minus the tracer "
                f"{p.value(p.runner_ticks / p.iterations):,.0f} {p.unit} per run"
            )
        if self.ram is not None:
            lines.append(
                f"RAM profiling adds: {self.ram.total:,} B ({self.ram.static_bytes:,} B "
                f"static, {self.ram.stack_bytes:,} B stack peak)"
            )
        lines += [
            f"{island.description}: {p.value(island.ticks):,.0f} {p.unit}, "
            f"{100 * island.ticks / (p.total_ticks or 1):.1f}% of execute()"
            for island in self.islands
        ]
        for i, estimate in sorted(self.npu_estimates.items()):
            lines.append(f"delegate {i}: {estimate.describe()} (not measured)")
            if estimate.layers:
                lines.append(f"  its {len(estimate.layers)} NPU operators, Vela estimate (the "
                             "per-operator split is Vela's, not measured):")
            cycles, clock = estimate.total_cycles, estimate.clock_mhz
            lines += [f"    Vela estimate: {layer.describe(cycles, clock)}"
                      for layer in estimate.layers]
        lines += [f"{k}: {v}" for k, v in self.files.items()]
        return "\n".join(lines)

    def json(self) -> dict:
        p = self.profile
        return {
            "board": self.board,
            "model": self.model,
            "flow": self.flow,
            "clock": {
                "kind": p.clock,
                "hz": p.clock_hz,
                "unit": p.unit,
                "units_per_tick": p.scale,
                "event_cost_ticks": p.event_cost,
            },
            "iterations": p.iterations,
            "execute_ticks": p.total_ticks,
            "execute": p.value(p.total_ticks),
            "operators_ticks": p.operator_ticks,
            "runner_execute_ticks": p.runner_ticks,
            "plain_execute_ticks": self.plain_ticks,
            "operators": [
                {
                    "operator": r.operator,
                    "kernel": r.kernel,
                    "calls": r.calls,
                    "ticks": r.ticks,
                    p.unit: p.value(r.ticks),
                    "us": p.micros(r.ticks),
                    "share": r.ticks / (p.total_ticks or 1),
                    # the program's instructions this row covers ("instructions" is the time
                    # unit under QEMU: a key of its own, not to be overwritten)
                    "program_instructions": r.instructions,
                }
                for r in p.rows
            ],
            # Per instruction (chain, index of the .pte's method), for `explore --profile`.
            "instructions": [
                {
                    "chain": i.chain,
                    "instruction": i.instruction,
                    "operator": i.operator,
                    "calls": i.calls,
                    "ticks": i.ticks,
                    p.unit: p.value(i.ticks),
                    "share": i.ticks / (p.total_ticks or 1),
                }
                for i in p.instructions
            ],
            "npu_estimates": {str(i): e.describe() for i, e in self.npu_estimates.items()},
            "npu_layers": {str(i): [{**to_jsonable(layer), "source": "Vela estimate"}
                                    for layer in e.layers]
                           for i, e in self.npu_estimates.items()},
            "islands": [
                {
                    "island": i.description,
                    "float": i.is_float,
                    "ticks": i.ticks,
                    p.unit: p.value(i.ticks),
                    "share": i.ticks / (p.total_ticks or 1),
                }
                for i in self.islands
            ],
            "ram_bytes": (
                {
                    "total": self.ram.total,
                    "static": self.ram.static_bytes,
                    "stack": self.ram.stack_bytes,
                }
                if self.ram
                else None
            ),
            "files": {k: str(v) for k, v in self.files.items()},
        }


def profile_model(
    target: Target,
    model: str,
    out: Path,
    workspace: Path | None,
    timeout: float,
    progress: Callable[[str], None],
    *,
    fit: bool = False,
) -> ProfileReport:
    from deploykit.pipeline.chains import FirmwareVariant, build_firmware

    board = target.board
    definitions = trace_definitions(board, intermediates=False)
    plain = build_firmware(target, model, out, workspace, progress, fit=fit, timeout=timeout)
    progress(
        "building the profiling firmware (the runtime with its EventTracer hooks is cached "
        "under its own key)"
    )
    traced = build_firmware(
        target,
        model,
        out,
        workspace,
        progress,
        fit=fit,
        timeout=timeout,
        variant=FirmwareVariant(PROFILE_DIR, definitions),
    )
    runner = target.make_runner(workspace, progress)
    progress(f"running the plain firmware on {runner.kind}")
    exported = traced.planned.export
    program = program_instructions(exported.pte_path.read_bytes())
    plain_run = runner.run(
        plain.firmware.elf, out / "profile" / "plain", timeout_s=timeout, check=False
    )
    if not plain_run.records.execute_errors:  # a failed execute() is profiled up to it
        plain_run.check()
    progress(f"running the profiling firmware on {runner.kind}")
    run = runner.run(traced.firmware.elf, out / "profile", timeout_s=timeout, check=False)
    if run.records.execute_errors:
        raise failed_execute(run, exported, program)
    run.check()
    try:
        profile = profile_from_records(run.records, program)
    except TraceError as exc:
        raise ProfileError(
            f"the profiling run cannot be read: {exc}",
            f"See the console log under {out / 'profile'}.",
        ) from exc
    if run.icount_shift is not None and profile.clock == "systick":
        profile.unit, profile.scale = (
            "instructions",
            1e9 / ((1 << run.icount_shift) * profile.clock_hz),
        )
    elif profile.clock in ("dwt-cyccnt", "pmu-ccnt"):
        profile.unit = "cycles"
    ram = None
    plain_mem = plain_run.records.memory.entries if plain_run.records.memory else {}
    traced_mem = run.records.memory.entries if run.records.memory else {}
    if "stack" in plain_mem and "stack" in traced_mem:
        ram = RamCost(
            traced.firmware.sizes.static_data - plain.firmware.sizes.static_data,
            traced_mem["stack"][0] - plain_mem["stack"][0],
        )
    prof_dir = out / "profile"
    files = {
        "profile.json": prof_dir / "profile.json",
        "chart": prof_dir / "profile.svg",
        "etdump": prof_dir / "model.etdump",
    }
    etrecord = exported.pte_path.parent / "model.etrecord"
    if etrecord.exists():
        files["etrecord"] = etrecord
    write_etdump(profile, files["etdump"])
    islands = traced.planned.program.islands
    write_svg(
        profile,
        f"{exported.model_name} ({target.flow.name}) on {board.name}: {profile.unit} per "
        "operator",
        files["chart"],
        float_island_operators(profile, islands, program),
    )
    plain_timing = plain_run.records.timing
    report = ProfileReport(
        board.name,
        exported.model_name,
        target.flow.name,
        profile,
        ram,
        prof_dir,
        files,
        plain_timing.ticks if plain_timing else None,
        {
            d.index: d.vela_estimate
            for d in traced.planned.program.delegates
            if d.vela_estimate is not None
        },
        island_times(profile, islands, program),
    )
    write_atomic(files["profile.json"], json.dumps(report.json(), indent=2) + "\n")
    return report


def operators_before_failure(records: RunRecords, located: LocatedFailure | None,
                             instructions: dict[tuple[int, int], Instruction]) -> list[str]:
    """The operators the failed execute() call ran before its failing instruction, in order,
    with their event-clock ticks (from the profiling firmware's events: each is sent when it
    ends, the failing one's too)."""
    events = records.trace_events
    last = max((i for i, e in enumerate(events) if e.name == EXECUTE_EVENT), default=-1)
    failed = (located.chain, located.instruction) if located is not None else None
    lines = []
    for e in events[last + 1:]:
        if e.name not in OPERATOR_EVENTS or (e.chain, e.debug_handle) == failed:
            continue
        what = instructions.get((e.chain, e.debug_handle))
        name = what.name if what is not None else "?"
        lines.append(f"instruction {e.debug_handle} ({name}): {e.duration:,} ticks")
    return lines


def failed_execute(run: RunResult, exported: ExportResult,
                    instructions: dict[tuple[int, int], Instruction]) -> RunError:
    """A profiling run whose execute() failed: where (instruction, operator, model line, the
    kernel's message), and the operators that ran before it with their times."""
    from deploykit.pipeline.chains import locate_execute_failure

    located = locate_execute_failure(run, exported)
    outcome = run.outcome()
    ran = operators_before_failure(run.records, located, instructions)
    calls = sum(1 for e in run.records.trace_events if e.name == EXECUTE_EVENT) + 1
    listing = (f"Operators that ran before it in execute() call {calls} (event clock "
               f"{run.records.trace_clock.clock if run.records.trace_clock else '?'}):\n"
               + "\n".join(f"  {line}" for line in ran) if ran
               else "No operator ran before it.")
    return RunError(f"{outcome.cause}\n{listing}", outcome.hint, exit_code=outcome.exit_code,
                    log_path=str(run.console_log))


@dataclass
class DebugReport:
    board: str
    model: str
    flow: str
    intermediates: IntermediatesReport
    path: Path
    # Where the device's execute() failed (readers/execute_failure.py), None when it did not.
    failure: str | None = None

    @property
    def diverged(self) -> bool:
        return self.intermediates.first_divergence is not None

    def text(self) -> str:
        failed = f"on the device, {self.failure}\n" if self.failure else ""
        return (
            f"operator outputs of {self.model} ({self.flow}) on {self.board}, device vs "
            f"host, in execution order:\n{failed}{self.intermediates.table()}\n"
            f"intermediates.json: {self.path}"
        )

    def json(self) -> dict:
        return {
            "board": self.board,
            "model": self.model,
            "flow": self.flow,
            "execute_failure": self.failure,
            **self.intermediates.json(),
        }


def debug_intermediates(
    target: Target,
    model: str,
    out: Path,
    workspace: Path | None,
    timeout: float,
    progress: Callable[[str], None],
    *,
    fit: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
    device_pte: bytes | None = None,
) -> DebugReport:
    """Build the firmware that streams every operator's output, run it, and compare each
    output with the host's run of the same program on the same inputs (the first input set).
    `device_pte`: run this program on the device instead of the export's (same operators and
    memory plan, e.g. one with a changed constant); the host still runs the export's."""
    from deploykit.pipeline.chains import FirmwareVariant, build_firmware

    board = target.board
    definitions = trace_definitions(board, intermediates=True)
    progress("building the firmware that streams every operator's output")
    built = build_firmware(
        target,
        model,
        out,
        workspace,
        progress,
        fit=fit,
        timeout=timeout,
        variant=FirmwareVariant(DEBUG_DIR, definitions, device_pte),
    )
    runner = target.make_runner(workspace, progress)
    progress(f"running it on {runner.kind}")
    run = runner.run(built.firmware.elf, out / "debug", timeout_s=timeout, check=False)
    exported = built.planned.export
    located = None
    if run.records.execute_errors:  # compared up to the instruction that failed
        from deploykit.pipeline.chains import locate_execute_failure

        located = locate_execute_failure(run, exported)
    else:
        run.check()
    failed_at = (located.chain, located.instruction) if located is not None \
        and located.chain is not None and located.instruction is not None else None
    tolerance = exported.tolerance
    progress("running the same program on the host, operator by operator")
    try:
        report = compare_intermediates(
            run.records,
            exported.pte_path.read_bytes(),
            exported.input_sets[0],
            atol=tolerance.get("atol", 0.0) if atol is None else atol,
            rtol=tolerance.get("rtol", 0.0) if rtol is None else rtol,
            failed_at=failed_at,
        )
    except InterpretError as exc:
        raise ProfileError(
            f"the host cannot run the program operator by operator: {exc}",
            "--debug-intermediates needs a program of CPU kernels.",
        ) from exc
    path = out / "debug" / "intermediates.json"
    result = DebugReport(board.name, exported.model_name, target.flow.name, report, path,
                         located.text if located is not None else None)
    write_atomic(path, json.dumps(result.json(), indent=2, allow_nan=False) + "\n")
    return result
