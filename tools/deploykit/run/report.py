"""The run report: what one `deploykit run` found, in text and JSON (run/result.json).

Built by pipeline.run_firmware from the device's records and the export's references: the
parity verdict per output, the statistics over input sets, the timing, the memory peaks, and,
for Ethos-U firmware, each NPU call's measured cycles beside Vela's estimate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deploykit.flows.conv1d_as_conv2d import describe as describe_conv1d
from deploykit.flows.elementwise_lut import describe as describe_lookup_tables
from deploykit.flows.layer_norm_int8 import describe as describe_int8_layer_norms
from deploykit.flows.mixed_precision import describe_float
from deploykit.program.inspect import ProgramInfo
from deploykit.readers.protocol import RunRecords
from deploykit.run.validate import Verdict
from deploykit.util.errors import ExitCode
from deploykit.util.jsonable import to_jsonable


@dataclass(frozen=True)
class SetStatistics:
    """Aggregates over the input sets of one run (`deploykit run --inputs DIR`)."""

    count: int
    top1_agreement: float | None  # fraction of sets whose device top-1 equals the host's
    accuracy_device: float | None  # device top-1 vs labels.json, when labels were given
    accuracy_host: float | None
    labelled: int = 0

    def describe(self) -> str:
        parts = [f"{self.count} input sets"]
        if self.top1_agreement is not None:
            parts.append(f"device/host top-1 agreement {self.top1_agreement:.1%}")
        if self.accuracy_device is not None:
            parts.append(f"accuracy on {self.labelled} labels: device "
                         f"{self.accuracy_device:.1%}, host {self.accuracy_host:.1%}")
        return ", ".join(parts)


@dataclass(frozen=True)
class NpuCall:
    """One Ethos-U delegate call as the device measured it, with Vela's estimate of it."""

    call: int  # in the order of the run (input set after input set)
    delegate: int  # the .pte's delegate index
    npu_cycles: int  # the NPU's PMU cycle counter over the command stream
    cpu_ticks: int  # the CPU timer over the whole delegate call (driver included)
    counters: dict[str, int]  # PMU event counters by name (AXI/SRAM/external beats, idle, ...)
    vela_estimate_cycles: int | None  # Vela's total cycles for the delegate, when known

    def describe(self) -> str:
        text = (f"NPU call {self.call} (delegate {self.delegate}): {self.npu_cycles:,} NPU "
                f"cycles, {self.cpu_ticks:,} CPU ticks")
        if self.vela_estimate_cycles:
            text += (f" (Vela estimated {self.vela_estimate_cycles:,} cycles: "
                     f"{self.npu_cycles / self.vela_estimate_cycles:.2f}x)")
        if self.counters:
            text += "; " + ", ".join(f"{k} {v:,}" for k, v in self.counters.items())
        return text


def int8_rewrite_notes(mixed_precision: dict[str, Any]) -> list[str]:
    """The export's and the run's lines on what the cortex_m flow rewrote into int8 (from
    export.json's `mixed_precision`): Conv1d as Conv2d, table lookups, int8 LayerNorms."""
    return [*describe_conv1d(mixed_precision), *describe_lookup_tables(mixed_precision),
            *describe_int8_layer_norms(mixed_precision)]


@dataclass
class RunReport:
    board: str
    model: str
    flow: str
    passed: bool
    exit_code: ExitCode
    verdict: Verdict | None
    reference_kind: str
    # Why the reference is a fallback (the cortex_m flow's PT2E model), "" where it is not.
    reference_fallback: str = ""
    ticks: int | None = None
    tick_hz: int | None = None
    # What emulated the CPU when the ticks are emulated time (runners' RunResult.emulated_by).
    timing_emulated_by: str | None = None
    instructions_estimate: float | None = None
    memory: dict[str, tuple[int, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The pools more than 25% above their peaks (memory/fit.check_peaks): the detail of the
    # one line the summary ends with (`memory_advice`), shown with `verbose`.
    oversized_pools: list[str] = field(default_factory=list)
    memory_advice: str = ""
    elf: Path | None = None
    flash_bytes: int = 0
    cause: str = ""
    log: Path | None = None
    device_outputs: list[list[float]] = field(default_factory=list)
    input_sets: SetStatistics | None = None
    # Ethos-U firmware: one entry per delegate call (NPU cycles from its PMU, the call's CPU
    # ticks, the PMU event counters), beside Vela's estimate for the same delegate.
    npu_calls: list[NpuCall] = field(default_factory=list)
    # int8 flows: the operators that ran in float (export.json's mixed_precision).
    mixed_precision: dict[str, Any] = field(default_factory=dict)
    # Where a failed execute() stopped (readers/execute_failure.LocatedFailure's fields: the
    # instruction, operator, model line, the kernel's call and status); None otherwise.
    execute_failure: dict[str, Any] | None = None
    # Every decoded record of the run (for the HIL plugin); not part of the JSON report.
    records: RunRecords | None = field(default=None, repr=False, metadata={"json": False})

    def summary(self, verbose: bool = False) -> str:
        """The report; `verbose` adds the detail of the memory advice (each oversized pool)."""
        lines = [f"{self.model} ({self.flow}) on {self.board}: "
                 f"{'PASS' if self.passed else 'FAIL'}" + (f": {self.cause}" if self.cause
                                                            else "")]
        if self.verdict and not self.passed and not any(self.device_outputs):
            lines.append("  outputs: none arrived (the device stopped before sending them)")
        elif self.verdict:
            for o in self.verdict.outputs:
                lines.append(
                    f"  output {o.index} {list(o.shape)}: max abs err {o.max_abs_error:.3g}, "
                    f"mean {o.mean_abs_error:.3g}, cosine {o.cosine_similarity:.6f}"
                    + (f", top-1 {'agrees' if o.top1_agrees else 'DIFFERS'}, top-"
                       f"{min(5, o.shape[-1])} overlap {o.topk_overlap:.0%}"
                       if o.top1_agrees is not None else "")
                    + f" (atol {o.tolerance.atol:.3g}) {'ok' if o.passed else 'MISMATCH'}"
                    + (f": {o.problem}" if o.problem else ""))
            lines.append(f"  reference: {self.reference_kind}"
                         + (f" (fallback: {self.reference_fallback})"
                            if self.reference_fallback else ""))
        elif self.reference_kind == "none":
            lines.append("  reference: none; the outputs below were not compared with anything")
        lines += [f"  {line}" for line in int8_rewrite_notes(self.mixed_precision)]
        lines += [f"  {line}" for line in describe_float(self.mixed_precision)]
        if self.input_sets and self.input_sets.count > 1:
            lines.append(f"  {self.input_sets.describe()}")
        for i, values in enumerate(self.device_outputs):
            shown = ", ".join(f"{v:.5g}" for v in values[:10])
            lines.append(f"  device output {i}: [{shown}{', ...' if len(values) > 10 else ''}]")
        if self.ticks is not None:
            per = self.input_sets.count if self.input_sets else 1
            lines.append(f"  execute: {self.ticks:,} ticks at {self.tick_hz:,} Hz"
                         + (f" for {per} inferences" if per > 1 else "")
                         + (f" = ~{self.instructions_estimate:,.0f} instructions per inference "
                            "(QEMU icount)"
                            if self.instructions_estimate else ""))
            if self.timing_emulated_by:
                lines.append(f"  execute time is emulated ({self.timing_emulated_by}): "
                             "no measurement of the board")
        for c in self.npu_calls:
            lines.append(f"  {c.describe()}")
        for name, (used, cap) in sorted(self.memory.items()):
            lines.append(f"  {name:<14} peak {used:>9,} B of {cap:>9,} B")
        lines += [f"  warning: {w}" for w in self.warnings]
        if verbose:
            lines += [f"  {w}" for w in self.oversized_pools]
        if self.elf:
            lines.append(f"  firmware {self.elf} ({self.flash_bytes:,} B flash)")
        if self.memory_advice:
            lines.append(f"  {self.memory_advice}")
        return "\n".join(lines)


def memory_advice(memory: dict[str, tuple[int, int]], oversized: list[str],
                  command: str = "run") -> str:
    """The one line a report ends with when pools were linked above their peaks: how to get
    exact memory (--fit), instead of one warning per pool (those are the detail)."""
    if not oversized:
        return ""
    used = sum(u for u, _c in memory.values())
    linked = sum(c for _u, c in memory.values())
    return (f"memory: {used:,} B used of {linked:,} B linked; `deploykit {command} --fit` "
            "measures the model once and links its pools, stack and heap exact "
            "(detail: --verbose or --json)")


def npu_calls_of(records: RunRecords, program: ProgramInfo) -> list[NpuCall]:
    """The device's npu records, each tied to its delegate: the runtime calls the delegates
    in execution order, once per inference."""
    order = [s.delegate for s in program.segments if s.kind == "delegate"]
    if not order:
        return []
    calls = []
    for run in records.npu_runs:
        index = order[run.call % len(order)]
        estimate = program.delegates[index].vela_estimate
        calls.append(NpuCall(run.call, index, run.npu_cycles, run.cpu_ticks,
                             dict(run.counters),
                             estimate.total_cycles if estimate is not None else None))
    return calls


def set_statistics(device_sets: list[list[np.ndarray | None]],
                    host_sets: list[list[np.ndarray]], labels_file: Path) -> SetStatistics:
    """Top-1 agreement and label accuracy on output 0, for classifier-shaped outputs."""
    # By set index: a set whose device output is missing drops out of every statistic, and
    # the labels (by set index too) stay with their own sets.
    pairs = {k: (d[0], h[0]) for k, (d, h) in enumerate(zip(device_sets, host_sets, strict=True))
             if d and d[0] is not None and h[0].ndim >= 1 and h[0].shape[-1] > 1}
    if not pairs:
        return SetStatistics(len(device_sets), None, None, None)

    def top1(a: np.ndarray) -> int:
        return int(np.asarray(a).reshape(-1, a.shape[-1])[0].argmax())

    device_top = {k: top1(d) for k, (d, _h) in pairs.items()}
    host_top = {k: top1(h) for k, (_d, h) in pairs.items()}
    agree = sum(device_top[k] == host_top[k] for k in pairs) / len(pairs)
    labels: list[int | None] = []
    if labels_file.exists():
        labels = json.loads(labels_file.read_text())["labels"]
    known = [(k, lab) for k, lab in enumerate(labels) if lab is not None and k in pairs]
    if not known:
        return SetStatistics(len(device_sets), agree, None, None)
    acc_dev = sum(device_top[k] == lab for k, lab in known) / len(known)
    acc_host = sum(host_top[k] == lab for k, lab in known) / len(known)
    return SetStatistics(len(device_sets), agree, acc_dev, acc_host, len(known))


def as_host_dtype(data: np.ndarray, quant) -> np.ndarray:
    """An int8 device output of a float model output (int8 model I/O, the speed profile):
    dequantized with the parameters of the dequantize the export removed, in float32 as
    PyTorch's dequantize_per_tensor computes it, so it compares with the float reference
    exactly as a float output would."""
    if quant is None or data.dtype != np.int8:
        return data
    return (data.astype(np.float32) - np.float32(quant.zero_point)) * np.float32(quant.scale)


def logical_order(data: np.ndarray, dim_order: list[int]) -> np.ndarray:
    """Device bytes are in the tensor's memory order; bring them back to logical order."""
    if list(dim_order) == sorted(dim_order):
        return data
    physical_shape = [data.shape[d] for d in dim_order]
    return data.reshape(physical_shape).transpose(np.argsort(dim_order))


def report_json(report: RunReport) -> dict:
    return to_jsonable(report)
