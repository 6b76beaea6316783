"""Reference encoder for the deploykit result protocol, version 1 (docs/protocol.md).

The tests round-trip records through it into the decoder (`deploykit.readers.protocol`) and use
it to stand in for a device: stand-in ELFs under QEMU, a stand-in FVP. It lives with the tests
because deploykit itself never sends records; the firmware's encoder is
`firmware/protocol/dk_protocol.c`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from deploykit.readers.protocol.records import (
    DONE_STRUCT,
    EXECUTE_ERROR_STRUCT,
    EXECUTE_STEP_NONE,
    FAULT_REGISTERS,
    FAULT_STRUCT,
    MAGIC,
    MAX_PAYLOAD,
    NPU_HEAD_STRUCT,
    READY_HEAD_STRUCT,
    READY_TENSOR_STRUCT,
    SAMPLE_DONE_STRUCT,
    SCALAR_TYPES,
    SEQ_MODULO,
    TENSOR_HEAD_STRUCT,
    TENSOR_TAIL_STRUCT,
    TIMING_STRUCT,
    TRACE_CLOCK_STRUCT,
    TRACE_EVENT_STRUCT,
    TRACE_SUMMARY_STRUCT,
    TRACE_TENSOR_PREFIX_STRUCT,
    UINT64_MAX,
    VERSION,
    RecordType,
)

DTYPE_CODES: dict[np.dtype, int] = {dt.newbyteorder("<"): code
                                    for code, dt in SCALAR_TYPES.items()}


def encode_record(rtype: int, seq: int, payload: bytes, *, version: int = VERSION,
                  flags: int = 0) -> bytes:
    """One frame: magic, header, payload, CRC-32 of version..payload."""
    body = struct.pack("<BBBHI", version, int(rtype), flags, seq % SEQ_MODULO,
                       len(payload)) + bytes(payload)
    return MAGIC + body + struct.pack("<I", zlib.crc32(body))


def hello_payload(fields: Mapping[str, str]) -> bytes:
    return "\n".join(f"{k}={v}" for k, v in fields.items()).encode("utf-8")


def tensor_payloads(index: int, array: np.ndarray, *, scale: float = 0.0, zero_point: int = 0,
                    chunk_size: int | None = None) -> list[bytes]:
    """The chunk payloads of one output tensor, in order (`chunk_size` data bytes each)."""
    arr = np.asarray(array)  # (not ascontiguousarray: it turns a 0-d array into 1-d)
    code = DTYPE_CODES[arr.dtype.newbyteorder("<")]
    raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
    head = (TENSOR_HEAD_STRUCT.pack(index, code, arr.ndim)
            + struct.pack(f"<{arr.ndim}I", *arr.shape))
    max_chunk = MAX_PAYLOAD - len(head) - TENSOR_TAIL_STRUCT.size
    step = max_chunk if chunk_size is None else max(1, min(chunk_size, max_chunk))
    offsets = range(0, len(raw), step) if raw else [0]
    return [head + TENSOR_TAIL_STRUCT.pack(scale, zero_point, len(raw), off) + raw[off:off + step]
            for off in offsets]


def timing_payload(ticks: int, tick_hz: int, iterations: int,
                   instructions: int | None = None) -> bytes:
    return TIMING_STRUCT.pack(ticks, tick_hz, iterations,
                        UINT64_MAX if instructions is None else instructions)


def memory_payload(entries: Mapping[str, tuple[int, int]]) -> bytes:
    out = bytearray()
    for name, (used, capacity) in entries.items():
        raw = name.encode("ascii")
        out += bytes([len(raw)]) + raw + struct.pack("<II", used, capacity)
    return bytes(out)


def error_payload(code: int, message: str) -> bytes:
    return struct.pack("<I", code) + message.encode("utf-8")


def execute_error_payload(code: int, step: int | None, kernel_status: int = 0,
                          kernel_call: str = "") -> bytes:
    return (EXECUTE_ERROR_STRUCT.pack(code, EXECUTE_STEP_NONE if step is None else step,
                                      kernel_status) + kernel_call.encode("ascii"))


def fault_payload(registers: Mapping[str, int] | Sequence[int]) -> bytes:
    if isinstance(registers, Mapping):
        values = [registers.get(name, 0) for name in FAULT_REGISTERS]
    else:
        values = list(registers)
    return FAULT_STRUCT.pack(*values)


def done_payload(status: int, records: int) -> bytes:
    return DONE_STRUCT.pack(status, records)


def log_payload(text: str) -> bytes:
    return text.encode("utf-8")


def npu_payload(call: int, npu_cycles: int, cpu_ticks: int,
                counters: Mapping[str, int]) -> bytes:
    out = bytearray(NPU_HEAD_STRUCT.pack(call, npu_cycles, cpu_ticks, len(counters)))
    for name, value in counters.items():
        raw = name.encode("ascii")
        out += bytes([len(raw)]) + raw + struct.pack("<Q", value)
    return bytes(out)


def trace_clock_payload(clock: int, hz: int, event_cost_q8: int, *, debug_level: int = 0,
                        pairs: int = 32, tracer_bytes: int = 56) -> bytes:
    return TRACE_CLOCK_STRUCT.pack(clock, debug_level, 0, hz, event_cost_q8, pairs, tracer_bytes)


def trace_event_payload(name: str, chain: int, handle: int, start: int, end: int,
                        delegate_id: int = -1) -> bytes:
    raw = name.encode()
    return TRACE_EVENT_STRUCT.pack(chain, handle, delegate_id, start, end, len(raw)) + raw


def trace_tensor_payloads(chain: int, handle: int, ordinal: int, array: np.ndarray, *,
                          kind: int = 0, chunk_size: int | None = None) -> list[bytes]:
    prefix = TRACE_TENSOR_PREFIX_STRUCT.pack(chain, handle, ordinal, kind, 0)
    return [prefix + p for p in tensor_payloads(ordinal, array, chunk_size=chunk_size)]


def trace_summary_payload(execute_ticks: int, tracer_ticks: int, events: int,
                          iterations: int) -> bytes:
    return TRACE_SUMMARY_STRUCT.pack(execute_ticks, tracer_ticks, events, iterations)


def ready_payload(inputs: Sequence[tuple[int, Sequence[int], Sequence[int]]],
                  outputs: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> bytes:
    """Each tensor as (dtype code, sizes, dim order); nbytes from the dtype."""
    out = bytearray(READY_HEAD_STRUCT.pack(len(inputs), len(outputs)))
    for code, sizes, order in (*inputs, *outputs):
        nbytes = int(np.prod(sizes, dtype=np.int64)) * SCALAR_TYPES[code].itemsize
        out += READY_TENSOR_STRUCT.pack(code, len(sizes), nbytes)
        out += struct.pack(f"<{len(sizes)}i", *sizes) + bytes(order)
    return bytes(out)


def sample_done_payload(sample: int, status: int, ticks: int, run_seq: int) -> bytes:
    return SAMPLE_DONE_STRUCT.pack(sample, status, ticks, run_seq, 0)


class StreamEncoder:
    """Encodes a device's record stream, numbering seq and counting records like firmware."""

    def __init__(self, start_seq: int = 0) -> None:
        self.seq = start_seq
        self.count = 0

    def frame(self, rtype: int, payload: bytes) -> bytes:
        out = encode_record(rtype, self.seq, payload)
        self.seq = (self.seq + 1) % SEQ_MODULO
        self.count += 1
        return out

    def hello(self, **fields: str) -> bytes:
        return self.frame(RecordType.HELLO, hello_payload(fields))

    def tensor(self, index: int, array: np.ndarray, *, scale: float = 0.0, zero_point: int = 0,
               chunk_size: int | None = None) -> bytes:
        return b"".join(self.frame(RecordType.TENSOR, p) for p in tensor_payloads(
            index, array, scale=scale, zero_point=zero_point, chunk_size=chunk_size))

    def timing(self, ticks: int, tick_hz: int, iterations: int,
               instructions: int | None = None) -> bytes:
        return self.frame(RecordType.TIMING,
                          timing_payload(ticks, tick_hz, iterations, instructions))

    def memory(self, entries: Mapping[str, tuple[int, int]]) -> bytes:
        return self.frame(RecordType.MEMORY, memory_payload(entries))

    def error(self, code: int, message: str) -> bytes:
        return self.frame(RecordType.ERROR, error_payload(code, message))

    def fault(self, registers: Mapping[str, int] | Sequence[int]) -> bytes:
        return self.frame(RecordType.FAULT, fault_payload(registers))

    def log(self, text: str) -> bytes:
        return self.frame(RecordType.LOG, log_payload(text))

    def npu(self, call: int, npu_cycles: int, cpu_ticks: int,
            counters: Mapping[str, int]) -> bytes:
        return self.frame(RecordType.NPU, npu_payload(call, npu_cycles, cpu_ticks, counters))

    def trace_clock(self, clock: int, hz: int, event_cost_q8: int, **kw: int) -> bytes:
        return self.frame(RecordType.TRACE_CLOCK,
                          trace_clock_payload(clock, hz, event_cost_q8, **kw))

    def trace_event(self, name: str, chain: int, handle: int, start: int, end: int,
                    delegate_id: int = -1) -> bytes:
        return self.frame(RecordType.TRACE_EVENT,
                          trace_event_payload(name, chain, handle, start, end, delegate_id))

    def trace_tensor(self, chain: int, handle: int, ordinal: int, array: np.ndarray, *,
                     kind: int = 0, chunk_size: int | None = None) -> bytes:
        return b"".join(self.frame(RecordType.TRACE_TENSOR, p) for p in trace_tensor_payloads(
            chain, handle, ordinal, array, kind=kind, chunk_size=chunk_size))

    def trace_summary(self, execute_ticks: int, tracer_ticks: int, events: int,
                      iterations: int) -> bytes:
        return self.frame(RecordType.TRACE_SUMMARY, trace_summary_payload(
            execute_ticks, tracer_ticks, events, iterations))

    def ready(self, inputs: Sequence[tuple[int, Sequence[int], Sequence[int]]],
              outputs: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> bytes:
        return self.frame(RecordType.READY, ready_payload(inputs, outputs))

    def sample_done(self, sample: int, status: int = 0, ticks: int = 0,
                    run_seq: int = 0) -> bytes:
        return self.frame(RecordType.SAMPLE_DONE,
                          sample_done_payload(sample, status, ticks, run_seq))

    def done(self, status: int = 0) -> bytes:
        return self.frame(RecordType.DONE, done_payload(status, self.count))
