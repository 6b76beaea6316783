"""Host decoder for the deploykit result protocol, version 1 (docs/protocol.md).

This is the only decoder. Every runner feeds it the raw console byte stream:

    dec = Decoder()
    for chunk in stream:
        for record in dec.feed(chunk):
            ...
    dec.finish()
    run = RunRecords.build(dec.records, dec.stats)
    outcome = run.outcome(timed_out=False)

Guarantees:
- `feed()`/`finish()` never raise on any byte input, whatever its chunking;
- a record is reported only when its frame passed the CRC check (and its payload parsed);
- the records and `DecodeStats` do not depend on how the stream was split into chunks.

The reference encoder the tests feed it with is test code (`tests/protocol_encoder.py`); the
firmware's encoder is `firmware/protocol/dk_protocol.c`.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from deploykit.readers.protocol.error_codes import CODES
from deploykit.readers.protocol.outcome import Outcome, classify
from deploykit.readers.protocol.records import (
    CRC_SIZE,
    DEFAULT_MAX_TENSOR_BYTES,
    DONE_STRUCT,
    EVENT_CLOCKS,
    EXECUTE_ERROR_STRUCT,
    EXECUTE_STEP_NONE,
    FAULT_REGISTERS,
    FAULT_STRUCT,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    MAX_PAYLOAD,
    NPU_HEAD_STRUCT,
    READY_HEAD_STRUCT,
    READY_TENSOR_STRUCT,
    SAMPLE_DONE_STRUCT,
    SCALAR_TYPE_NAMES,
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
    DeviceError,
    Done,
    ExecuteError,
    Fault,
    Hello,
    Log,
    Memory,
    NpuRun,
    Ready,
    Record,
    RecordType,
    SampleDone,
    Tensor,
    TensorSpec,
    Timing,
    TraceClock,
    TraceEvent,
    TraceSummary,
    TraceTensor,
)

# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

_MAX_NOTES = 20
_NOISE_TAIL = 1024


@dataclass
class DecodeStats:
    """What the decoder saw besides the records. `problems()` lists what makes a run untrusted."""

    bytes_total: int = 0
    noise_bytes: int = 0  # bytes outside accepted frames (banners, printf, corrupted frames)
    frames_accepted: int = 0  # CRC-valid frames, duplicates excluded
    corrupted_frames: int = 0  # magic seen, but bad version, bad length or bad CRC
    corrupted_by_reason: dict[str, int] = field(default_factory=dict)
    dropped_records: int = 0  # seq gaps (modulo 65536)
    duplicate_frames: int = 0  # identical (seq, crc) seen again; ignored
    out_of_order_frames: int = 0  # seq went backwards (not a duplicate, not a reset)
    resets: int = 0  # a hello with seq 0 after other records: the device rebooted
    malformed_records: int = 0  # CRC-valid frame whose payload does not parse
    unknown_records: dict[int, int] = field(default_factory=dict)  # type -> count (not reported)
    nonzero_flags: int = 0  # CRC-valid frames with reserved flags != 0 (accepted)
    tensor_conflicts: int = 0  # chunks of one tensor that disagree (header or overlapping bytes)
    incomplete_tensors: list[int] = field(default_factory=list)  # indices, set by finish()
    records_after_done: int = 0
    done_mismatch: bool = False  # done.records disagrees with done's own seq
    truncated_trailing_frame: bool = False  # the stream ended inside a frame
    truncated_bytes: int = 0
    finished: bool = False
    notes: list[str] = field(default_factory=list)  # first few details, human readable
    noise_tail: bytes = b""  # last bytes of non-frame output, for error messages

    def _note(self, text: str) -> None:
        if len(self.notes) < _MAX_NOTES:
            self.notes.append(text)

    def problems(self) -> list[str]:
        """Human-readable reasons why the stream cannot be fully trusted; empty when clean."""
        out = []
        if self.corrupted_frames:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.corrupted_by_reason.items()))
            out.append(f"{self.corrupted_frames} corrupted frame(s) ({reasons})")
        if self.dropped_records:
            out.append(f"{self.dropped_records} dropped record(s) (seq gaps)")
        if self.duplicate_frames:
            out.append(f"{self.duplicate_frames} duplicated frame(s)")
        if self.out_of_order_frames:
            out.append(f"{self.out_of_order_frames} out-of-order frame(s)")
        if self.resets:
            out.append(f"device rebooted {self.resets} time(s) during the run (hello with seq 0)")
        if self.malformed_records:
            out.append(f"{self.malformed_records} malformed record payload(s)")
        if self.unknown_records:
            kinds = ", ".join(f"type {t} x{n}" for t, n in sorted(self.unknown_records.items()))
            out.append(f"unknown record type(s): {kinds}")
        if self.tensor_conflicts:
            out.append(f"{self.tensor_conflicts} conflicting tensor chunk(s)")
        if self.incomplete_tensors:
            out.append(f"incomplete tensor(s): index {sorted(self.incomplete_tensors)}")
        if self.records_after_done:
            out.append(f"{self.records_after_done} record(s) after done")
        if self.done_mismatch:
            out.append("done.records disagrees with the seq of the done record")
        if self.truncated_trailing_frame:
            out.append(f"stream ended inside a frame ({self.truncated_bytes} bytes)")
        return out

    @property
    def clean(self) -> bool:
        return not self.problems()

    def summary(self) -> str:
        return (f"{self.bytes_total} bytes, {self.frames_accepted} frames, "
                f"{self.noise_bytes} noise bytes, {self.corrupted_frames} corrupted, "
                f"{self.dropped_records} dropped")


# --------------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------------

class _Malformed(Exception):
    pass


@dataclass
class _PartialTensor:
    header: tuple
    data: bytearray
    mask: np.ndarray
    covered: int = 0


_OK, _BAD, _INCOMPLETE = 0, 1, 2


class Decoder:
    """Streaming decoder: `feed(bytes) -> [records]`, then `finish() -> [records]`.

    Never raises on any input, never reports a record that did not pass the CRC.
    `records` holds every record reported so far; `stats` the counters.
    """

    def __init__(self, *, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
                 dedup_window: int = 256) -> None:
        self.max_tensor_bytes = max_tensor_bytes
        self.stats = DecodeStats()
        self.records: list[Record] = []
        self._buf = bytearray()
        self._expected: int | None = None  # next expected seq, None before the first frame
        self._last_key: tuple[int, int] | None = None
        self._recent: deque[tuple[int, int]] = deque(maxlen=dedup_window)
        self._recent_set: dict[tuple[int, int], int] = {}
        # Keyed by output index, or ("trace", chain, debug handle, ordinal, kind).
        self._partials: dict[int | tuple, _PartialTensor] = {}
        self._done_seen = False

    @property
    def done(self) -> bool:
        """True once a `done` record was decoded."""
        return self._done_seen

    # ---- byte level ------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        data = bytes(data)
        self.stats.bytes_total += len(data)
        self._buf += data
        return self._scan(final=False)

    def finish(self) -> list[Record]:
        """End of stream: resolve a trailing partial frame, report incomplete tensors."""
        if self.stats.finished:
            return []
        out = self._scan(final=True)
        self.stats.finished = True
        outputs = {k for k in self._partials if isinstance(k, int)}  # not the traced tensors
        self.stats.incomplete_tensors = sorted(set(self.stats.incomplete_tensors) | outputs)
        for index in self._partials:
            self.stats._note(f"tensor {index}: stream ended before all chunks arrived")
        self._partials.clear()
        return out

    def _count_noise(self, chunk: bytes | bytearray) -> None:
        if not chunk:
            return
        self.stats.noise_bytes += len(chunk)
        self.stats.noise_tail = (self.stats.noise_tail + bytes(chunk[-_NOISE_TAIL:]))[
            -_NOISE_TAIL:]

    def _corrupt(self, reason: str) -> None:
        self.stats.corrupted_frames += 1
        by = self.stats.corrupted_by_reason
        by[reason] = by.get(reason, 0) + 1

    @staticmethod
    def _try_frame(buf: bytearray, j: int):
        avail = len(buf) - j
        if avail < 4:
            return _INCOMPLETE, None
        if buf[j + 3] != VERSION:
            return _BAD, "bad_version"
        if avail < HEADER_SIZE:
            return _INCOMPLETE, None
        _, _version, rtype, flags, seq, length = HEADER_STRUCT.unpack_from(buf, j)
        if length > MAX_PAYLOAD:
            return _BAD, "bad_length"
        end = j + HEADER_SIZE + length + CRC_SIZE
        if len(buf) < end:
            return _INCOMPLETE, None
        body = bytes(buf[j + 3:j + HEADER_SIZE + length])
        (crc,) = struct.unpack_from("<I", buf, end - CRC_SIZE)
        if zlib.crc32(body) != crc:
            return _BAD, "bad_crc"
        return _OK, (rtype, flags, seq, body[HEADER_SIZE - 3:], crc, end)

    def _scan(self, *, final: bool) -> list[Record]:
        buf = self._buf
        out: list[Record] = []
        pos = 0  # next place to search for a magic
        noise_from = 0  # start of bytes not yet accounted for
        trunc_start: int | None = None  # final mode: first unresolved partial frame
        trunc_pending: list[str] = []  # final mode: bad candidates after trunc_start
        keep_from: int | None = None  # streaming mode: wait for more bytes from here
        while True:
            j = buf.find(MAGIC, pos)
            if j < 0:
                break
            status, info = self._try_frame(buf, j)
            if status == _INCOMPLETE:
                if not final:
                    keep_from = j
                    break
                if trunc_start is None:
                    trunc_start = j
                else:
                    trunc_pending.append("bad_length")
                pos = j + 1
            elif status == _BAD:
                if trunc_start is None:
                    self._corrupt(info)
                else:
                    trunc_pending.append(info)
                pos = j + 1
            else:
                if trunc_start is not None:
                    # The partial frame claimed bytes past a valid frame: it was a false start.
                    self._corrupt("bad_length")
                    for reason in trunc_pending:
                        self._corrupt(reason)
                    trunc_start, trunc_pending = None, []
                rtype, flags, seq, payload, crc, end = info
                self._count_noise(buf[noise_from:j])
                out.extend(self._on_frame(rtype, flags, seq, payload, crc))
                pos = noise_from = end
        if final:
            if trunc_start is not None:
                self._count_noise(buf[noise_from:trunc_start])
                self.stats.truncated_trailing_frame = True
                self.stats.truncated_bytes = len(buf) - trunc_start
                self.stats._note(f"stream ended inside a frame ({len(buf) - trunc_start} bytes)")
            else:
                self._count_noise(buf[noise_from:])
            buf.clear()
        else:
            if keep_from is None:
                # Keep a tail that could be the start of a magic split across feeds.
                keep_from = len(buf)
                for k in (2, 1):
                    if len(buf) - k >= noise_from and buf.endswith(MAGIC[:k]):
                        keep_from = len(buf) - k
                        break
            self._count_noise(buf[noise_from:keep_from])
            del buf[:keep_from]
        self.records.extend(out)
        return out

    # ---- frame level -----------------------------------------------------------------------

    def _on_frame(self, rtype: int, flags: int, seq: int, payload: bytes,
                  crc: int) -> list[Record]:
        st = self.stats
        key = (seq, crc)
        reset = (rtype == RecordType.HELLO and seq == 0 and self._expected is not None
                 and not (self._expected == 1 and key == self._last_key))
        if not reset and key in self._recent_set:
            st.duplicate_frames += 1
            st._note(f"seq {seq}: duplicated frame ignored")
            return []
        if reset:
            st.resets += 1
            st._note(f"seq 0 hello after seq {(self._expected - 1) % SEQ_MODULO}: device reset")
            st.incomplete_tensors.extend(i for i in self._partials if isinstance(i, int)
                                         and i not in st.incomplete_tensors)
            self._partials.clear()
            self._recent.clear()
            self._recent_set.clear()
            self._expected = 1
        elif self._expected is None:
            # seq starts at 0 at boot: a later first seq means the first records were lost.
            if seq:
                st.dropped_records += seq
                st._note(f"first record has seq {seq}: {seq} record(s) dropped before it")
            self._expected = (seq + 1) % SEQ_MODULO
        else:
            gap = (seq - self._expected) % SEQ_MODULO
            if gap < SEQ_MODULO // 2:
                if gap:
                    st.dropped_records += gap
                    st._note(f"seq {seq}: {gap} record(s) dropped before it")
                self._expected = (seq + 1) % SEQ_MODULO
            else:
                st.out_of_order_frames += 1
                st._note(f"seq {seq}: out of order (expected {self._expected})")
        st.frames_accepted += 1
        self._remember(key)
        if self._done_seen:
            st.records_after_done += 1
        if flags:
            st.nonzero_flags += 1
        try:
            records = self._parse(rtype, seq, payload)
        except (_Malformed, struct.error, ValueError, UnicodeDecodeError) as exc:
            st.malformed_records += 1
            name = RecordType(rtype).name.lower() if rtype in RecordType._value2member_map_ \
                else str(rtype)
            st._note(f"seq {seq}: malformed {name} record: {exc}")
            return []
        for r in records:
            if isinstance(r, Done):
                self._done_seen = True
                if r.records % SEQ_MODULO != seq:
                    st.done_mismatch = True
                    st._note(f"done says {r.records} records were sent, but its seq is {seq}")
        return records

    def _remember(self, key: tuple[int, int]) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            n = self._recent_set[old] - 1
            if n:
                self._recent_set[old] = n
            else:
                del self._recent_set[old]
        self._recent.append(key)
        self._recent_set[key] = self._recent_set.get(key, 0) + 1
        self._last_key = key

    def _parse(self, rtype: int, seq: int, p: bytes) -> list[Record]:
        if rtype == RecordType.HELLO:
            fields: dict[str, str] = {}
            for line in p.decode("utf-8").split("\n"):
                line = line.rstrip("\r")
                if not line:
                    continue
                key, sep, value = line.partition("=")
                if not sep or not key:
                    raise _Malformed(f"hello line without key=value: {line[:40]!r}")
                fields[key] = value
            return [Hello(fields, seq=seq)]
        if rtype == RecordType.TENSOR:
            t = self._tensor_chunk(seq, p)
            return [t] if t is not None else []
        if rtype == RecordType.TIMING:
            _exact(p, TIMING_STRUCT.size, "timing")
            ticks, hz, iterations, instructions = TIMING_STRUCT.unpack(p)
            return [Timing(ticks, hz, iterations,
                           None if instructions == UINT64_MAX else instructions, seq=seq)]
        if rtype == RecordType.MEMORY:
            entries: dict[str, tuple[int, int]] = {}
            i = 0
            while i < len(p):
                n = p[i]
                if i + 1 + n + 8 > len(p):
                    raise _Malformed("memory entry runs past the payload")
                name = p[i + 1:i + 1 + n].decode("ascii")
                used, capacity = struct.unpack_from("<II", p, i + 1 + n)
                entries[name] = (used, capacity)
                i += 1 + n + 8
            return [Memory(entries, seq=seq)]
        if rtype == RecordType.ERROR:
            if len(p) < 4:
                raise _Malformed(f"error payload is {len(p)} bytes, needs at least 4")
            (code,) = struct.unpack_from("<I", p)
            return [DeviceError(code, p[4:].decode("utf-8", errors="replace"), seq=seq)]
        if rtype == RecordType.EXECUTE_ERROR:
            if len(p) < EXECUTE_ERROR_STRUCT.size:
                raise _Malformed(f"execute_error payload is {len(p)} bytes, needs at least "
                                 f"{EXECUTE_ERROR_STRUCT.size}")
            code, step, status = EXECUTE_ERROR_STRUCT.unpack_from(p)
            return [ExecuteError(code, None if step == EXECUTE_STEP_NONE else step, status,
                                 p[EXECUTE_ERROR_STRUCT.size:].decode("utf-8", errors="replace"),
                                 seq=seq)]
        if rtype == RecordType.FAULT:
            _exact(p, FAULT_STRUCT.size, "fault")
            return [Fault(dict(zip(FAULT_REGISTERS, FAULT_STRUCT.unpack(p), strict=True)), seq=seq)]
        if rtype == RecordType.DONE:
            _exact(p, DONE_STRUCT.size, "done")
            status, count = DONE_STRUCT.unpack(p)
            return [Done(status, count, seq=seq)]
        if rtype == RecordType.LOG:
            return [Log(p.decode("utf-8", errors="replace"), seq=seq)]
        if rtype == RecordType.NPU:
            if len(p) < NPU_HEAD_STRUCT.size:
                raise _Malformed(f"npu payload is {len(p)} bytes, needs at least "
                                 f"{NPU_HEAD_STRUCT.size}")
            call, cycles, ticks, count = NPU_HEAD_STRUCT.unpack_from(p)
            counters: dict[str, int] = {}
            i = NPU_HEAD_STRUCT.size
            for _ in range(count):
                n = p[i] if i < len(p) else 0
                if i + 1 + n + 8 > len(p):
                    raise _Malformed("npu counter runs past the payload")
                counters[p[i + 1:i + 1 + n].decode("ascii")] = struct.unpack_from(
                    "<Q", p, i + 1 + n)[0]
                i += 1 + n + 8
            if i != len(p):
                raise _Malformed(f"npu payload has {len(p) - i} byte(s) after its counters")
            return [NpuRun(call, cycles, ticks, counters, seq=seq)]
        if rtype == RecordType.TRACE_CLOCK:
            _exact(p, TRACE_CLOCK_STRUCT.size, "trace_clock")
            kind, level, _, hz, cost, pairs, nbytes = TRACE_CLOCK_STRUCT.unpack(p)
            if kind not in EVENT_CLOCKS:
                raise _Malformed(f"trace_clock: unknown event clock {kind}")
            return [TraceClock(EVENT_CLOCKS[kind], level, hz, cost, pairs, nbytes, seq=seq)]
        if rtype == RecordType.TRACE_EVENT:
            if len(p) < TRACE_EVENT_STRUCT.size:
                raise _Malformed(f"trace_event payload is {len(p)} bytes, needs at least "
                                 f"{TRACE_EVENT_STRUCT.size}")
            chain, handle, delegate, start, end, n = TRACE_EVENT_STRUCT.unpack_from(p)
            _exact(p, TRACE_EVENT_STRUCT.size + n, "trace_event")
            if end < start:
                raise _Malformed(f"trace_event ends ({end}) before it starts ({start})")
            name = p[TRACE_EVENT_STRUCT.size:].decode("utf-8", errors="replace")
            return [TraceEvent(name, chain, handle, delegate, start, end, seq=seq)]
        if rtype == RecordType.TRACE_TENSOR:
            size = TRACE_TENSOR_PREFIX_STRUCT.size
            if len(p) < size + TENSOR_HEAD_STRUCT.size:
                raise _Malformed(f"trace_tensor payload is {len(p)} bytes, too short")
            chain, handle, ordinal, kind, _ = TRACE_TENSOR_PREFIX_STRUCT.unpack_from(p)
            t = self._tensor_chunk(seq, p[size:], key=("trace", chain, handle, ordinal, kind))
            return [TraceTensor(chain, handle, ordinal, kind, t, seq=seq)] if t else []
        if rtype == RecordType.TRACE_SUMMARY:
            _exact(p, TRACE_SUMMARY_STRUCT.size, "trace_summary")
            return [TraceSummary(*TRACE_SUMMARY_STRUCT.unpack(p), seq=seq)]
        if rtype == RecordType.SAMPLE_DONE:
            _exact(p, SAMPLE_DONE_STRUCT.size, "sample_done")
            sample, status, ticks, run_seq, _ = SAMPLE_DONE_STRUCT.unpack(p)
            return [SampleDone(sample, status, ticks, run_seq, seq=seq)]
        if rtype == RecordType.READY:
            return [_ready(p, seq)]
        st = self.stats
        st.unknown_records[rtype] = st.unknown_records.get(rtype, 0) + 1
        st._note(f"seq {seq}: unknown record type {rtype} ({len(p)} bytes) skipped")
        return []

    def _tensor_chunk(self, seq: int, p: bytes, key: object = None) -> Tensor | None:
        """One chunk of a tensor; `key` tells the reassembly of traced tensors (`trace_tensor`)
        from the outputs' (keyed by their index)."""
        index, dtype_code, ndim = TENSOR_HEAD_STRUCT.unpack_from(p)
        off = TENSOR_HEAD_STRUCT.size
        sizes = struct.unpack_from(f"<{ndim}I", p, off)
        off += 4 * ndim
        scale, zero_point, total, offset = TENSOR_TAIL_STRUCT.unpack_from(p, off)
        scale_raw = p[off:off + 4]
        off += TENSOR_TAIL_STRUCT.size
        chunk = p[off:]
        dt = SCALAR_TYPES.get(dtype_code)
        if dt is None:
            raise _Malformed(f"tensor {index}: unsupported dtype code {dtype_code}")
        expected = math.prod(sizes) * dt.itemsize
        if total != expected:
            raise _Malformed(f"tensor {index}: total_nbytes {total} != {expected} "
                             f"for sizes {list(sizes)} of {SCALAR_TYPE_NAMES[dtype_code]}")
        if total > self.max_tensor_bytes:
            raise _Malformed(f"tensor {index}: {total} bytes exceeds the "
                             f"{self.max_tensor_bytes}-byte limit")
        if offset + len(chunk) > total:
            raise _Malformed(f"tensor {index}: chunk [{offset}, {offset + len(chunk)}) "
                             f"past total_nbytes {total}")
        header = (dtype_code, sizes, scale_raw, zero_point, total)
        key = index if key is None else key
        part = self._partials.get(key)
        if part is not None and part.header != header:
            self._tensor_conflict(index, seq, "header differs from earlier chunks")
            part = None
        if part is None:
            part = _PartialTensor(header, bytearray(total), np.zeros(total, dtype=bool))
            self._partials[key] = part
        end = offset + len(chunk)
        seen = part.mask[offset:end]
        if seen.any():
            old = np.frombuffer(part.data, dtype=np.uint8)[offset:end][seen]
            new = np.frombuffer(chunk, dtype=np.uint8)[seen]
            if not np.array_equal(old, new):
                self._tensor_conflict(index, seq, "overlapping chunk with different bytes")
                part = _PartialTensor(header, bytearray(total), np.zeros(total, dtype=bool))
                self._partials[key] = part
                seen = part.mask[offset:end]
        part.data[offset:end] = chunk
        part.covered += int(len(chunk) - np.count_nonzero(seen))
        part.mask[offset:end] = True
        if part.covered < total:
            return None
        del self._partials[key]
        data = np.frombuffer(part.data, dtype=dt).reshape(sizes)
        return Tensor(index, dtype_code, tuple(sizes), float(scale), zero_point, data, seq=seq)

    def _tensor_conflict(self, index: int, seq: int, why: str) -> None:
        self.stats.tensor_conflicts += 1
        self.stats._note(f"seq {seq}: tensor {index}: {why}; reassembly restarted")


def _ready(p: bytes, seq: int) -> Ready:
    if len(p) < READY_HEAD_STRUCT.size:
        raise _Malformed(f"ready payload is {len(p)} bytes, needs at least 4")
    n_in, n_out = READY_HEAD_STRUCT.unpack_from(p)
    specs = []
    i = READY_HEAD_STRUCT.size
    for k in range(n_in + n_out):
        if i + READY_TENSOR_STRUCT.size > len(p):
            raise _Malformed(f"ready: tensor {k} runs past the payload")
        dtype, ndim, nbytes = READY_TENSOR_STRUCT.unpack_from(p, i)
        i += READY_TENSOR_STRUCT.size
        if i + 5 * ndim > len(p):
            raise _Malformed(f"ready: tensor {k} runs past the payload")
        sizes = struct.unpack_from(f"<{ndim}i", p, i)
        order = tuple(p[i + 4 * ndim:i + 5 * ndim])
        i += 5 * ndim
        if sorted(order) != list(range(ndim)):
            raise _Malformed(f"ready: tensor {k}: dim order {list(order)} is no permutation")
        dt = SCALAR_TYPES.get(dtype)
        if dt is not None and nbytes != math.prod(sizes) * dt.itemsize:
            raise _Malformed(f"ready: tensor {k}: {nbytes} bytes for {SCALAR_TYPE_NAMES[dtype]} "
                             f"{list(sizes)}")
        specs.append(TensorSpec(dtype, tuple(sizes), order, nbytes))
    if i != len(p):
        raise _Malformed(f"ready payload has {len(p) - i} byte(s) after its tensors")
    return Ready(tuple(specs[:n_in]), tuple(specs[n_in:]), seq=seq)


def _exact(p: bytes, size: int, name: str) -> None:
    if len(p) != size:
        raise _Malformed(f"{name} payload is {len(p)} bytes, expected {size}")


# --------------------------------------------------------------------------------------------
# Run summary
# --------------------------------------------------------------------------------------------

@dataclass
class RunRecords:
    """Everything one run reported, grouped by kind, plus the decode statistics."""

    hello: Hello | None = None
    hellos: int = 0
    tensors: dict[int, Tensor] = field(default_factory=dict)
    timing: Timing | None = None  # the last timing record
    timings: list[Timing] = field(default_factory=list)
    memory: Memory | None = None  # entries of all memory records merged
    errors: list[DeviceError] = field(default_factory=list)
    # Where each failed execute() stopped (one per failure; serve firmware serves on after one).
    execute_errors: list[ExecuteError] = field(default_factory=list)
    fault: Fault | None = None
    done: Done | None = None
    logs: list[Log] = field(default_factory=list)
    npu_runs: list[NpuRun] = field(default_factory=list)  # Ethos-U firmware, one per call
    # Profiling firmware (docs/protocol.md, types 10-13).
    trace_clock: TraceClock | None = None
    trace_events: list[TraceEvent] = field(default_factory=list)
    trace_tensors: list[TraceTensor] = field(default_factory=list)
    trace_summary: TraceSummary | None = None
    # Serve firmware (docs/protocol.md, "Host -> device"): the method it serves, its answers to
    # `run` frames, and the error records that belong to one frame or sample (a rejected host
    # frame, a sample that failed; the device served on), apart from `errors`, which end a run.
    ready: Ready | None = None
    sample_dones: list[SampleDone] = field(default_factory=list)
    sample_errors: list[DeviceError] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)

    @classmethod
    def build(cls, records: Iterable[Record], stats: DecodeStats | None = None) -> RunRecords:
        run = cls(stats=stats if stats is not None else DecodeStats())
        pending: list[DeviceError] = []  # errors not yet followed by a sample_done
        for r in records:
            run.records.append(r)
            if isinstance(r, Hello):
                run.hellos += 1
                if run.hello is None:
                    run.hello = r
            elif isinstance(r, Tensor):
                run.tensors[r.index] = r
            elif isinstance(r, Timing):
                run.timing = r
                run.timings.append(r)
            elif isinstance(r, Memory):
                merged = dict(run.memory.entries) if run.memory else {}
                merged.update(r.entries)
                run.memory = Memory(merged, seq=r.seq)
            elif isinstance(r, DeviceError):
                entry = CODES.get(r.code)
                (run.sample_errors if entry is not None and entry.sample else pending).append(r)
            elif isinstance(r, ExecuteError):
                run.execute_errors.append(r)
            elif isinstance(r, Fault):
                if run.fault is None:
                    run.fault = r
            elif isinstance(r, Done):
                if run.done is None:
                    run.done = r
            elif isinstance(r, Log):
                run.logs.append(r)
            elif isinstance(r, NpuRun):
                run.npu_runs.append(r)
            elif isinstance(r, TraceClock):
                run.trace_clock = r
            elif isinstance(r, TraceEvent):
                run.trace_events.append(r)
            elif isinstance(r, TraceTensor):
                run.trace_tensors.append(r)
            elif isinstance(r, TraceSummary):
                run.trace_summary = r
            elif isinstance(r, Ready):
                run.ready = r
            elif isinstance(r, SampleDone):
                # An error right before a sample's answer was that sample's failure.
                run.sample_dones.append(r)
                run.sample_errors.extend(pending)
                pending.clear()
        run.errors.extend(pending)
        return run

    def summary(self) -> str:
        """One line: what was received so far (for timeout and error messages)."""
        parts = []
        if self.hello:
            keys = ", ".join(f"{k}={self.hello.fields[k]}" for k in ("board", "firmware")
                             if k in self.hello.fields)
            parts.append(f"hello({keys})")
        else:
            parts.append("no hello")
        parts.append(f"{len(self.tensors)} tensor(s)"
                     + (f" {sorted(self.tensors)}" if self.tensors else ""))
        if self.timing:
            parts.append(f"timing {self.timing.ticks} ticks")
        if self.memory:
            parts.append(f"memory {sorted(self.memory.entries)}")
        if self.logs:
            parts.append(f"{len(self.logs)} log(s), last {self.logs[-1].text[:60]!r}")
        if self.errors:
            e = self.errors[-1]
            parts.append(f"{len(self.errors)} error(s), last code {e.code} {e.message[:60]!r}")
        if self.fault:
            parts.append("fault")
        if self.ready:
            parts.append(f"ready, {len(self.sample_dones)} sample(s) answered, "
                         f"{len(self.sample_errors)} per-sample error(s)")
        parts.append(f"done(status={self.done.status})" if self.done else "no done")
        s = self.stats
        parts.append(f"{s.noise_bytes} noise byte(s), {s.corrupted_frames} corrupted, "
                     f"{s.dropped_records} dropped")
        return "; ".join(parts)

    def outcome(self, *, timed_out: bool = False, how: str | None = None,
                located: str | None = None) -> Outcome:
        """Classify the run from its records alone
        (`deploykit.readers.protocol.outcome.classify`)."""
        return classify(self, timed_out=timed_out, how=how, located=located)


def decode(data: bytes | bytearray | memoryview) -> RunRecords:
    """Decode a whole captured console stream at once."""
    dec = Decoder()
    dec.feed(data)
    dec.finish()
    return RunRecords.build(dec.records, dec.stats)
