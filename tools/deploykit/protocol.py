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

The module also holds a reference encoder (`encode_record`, the `*_payload` builders and
`StreamEncoder`). It is used by the tests, by fake runners in pipeline tests, and to check the
firmware encoder (`firmware/protocol/dk_protocol.c`) byte for byte.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

import numpy as np

from deploykit.errors import ExitCode, RunError

MAGIC = b"\xa5DK"
VERSION = 1
HEADER_SIZE = 12
CRC_SIZE = 4
MAX_PAYLOAD = 65536
SEQ_MODULO = 65536
UINT64_MAX = 0xFFFF_FFFF_FFFF_FFFF
DEFAULT_MAX_TENSOR_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct("<3sBBBHI")  # magic, version, type, flags, seq, length
_TENSOR_HEAD = struct.Struct("<HBB")  # index, dtype, ndim
_TENSOR_TAIL = struct.Struct("<fiII")  # scale, zero_point, total_nbytes, offset
_TIMING = struct.Struct("<QIIQ")
_DONE = struct.Struct("<II")
_FAULT = struct.Struct("<13I")


class RecordType(IntEnum):
    HELLO = 1
    TENSOR = 2
    TIMING = 3
    MEMORY = 4
    ERROR = 5
    FAULT = 6
    DONE = 7
    LOG = 8


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


Record = Hello | Tensor | Timing | Memory | DeviceError | Fault | Done | Log


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
        self._partials: dict[int, _PartialTensor] = {}
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
        self.stats.incomplete_tensors = sorted(
            set(self.stats.incomplete_tensors) | set(self._partials))
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
        _, _version, rtype, flags, seq, length = _HEADER.unpack_from(buf, j)
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
            st.incomplete_tensors.extend(i for i in self._partials
                                         if i not in st.incomplete_tensors)
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
            _exact(p, _TIMING.size, "timing")
            ticks, hz, iterations, instructions = _TIMING.unpack(p)
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
        if rtype == RecordType.FAULT:
            _exact(p, _FAULT.size, "fault")
            return [Fault(dict(zip(FAULT_REGISTERS, _FAULT.unpack(p), strict=True)), seq=seq)]
        if rtype == RecordType.DONE:
            _exact(p, _DONE.size, "done")
            status, count = _DONE.unpack(p)
            return [Done(status, count, seq=seq)]
        if rtype == RecordType.LOG:
            return [Log(p.decode("utf-8", errors="replace"), seq=seq)]
        st = self.stats
        st.unknown_records[rtype] = st.unknown_records.get(rtype, 0) + 1
        st._note(f"seq {seq}: unknown record type {rtype} ({len(p)} bytes) skipped")
        return []

    def _tensor_chunk(self, seq: int, p: bytes) -> Tensor | None:
        index, dtype_code, ndim = _TENSOR_HEAD.unpack_from(p)
        off = _TENSOR_HEAD.size
        sizes = struct.unpack_from(f"<{ndim}I", p, off)
        off += 4 * ndim
        scale, zero_point, total, offset = _TENSOR_TAIL.unpack_from(p, off)
        scale_raw = p[off:off + 4]
        off += _TENSOR_TAIL.size
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
        part = self._partials.get(index)
        if part is not None and part.header != header:
            self._tensor_conflict(index, seq, "header differs from earlier chunks")
            part = None
        if part is None:
            part = _PartialTensor(header, bytearray(total), np.zeros(total, dtype=bool))
            self._partials[index] = part
        end = offset + len(chunk)
        seen = part.mask[offset:end]
        if seen.any():
            old = np.frombuffer(part.data, dtype=np.uint8)[offset:end][seen]
            new = np.frombuffer(chunk, dtype=np.uint8)[seen]
            if not np.array_equal(old, new):
                self._tensor_conflict(index, seq, "overlapping chunk with different bytes")
                part = _PartialTensor(header, bytearray(total), np.zeros(total, dtype=bool))
                self._partials[index] = part
                seen = part.mask[offset:end]
        part.data[offset:end] = chunk
        part.covered += int(len(chunk) - np.count_nonzero(seen))
        part.mask[offset:end] = True
        if part.covered < total:
            return None
        del self._partials[index]
        data = np.frombuffer(part.data, dtype=dt).reshape(sizes)
        return Tensor(index, dtype_code, tuple(sizes), float(scale), zero_point, data, seq=seq)

    def _tensor_conflict(self, index: int, seq: int, why: str) -> None:
        self.stats.tensor_conflicts += 1
        self.stats._note(f"seq {seq}: tensor {index}: {why}; reassembly restarted")


def _exact(p: bytes, size: int, name: str) -> None:
    if len(p) != size:
        raise _Malformed(f"{name} payload is {len(p)} bytes, expected {size}")


# --------------------------------------------------------------------------------------------
# Run summary and outcome
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    exit_code: ExitCode
    cause: str
    hint: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def to_error(self, log_path: str | None = None) -> RunError:
        return RunError(self.cause, self.hint, exit_code=self.exit_code, log_path=log_path)


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
    fault: Fault | None = None
    done: Done | None = None
    logs: list[Log] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)

    @classmethod
    def build(cls, records: Iterable[Record], stats: DecodeStats | None = None) -> RunRecords:
        run = cls(stats=stats if stats is not None else DecodeStats())
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
                run.errors.append(r)
            elif isinstance(r, Fault):
                if run.fault is None:
                    run.fault = r
            elif isinstance(r, Done):
                if run.done is None:
                    run.done = r
            elif isinstance(r, Log):
                run.logs.append(r)
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
        parts.append(f"done(status={self.done.status})" if self.done else "no done")
        s = self.stats
        parts.append(f"{s.noise_bytes} noise byte(s), {s.corrupted_frames} corrupted, "
                     f"{s.dropped_records} dropped")
        return "; ".join(parts)

    def outcome(self, *, timed_out: bool = False, how: str | None = None) -> Outcome:
        """Classify the run from the records alone (runners add exit-code checks on top).

        Order: nothing valid -> NO_BOOT (PROTOCOL if frames were seen but none was valid);
        fault -> FAULT; error record or done.status != 0 -> DEVICE_ERROR; no done ->
        TIMEOUT (the host gave up) or PROTOCOL (the stream ended); any decode problem ->
        PROTOCOL. `how` says how the run ended, e.g. "QEMU exited with code 1".
        """
        s = self.stats
        how = how or ("the host timed out" if timed_out else "the output ended")
        if not self.records:
            if s.frames_accepted or s.corrupted_frames:
                why = (f"{s.corrupted_frames} corrupted frame(s)" if s.corrupted_frames
                       else "; ".join(s.problems()))
                return Outcome(ExitCode.PROTOCOL, f"No valid record decoded ({why}; {how}).",
                               "Line noise, a wrong baud rate or a protocol version mismatch.")
            tail = s.noise_tail[-200:].decode("utf-8", errors="replace").strip()
            console = (f" The console printed {s.noise_bytes} byte(s), ending: {tail!r}."
                       if s.noise_bytes else " The console printed nothing.")
            return Outcome(ExitCode.NO_BOOT, f"No record from the device ({how}).{console}",
                           "Check that the firmware boots and that its console is the "
                           "board's UART.")
        if self.fault is not None:
            return Outcome(ExitCode.FAULT, f"The device faulted: {self.fault.describe()}.",
                           "Look up pc in the ELF: arm-none-eabi-addr2line -e <elf> <pc>.")
        if self.errors or (self.done is not None and self.done.status != 0):
            msgs = "; ".join(f"code {e.code}: {e.message}" for e in self.errors[:3])
            status = f"done status {self.done.status}" if self.done else "no done"
            if self.done is not None and self.done.status == DoneStatus.POOL_TOO_SMALL:
                hint = "A memory pool is too small; enlarge it in the memory plan."
            elif self.done is not None and self.done.status == DoneStatus.FAULT:
                hint = "done reports a fault but no fault record arrived."
            else:
                hint = "See the device's error records."
            return Outcome(ExitCode.DEVICE_ERROR,
                           f"The device reported an error ({status}"
                           + (f"; {msgs}" if msgs else "") + ").", hint)
        if self.done is None:
            if timed_out:
                return Outcome(ExitCode.TIMEOUT,
                               f"Timed out without a done record ({how}). "
                               f"Received so far: {self.summary()}.",
                               "The firmware hangs, or needs a longer timeout.")
            return Outcome(ExitCode.PROTOCOL,
                           f"The output ended without a done record ({how}). "
                           f"Received: {self.summary()}.",
                           "The firmware stopped or reset before finishing.")
        problems = s.problems()
        if problems:
            return Outcome(ExitCode.PROTOCOL,
                           "The result stream is not trustworthy: " + "; ".join(problems) + ".",
                           "Details: " + "; ".join(s.notes[:3]) + "." if s.notes else "")
        return Outcome(ExitCode.OK, "done, status 0")


def decode(data: bytes | bytearray | memoryview) -> RunRecords:
    """Decode a whole captured console stream at once."""
    dec = Decoder()
    dec.feed(data)
    dec.finish()
    return RunRecords.build(dec.records, dec.stats)


# --------------------------------------------------------------------------------------------
# Reference encoder
# --------------------------------------------------------------------------------------------

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
    head = (_TENSOR_HEAD.pack(index, code, arr.ndim)
            + struct.pack(f"<{arr.ndim}I", *arr.shape))
    max_chunk = MAX_PAYLOAD - len(head) - _TENSOR_TAIL.size
    step = max_chunk if chunk_size is None else max(1, min(chunk_size, max_chunk))
    offsets = range(0, len(raw), step) if raw else [0]
    return [head + _TENSOR_TAIL.pack(scale, zero_point, len(raw), off) + raw[off:off + step]
            for off in offsets]


def timing_payload(ticks: int, tick_hz: int, iterations: int,
                   instructions: int | None = None) -> bytes:
    return _TIMING.pack(ticks, tick_hz, iterations,
                        UINT64_MAX if instructions is None else instructions)


def memory_payload(entries: Mapping[str, tuple[int, int]]) -> bytes:
    out = bytearray()
    for name, (used, capacity) in entries.items():
        raw = name.encode("ascii")
        out += bytes([len(raw)]) + raw + struct.pack("<II", used, capacity)
    return bytes(out)


def error_payload(code: int, message: str) -> bytes:
    return struct.pack("<I", code) + message.encode("utf-8")


def fault_payload(registers: Mapping[str, int] | Sequence[int]) -> bytes:
    if isinstance(registers, Mapping):
        values = [registers.get(name, 0) for name in FAULT_REGISTERS]
    else:
        values = list(registers)
    return _FAULT.pack(*values)


def done_payload(status: int, records: int) -> bytes:
    return _DONE.pack(status, records)


def log_payload(text: str) -> bytes:
    return text.encode("utf-8")


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

    def done(self, status: int = 0) -> bytes:
        return self.frame(RecordType.DONE, done_payload(status, self.count))
