"""The records of the deploykit result protocol, version 1 (docs/protocol.md).

Frame constants, the payload layouts, the codes the device sends (record types, done status,
ExecuTorch scalar types, fault registers) and one class per record type. The decoder
(`decoder.py`) builds these records; the reference encoder the tests use packs the same layouts.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

import numpy as np

MAGIC = b"\xa5DK"
VERSION = 1
HEADER_SIZE = 12
CRC_SIZE = 4
MAX_PAYLOAD = 65536
SEQ_MODULO = 65536
UINT64_MAX = 0xFFFF_FFFF_FFFF_FFFF
DEFAULT_MAX_TENSOR_BYTES = 64 * 1024 * 1024

HEADER_STRUCT = struct.Struct("<3sBBBHI")  # magic, version, type, flags, seq, length
TENSOR_HEAD_STRUCT = struct.Struct("<HBB")  # index, dtype, ndim
TENSOR_TAIL_STRUCT = struct.Struct("<fiII")  # scale, zero_point, total_nbytes, offset
TIMING_STRUCT = struct.Struct("<QIIQ")  # ticks, tick_hz, iterations, instructions
DONE_STRUCT = struct.Struct("<II")  # status, records sent before done
FAULT_STRUCT = struct.Struct("<13I")  # FAULT_REGISTERS, in that order
NPU_HEAD_STRUCT = struct.Struct("<IQQB")  # call, npu_cycles, cpu_ticks, counter count
# Profiling firmware only (docs/protocol.md, types 10-13).
TRACE_CLOCK_STRUCT = struct.Struct("<BBHIIII")  # kind, debug level, 0, hz, cost_q8, pairs, bytes
TRACE_EVENT_STRUCT = struct.Struct("<iIiQQB")  # chain, debug handle, delegate id, start, end, n
TRACE_TENSOR_PREFIX_STRUCT = struct.Struct("<iIHBB")  # chain, debug handle, ordinal, kind, 0
TRACE_SUMMARY_STRUCT = struct.Struct("<QQII")  # execute ticks, tracer ticks, events, iterations
# Serve firmware only (docs/protocol.md, "Host -> device").
SAMPLE_DONE_STRUCT = struct.Struct("<IIQHH")  # sample, status, ticks, run frame's seq, 0
READY_HEAD_STRUCT = struct.Struct("<HH")  # inputs, outputs
READY_TENSOR_STRUCT = struct.Struct("<BBI")  # dtype, ndim, nbytes; then sizes, dim order
EXECUTE_ERROR_STRUCT = struct.Struct("<IIi")  # Error code, step, kernel status; then the call
EXECUTE_STEP_NONE = 0xFFFF_FFFF  # execute() failed before its first instruction


class RecordType(IntEnum):
    HELLO = 1
    TENSOR = 2
    TIMING = 3
    MEMORY = 4
    ERROR = 5
    FAULT = 6
    DONE = 7
    LOG = 8
    NPU = 9
    TRACE_CLOCK = 10
    TRACE_EVENT = 11
    TRACE_TENSOR = 12
    TRACE_SUMMARY = 13
    SAMPLE_DONE = 14
    READY = 15
    EXECUTE_ERROR = 16


class DoneStatus(IntEnum):
    OK = 0
    EXECUTORCH_ERROR = 1
    FAULT = 2
    POOL_TOO_SMALL = 3


# ExecuTorch ScalarType code -> little-endian numpy dtype (the codes docs/protocol.md lists).
SCALAR_TYPES: dict[int, np.dtype] = {
    0: np.dtype("u1"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    6: np.dtype("<f4"),
    7: np.dtype("<f8"),
    11: np.dtype("?"),
}
SCALAR_TYPE_NAMES: dict[int, str] = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 6: "float32", 7: "float64",
    11: "bool",
}

FAULT_REGISTERS: tuple[str, ...] = (
    "r0", "r1", "r2", "r3", "r12", "lr", "pc", "xpsr",
    "cfsr", "hfsr", "mmfar", "bfar", "exc_return",
)

# Configurable Fault Status Register bits (ARMv7-M / ARMv8-M): MMFSR, BFSR, UFSR.
CFSR_BITS: dict[int, str] = {
    0: "IACCVIOL", 1: "DACCVIOL", 3: "MUNSTKERR", 4: "MSTKERR", 5: "MLSPERR", 7: "MMARVALID",
    8: "IBUSERR", 9: "PRECISERR", 10: "IMPRECISERR", 11: "UNSTKERR", 12: "STKERR",
    13: "LSPERR", 15: "BFARVALID",
    16: "UNDEFINSTR", 17: "INVSTATE", 18: "INVPC", 19: "NOCP", 20: "STKOF",
    24: "UNALIGNED", 25: "DIVBYZERO",
}
HFSR_BITS: dict[int, str] = {1: "VECTTBL", 30: "FORCED", 31: "DEBUGEVT"}


def _flags(value: int, bits: Mapping[int, str]) -> list[str]:
    return [name for bit, name in sorted(bits.items()) if value >> bit & 1]


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------

@dataclass
class Hello:
    TYPE: ClassVar[RecordType] = RecordType.HELLO
    fields: dict[str, str]
    seq: int = field(default=-1, compare=False)

    @property
    def board(self) -> str | None:
        return self.fields.get("board")

    @property
    def firmware(self) -> str | None:
        return self.fields.get("firmware")


@dataclass(eq=False)
class Tensor:
    """One output tensor, reassembled from all its chunks. `dtype` is the ScalarType code."""

    TYPE: ClassVar[RecordType] = RecordType.TENSOR
    index: int
    dtype: int
    sizes: tuple[int, ...]
    scale: float
    zero_point: int
    data: np.ndarray
    seq: int = -1  # seq of the chunk that completed the tensor; not compared

    @property
    def dtype_name(self) -> str:
        return SCALAR_TYPE_NAMES.get(self.dtype, f"scalar_type_{self.dtype}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        return (
            self.index == other.index and self.dtype == other.dtype
            and tuple(self.sizes) == tuple(other.sizes)
            and struct.pack("<f", self.scale) == struct.pack("<f", other.scale)
            and self.zero_point == other.zero_point
            and self.data.dtype == other.data.dtype and self.data.shape == other.data.shape
            and self.data.tobytes() == other.data.tobytes()
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Timing:
    TYPE: ClassVar[RecordType] = RecordType.TIMING
    ticks: int
    tick_hz: int
    iterations: int
    instructions: int | None  # None when the device sent UINT64_MAX (unknown)
    seq: int = field(default=-1, compare=False)

    @property
    def seconds(self) -> float | None:
        return self.ticks / self.tick_hz if self.tick_hz else None

    @property
    def ticks_per_iteration(self) -> float | None:
        return self.ticks / self.iterations if self.iterations else None


@dataclass
class Memory:
    TYPE: ClassVar[RecordType] = RecordType.MEMORY
    entries: dict[str, tuple[int, int]]  # name -> (used high-water mark, capacity)
    seq: int = field(default=-1, compare=False)


@dataclass
class DeviceError:
    TYPE: ClassVar[RecordType] = RecordType.ERROR
    code: int
    message: str
    seq: int = field(default=-1, compare=False)


# CMSIS-NN's arm_cmsis_nn_status (Include/arm_nn_types.h), the status an execute_error
# record's kernel call returned.
CMSIS_NN_STATUS: dict[int, str] = {
    0: "ARM_CMSIS_NN_SUCCESS",
    -1: "ARM_CMSIS_NN_ARG_ERROR",
    -2: "ARM_CMSIS_NN_NO_IMPL_ERROR",
    -3: "ARM_CMSIS_NN_FAILURE",
}


@dataclass
class ExecuteError:
    """Where a failed execute() stopped (every runner firmware, sent before its `error`
    record): the ExecuTorch Error code, the step (the instructions execute() ran before the
    one that failed; None when it failed before its first) and, when a kernel's library call
    refused, that function and its status (CMSIS-NN: ARM_CMSIS_NN_*)."""

    TYPE: ClassVar[RecordType] = RecordType.EXECUTE_ERROR
    code: int
    step: int | None
    kernel_status: int
    kernel_call: str  # "" when no library call refused
    seq: int = field(default=-1, compare=False)

    @property
    def kernel_message(self) -> str | None:
        """ "arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_FAILURE", or None."""
        if not self.kernel_call:
            return None
        status = CMSIS_NN_STATUS.get(self.kernel_status, f"status {self.kernel_status}")
        return f"{self.kernel_call} returned {status}"


@dataclass
class Fault:
    TYPE: ClassVar[RecordType] = RecordType.FAULT
    registers: dict[str, int]  # FAULT_REGISTERS -> value
    seq: int = field(default=-1, compare=False)

    @property
    def cfsr_flags(self) -> list[str]:
        return _flags(self.registers.get("cfsr", 0), CFSR_BITS)

    @property
    def hfsr_flags(self) -> list[str]:
        return _flags(self.registers.get("hfsr", 0), HFSR_BITS)

    def describe(self) -> str:
        r = self.registers
        parts = [f"pc=0x{r.get('pc', 0):08x} lr=0x{r.get('lr', 0):08x}"]
        flags = self.cfsr_flags
        parts.append(f"CFSR=0x{r.get('cfsr', 0):08x} [{', '.join(flags) or 'no flags'}]")
        parts.append(f"HFSR=0x{r.get('hfsr', 0):08x} [{', '.join(self.hfsr_flags) or 'no flags'}]")
        if "MMARVALID" in flags:
            parts.append(f"MMFAR=0x{r.get('mmfar', 0):08x}")
        if "BFARVALID" in flags:
            parts.append(f"BFAR=0x{r.get('bfar', 0):08x}")
        return ", ".join(parts)


@dataclass
class Done:
    TYPE: ClassVar[RecordType] = RecordType.DONE
    status: int
    records: int  # records the device sent before this one
    seq: int = field(default=-1, compare=False)


@dataclass
class Log:
    TYPE: ClassVar[RecordType] = RecordType.LOG
    text: str
    seq: int = field(default=-1, compare=False)


@dataclass
class NpuRun:
    """One NPU command stream run (one delegate call) of Ethos-U firmware: the NPU's PMU cycle
    counter, the CPU ticks of the whole delegate call, and the PMU event counters by name
    (U55: axi0_rd_beats, axi0_wr_beats, axi1_rd_beats, idle_cycles; U85: sram_rd_beats,
    sram_wr_beats, ext_rd_beats, ext_wr_beats, idle_cycles, mac_active_cycles)."""

    TYPE: ClassVar[RecordType] = RecordType.NPU
    call: int
    npu_cycles: int
    cpu_ticks: int
    counters: dict[str, int]
    seq: int = field(default=-1, compare=False)


# The event clock of a `trace_clock` record (a board fact: boards/*.yaml timer.event_clock).
EVENT_CLOCKS: dict[int, str] = {1: "systick", 2: "dwt-cyccnt", 3: "pmu-ccnt"}


@dataclass
class TraceClock:
    """Profiling firmware: the event clock, and what one event costs that the tracer cannot
    subtract itself (`event_cost` ticks per start/end pair, measured at start-up)."""

    TYPE: ClassVar[RecordType] = RecordType.TRACE_CLOCK
    clock: str
    debug_level: int  # 0 events only, 2 with every operator's output tensors
    hz: int
    event_cost_q8: int  # ticks x 256
    calibration_pairs: int
    tracer_bytes: int  # sizeof the firmware's tracer object
    seq: int = field(default=-1, compare=False)

    @property
    def event_cost(self) -> float:
        return self.event_cost_q8 / 256.0


@dataclass
class TraceEvent:
    """One profiling event: its name (OPERATOR_CALL, native_call_<op>, DELEGATE_CALL,
    Method::execute, ...), the instruction it belongs to, and its start and end on the event
    clock with the tracer's own ticks taken out."""

    TYPE: ClassVar[RecordType] = RecordType.TRACE_EVENT
    name: str
    chain: int
    debug_handle: int
    delegate_id: int  # -1 unless a delegate's own event
    start: int
    end: int
    seq: int = field(default=-1, compare=False)

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass(eq=False)
class TraceTensor:
    """One tensor an operator produced (run --debug-intermediates), reassembled from its
    chunks: the instruction, its ordinal among the values that instruction logged, and whether
    it is an intermediate (0) or a program output (1)."""

    TYPE: ClassVar[RecordType] = RecordType.TRACE_TENSOR
    chain: int
    debug_handle: int
    ordinal: int
    kind: int
    tensor: Tensor
    seq: int = -1


@dataclass
class TraceSummary:
    TYPE: ClassVar[RecordType] = RecordType.TRACE_SUMMARY
    execute_ticks: int  # every execute(), on the timing record's clock, tracer included
    tracer_ticks: int  # the tracer's own ticks inside them, on the event clock
    events: int  # the events ended inside them
    iterations: int
    seq: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of the method serve firmware loaded (`ready`): its dtype (the
    ScalarType code), logical sizes, dim order (the memory order its bytes travel in) and
    size in bytes."""

    dtype: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    nbytes: int

    @property
    def dtype_name(self) -> str:
        return SCALAR_TYPE_NAMES.get(self.dtype, f"scalar_type_{self.dtype}")

    def describe(self) -> str:
        """ "float32 [1, 3, 8, 8]" (with the dim order when it is not the identity)."""
        order = ("" if list(self.dim_order) == sorted(self.dim_order)
                 else f" dim order {list(self.dim_order)}")
        return f"{self.dtype_name} {list(self.sizes)}{order}"


@dataclass
class Ready:
    """Serve firmware loaded its method and takes samples: what the method takes and returns."""

    TYPE: ClassVar[RecordType] = RecordType.READY
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    seq: int = field(default=-1, compare=False)


@dataclass
class SampleDone:
    """Serve firmware's answer to a host `run` frame (whose seq `run_seq` echoes): the sample,
    its status (0, or the code of the error record sent before it) and its execute() ticks. The
    sample's output tensors come right before it."""

    TYPE: ClassVar[RecordType] = RecordType.SAMPLE_DONE
    sample: int
    status: int
    ticks: int
    run_seq: int
    seq: int = field(default=-1, compare=False)


Record = (Hello | Tensor | Timing | Memory | DeviceError | Fault | Done | Log | NpuRun
          | TraceClock | TraceEvent | TraceTensor | TraceSummary | Ready | SampleDone
          | ExecuteError)

