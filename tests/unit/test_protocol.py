"""Tests of the result-protocol decoder (docs/protocol.md): round trips, fixed cases, fuzzing.

The fuzz oracle is `reference_frames`, a deliberately naive scanner written from the spec:
at each position, a frame is taken when magic, version, length bound and CRC all hold.
The decoder must accept exactly the frames this scanner finds, and nothing else.
"""

from __future__ import annotations

import os
import shutil
import struct
import typing
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from deploykit.readers.protocol import (
    FAULT_REGISTERS,
    MAGIC,
    SCALAR_TYPES,
    Decoder,
    DeviceError,
    Done,
    Fault,
    Hello,
    Log,
    Memory,
    RecordType,
    RunRecords,
    Tensor,
    Timing,
    decode,
)
from deploykit.readers.protocol.error_codes import CODES
from deploykit.readers.protocol.records import Record
from deploykit.util.errors import ExitCode
from tests.protocol_encoder import StreamEncoder, encode_record, tensor_payloads, timing_payload

# DK_FUZZ_EXAMPLES=5000 for a deep run; the default keeps the file under a few seconds.
FUZZ = settings(max_examples=int(os.environ.get("DK_FUZZ_EXAMPLES", "100")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HELLO = {"protocol": "1", "board": "qemu-an547", "firmware": "selftest",
         "pte_sha256": "0123456789abcdef"}


# ---- helpers --------------------------------------------------------------------------------

def reference_frames(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, seq) of every frame the spec accepts, scanning greedily left to right."""
    out, i, n = [], 0, len(data)
    while i + 16 <= n:
        if data[i:i + 3] == MAGIC and data[i + 3] == 1:
            (length,) = struct.unpack_from("<I", data, i + 8)
            end = i + 12 + length + 4
            if length <= 65536 and end <= n:
                (crc,) = struct.unpack_from("<I", data, end - 4)
                if zlib.crc32(data[i + 3:end - 4]) == crc:
                    out.append((i, end, struct.unpack_from("<H", data, i + 6)[0]))
                    i = end
                    continue
        i += 1
    return out


def run(data: bytes, chunks: list[int] | None = None) -> Decoder:
    dec = Decoder()
    if chunks is None:
        dec.feed(data)
    else:
        pos = 0
        for size in chunks:
            dec.feed(data[pos:pos + size])
            pos += size
        dec.feed(data[pos:])
    dec.finish()
    return dec


def is_subsequence(sub: list, full: list) -> bool:
    it = iter(full)
    return all(any(x == y for y in it) for x in sub)


def tensor(index: int, arr: np.ndarray, scale: float = 0.0, zp: int = 0) -> Tensor:
    code = {dt: c for c, dt in SCALAR_TYPES.items()}[arr.dtype.newbyteorder("<")]
    return Tensor(index, code, tuple(arr.shape), scale, zp, arr)


# ---- strategies -----------------------------------------------------------------------------

_key = st.text(st.characters(blacklist_characters="=\n\r", blacklist_categories=["Cs"]),
               min_size=1, max_size=12)
_value = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
                 max_size=20)
_u32 = st.integers(0, 2**32 - 1)
_dtypes = st.sampled_from([np.dtype(x) for x in ("u1", "i1", "<i2", "<i4", "<i8", "<f4",
                                                  "<f8", "?")])
_arrays = _dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3,
                                                                     min_side=0, max_side=6)))
_ops = st.one_of(
    st.tuples(st.just("log"), st.text(max_size=40)),
    st.tuples(st.just("error"), _u32, st.text(max_size=30)),
    st.tuples(st.just("timing"), st.integers(0, 2**64 - 1), _u32, _u32,
              st.one_of(st.none(), st.integers(0, 2**64 - 2))),
    st.tuples(st.just("memory"), st.dictionaries(
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
        st.tuples(_u32, _u32), max_size=5)),
    st.tuples(st.just("fault"), st.lists(_u32, min_size=13, max_size=13)),
    st.tuples(st.just("tensor"), _arrays, st.integers(8, 256),
              st.floats(width=32, allow_nan=False), st.integers(-2**31, 2**31 - 1)),
)


@st.composite
def streams(draw, max_ops: int = 8):
    """A well-formed device stream: (frames, expected records). Tensor indices are unique."""
    enc = StreamEncoder()
    fields = draw(st.dictionaries(_key, _value, max_size=5))
    frames = [enc.hello(**fields)]
    expected: list = [Hello(fields)]
    for n, op in enumerate(draw(st.lists(_ops, max_size=max_ops))):
        kind = op[0]
        if kind == "log":
            frames.append(enc.log(op[1]))
            expected.append(Log(op[1]))
        elif kind == "error":
            frames.append(enc.error(op[1], op[2]))
            expected.append(DeviceError(op[1], op[2]))
        elif kind == "timing":
            frames.append(enc.timing(*op[1:]))
            expected.append(Timing(*op[1:]))
        elif kind == "memory":
            frames.append(enc.memory(op[1]))
            expected.append(Memory(dict(op[1])))
        elif kind == "fault":
            frames.append(enc.fault(op[1]))
            expected.append(Fault(dict(zip(FAULT_REGISTERS, op[1], strict=True))))
        else:
            arr, chunk, scale, zp = op[1:]
            for p in tensor_payloads(n, arr, scale=scale, zero_point=zp, chunk_size=chunk):
                frames.append(enc.frame(RecordType.TENSOR, p))
            expected.append(tensor(n, arr, scale, zp))
    status = draw(st.integers(0, 3))
    frames.append(enc.done(status))
    expected.append(Done(status, enc.count - 1))
    return frames, expected


# Console noise that cannot contain a magic (no 0xA5), and noise that can.
_clean_noise = st.one_of(
    st.sampled_from([b"", b"\r\n", b"Booting...\r\n", b"[00:00:00.000] printf text 42\n",
                     b"DK DK D K", b"\x00\xff\x44\x4b"]),
    st.binary(max_size=40).map(lambda b: b.replace(b"\xa5", b"\xa4")),
)
_dirty_noise = st.one_of(
    _clean_noise, st.binary(max_size=40),
    st.sampled_from([MAGIC, MAGIC + b"\x01", MAGIC + b"\x02", b"\xa5", b"\xa5D",
                     MAGIC + b"\x01\x08\x00\x05\x00\xff\xff\x00\x00",  # length 65535, no body
                     MAGIC + b"\x01\x08\x00\x05\x00\x10\x00\x00\x00"]),  # length 16, bad CRC
)


def join(frames: list[bytes], noise: list[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    out, spans = bytearray(), []
    for i, frame in enumerate(frames):
        out += noise[i % len(noise)] if noise else b""
        spans.append((len(out), len(out) + len(frame)))
        out += frame
    out += noise[-1] if noise else b""
    return bytes(out), spans


# ---- round trips ----------------------------------------------------------------------------

def test_round_trip_every_record_type():
    enc = StreamEncoder()
    regs = {name: i * 0x1000 + 1 for i, name in enumerate(FAULT_REGISTERS)}
    out = np.arange(12, dtype=np.float32).reshape(3, 4)
    q = np.array([[-128, 0, 127]], dtype=np.int8)
    data = (b"Boot banner v1.0\r\n" + enc.hello(**HELLO) + b"printf: hi\n"
            + enc.tensor(0, out, chunk_size=10) + enc.tensor(1, q, scale=0.5, zero_point=-3)
            + enc.timing(1000, 32_000_000, 10, None) + enc.timing(5, 1, 1, 42)
            + enc.memory({"method_pool": (2028, 4096), "stack": (2324, 32768)})
            + enc.error(20, "Operator missing") + enc.fault(regs) + enc.log("héllo ✓")
            + enc.done(0))
    run_ = decode(data)
    assert run_.hello == Hello(HELLO) and run_.hello.board == "qemu-an547"
    assert run_.tensors[0] == tensor(0, out) and run_.tensors[0].data.shape == (3, 4)
    assert run_.tensors[1] == tensor(1, q, 0.5, -3) and run_.tensors[1].dtype_name == "int8"
    assert run_.timings == [Timing(1000, 32_000_000, 10, None), Timing(5, 1, 1, 42)]
    assert run_.timing.instructions == 42 and run_.timings[0].seconds == pytest.approx(1000 / 32e6)
    assert run_.memory.entries == {"method_pool": (2028, 4096), "stack": (2324, 32768)}
    assert run_.errors == [DeviceError(20, "Operator missing")]
    assert run_.fault.registers == regs
    assert run_.logs == [Log("héllo ✓")]
    assert run_.done == Done(0, enc.count - 1)
    s = run_.stats
    assert s.clean, s.problems()
    assert s.noise_bytes == len(b"Boot banner v1.0\r\nprintf: hi\n")
    assert s.frames_accepted == enc.count and s.bytes_total == len(data)


def test_tensor_edge_shapes():
    enc = StreamEncoder()
    scalar = np.array(3.5, dtype=np.float64)
    empty = np.zeros((2, 0, 3), dtype=np.int32)
    flags = np.array([True, False, True])
    big = np.arange(40000, dtype=np.float32)  # 160 KB: 3 chunks of at most 64 KiB
    data = (enc.hello(**HELLO) + enc.tensor(0, scalar) + enc.tensor(1, empty)
            + enc.tensor(2, flags) + enc.tensor(3, big) + enc.done())
    run_ = decode(data)
    assert run_.tensors[0] == tensor(0, scalar) and run_.tensors[0].data.shape == ()
    assert run_.tensors[1] == tensor(1, empty)
    assert run_.tensors[2] == tensor(2, flags)
    assert run_.tensors[3] == tensor(3, big)
    assert len(tensor_payloads(3, big)) == 3
    assert run_.outcome().ok


def test_fault_flags_and_outcome():
    regs = dict.fromkeys(FAULT_REGISTERS, 0)
    regs.update(pc=0x10000123, cfsr=(1 << 16) | (1 << 15) | (1 << 9), hfsr=1 << 30,
                bfar=0xDEAD0000)
    enc = StreamEncoder()
    run_ = decode(enc.hello(**HELLO) + enc.fault(regs) + enc.done(2))
    assert run_.fault.cfsr_flags == ["PRECISERR", "BFARVALID", "UNDEFINSTR"]
    assert run_.fault.hfsr_flags == ["FORCED"]
    o = run_.outcome()
    assert o.exit_code == ExitCode.FAULT
    assert "pc=0x10000123" in o.cause and "UNDEFINSTR" in o.cause and "BFAR=0xdead0000" in o.cause


# ---- classification -------------------------------------------------------------------------

def _outcome(data: bytes, timed_out: bool = False):
    return decode(data).outcome(timed_out=timed_out)


def test_outcome_classes():
    e = StreamEncoder()
    ok = e.hello(**HELLO) + e.log("x") + e.done(0)
    assert _outcome(ok).ok
    assert _outcome(b"").exit_code == ExitCode.NO_BOOT
    o = _outcome(b"Hard fault before main\r\n", timed_out=True)
    assert o.exit_code == ExitCode.NO_BOOT and "Hard fault before main" in o.cause
    garbled = bytearray(ok)
    for i in range(5, len(garbled), 9):
        garbled[i] ^= 0x10
    o = _outcome(bytes(garbled))
    assert o.exit_code == ExitCode.PROTOCOL and "corrupted" in o.cause

    e = StreamEncoder()
    assert _outcome(e.hello(**HELLO) + e.error(20, "Operator missing") + e.done(1)
                    ).exit_code == ExitCode.DEVICE_ERROR
    e = StreamEncoder()
    o = _outcome(e.hello(**HELLO) + e.error(0x100B, "planned_pool[0] too small") + e.done(3))
    assert o.exit_code == ExitCode.MEMORY and "rebuild" in o.hint
    e = StreamEncoder()
    o = _outcome(e.hello(**HELLO) + e.error(0x4242, "a pool too small") + e.done(3))
    assert o.exit_code == ExitCode.DEVICE_ERROR and "pool" in o.hint
    e = StreamEncoder()
    assert _outcome(e.hello(**HELLO) + e.done(1)).exit_code == ExitCode.DEVICE_ERROR

    e = StreamEncoder()
    partial = e.hello(**HELLO) + e.log("running")
    o = _outcome(partial, timed_out=True)
    assert o.exit_code == ExitCode.TIMEOUT and "hello(board=qemu-an547" in o.cause
    assert "'running'" in o.cause and "no done" in o.cause
    assert _outcome(partial).exit_code == ExitCode.PROTOCOL

    e = StreamEncoder()
    frames = [e.hello(**HELLO), e.log("a"), e.log("b"), e.done(0)]
    o = _outcome(frames[0] + frames[2] + frames[3])
    assert o.exit_code == ExitCode.PROTOCOL and "1 dropped" in o.cause


def test_only_unknown_or_malformed_frames_is_protocol_not_no_boot():
    assert _outcome(encode_record(99, 0, b"xyz")).exit_code == ExitCode.PROTOCOL
    assert _outcome(encode_record(RecordType.DONE, 0, b"\x00")).exit_code == ExitCode.PROTOCOL


# ---- fixed corruption cases -----------------------------------------------------------------

def _three_logs() -> list[bytes]:
    e = StreamEncoder()
    return [e.hello(**HELLO), e.log("one"), e.log("two"), e.done()]


@pytest.mark.parametrize("field_offset,reason", [(3, "bad_version"), (8 + 2, "bad_length"),
                                                 (-1, "bad_crc"), (12, "bad_crc")])
def test_single_corruption_is_counted_once(field_offset, reason):
    frames = _three_logs()
    bad = bytearray(frames[1])
    bad[field_offset] ^= 0x02
    dec = run(b"".join([frames[0], bytes(bad), *frames[2:]]))
    s = dec.stats
    assert [type(r) for r in dec.records] == [Hello, Log, Done]
    assert s.corrupted_frames == 1 and s.corrupted_by_reason == {reason: 1}
    assert s.dropped_records == 1 and s.noise_bytes == len(bad)


def test_version_2_frame_with_valid_crc_is_rejected():
    f = encode_record(RecordType.LOG, 0, b"future", version=2)
    dec = run(f)
    assert dec.records == [] and dec.stats.corrupted_by_reason == {"bad_version": 1}


def test_length_over_65536_is_rejected_and_65536_accepted():
    big = encode_record(RecordType.LOG, 0, b"a" * 65536)
    assert decode(big).logs == [Log("a" * 65536)]
    hdr = MAGIC + struct.pack("<BBBHI", 1, 8, 0, 0, 65537)
    dec = run(hdr + b"x" * 100)
    assert dec.stats.corrupted_by_reason == {"bad_length": 1} and not dec.records


def test_malformed_payloads_are_not_reported():
    bad_tensor_total = struct.pack("<HBBI", 0, 6, 1, 4) + struct.pack("<fiII", 0, 0, 99, 0)
    half_dtype = struct.pack("<HBBI", 0, 5, 1, 1) + struct.pack("<fiII", 0, 0, 2, 0) + b"xx"
    past_end = struct.pack("<HBBI", 0, 1, 1, 2) + struct.pack("<fiII", 0, 0, 2, 1) + b"xx"
    payloads = [
        (RecordType.HELLO, b"protocol=1\nno_equals_sign"),
        (RecordType.HELLO, b"\xff\xfe=1"),
        (RecordType.TIMING, timing_payload(1, 2, 3)[:-1]),
        (RecordType.MEMORY, b"\x05stack\x00"),
        (RecordType.MEMORY, b"\x02\xff\xfe" + b"\x00" * 8),
        (RecordType.ERROR, b"\x01\x00"),
        (RecordType.FAULT, b"\x00" * 51),
        (RecordType.DONE, b"\x00" * 9),
        (RecordType.TENSOR, b"\x00\x00"),
        (RecordType.TENSOR, bad_tensor_total),
        (RecordType.TENSOR, half_dtype),
        (RecordType.TENSOR, past_end),
    ]
    data = b"".join(encode_record(t, i, p) for i, (t, p) in enumerate(payloads))
    dec = run(data)
    assert dec.records == []
    assert dec.stats.malformed_records == len(payloads) and dec.stats.dropped_records == 0
    assert dec.stats.corrupted_frames == 0 and dec.stats.noise_bytes == 0


def test_unknown_type_keeps_seq_and_is_flagged():
    e = StreamEncoder()
    data = e.hello(**HELLO) + e.frame(42, b"new") + e.done()
    run_ = decode(data)
    assert run_.stats.unknown_records == {42: 1} and run_.stats.dropped_records == 0
    assert run_.outcome().exit_code == ExitCode.PROTOCOL


def test_nonzero_flags_are_accepted_and_counted():
    dec = run(encode_record(RecordType.LOG, 0, b"x", flags=3))
    assert dec.records == [Log("x")] and dec.stats.nonzero_flags == 1


def test_seq_gap_across_wrap_and_backwards_seq():
    data = (encode_record(RecordType.LOG, 65534, b"a") + encode_record(RecordType.LOG, 65535, b"b")
            + encode_record(RecordType.LOG, 1, b"c"))
    s = run(data).stats
    assert s.dropped_records == 65534 + 1 and s.out_of_order_frames == 0
    f = _three_logs()
    back = encode_record(RecordType.LOG, 1, b"replayed")
    dec = run(b"".join([f[0], f[1], f[2], back, f[3]]))
    assert dec.stats.out_of_order_frames == 1 and dec.stats.dropped_records == 0
    assert Log("replayed") in dec.records


def test_full_seq_wrap_is_not_a_drop():
    e = StreamEncoder()
    parts = [e.hello(**HELLO)] + [e.log("") for _ in range(70_000)]
    parts.append(e.done())
    run_ = decode(b"".join(parts))
    s = run_.stats
    assert s.dropped_records == 0 and s.duplicate_frames == 0 and not s.done_mismatch
    assert run_.done == Done(0, 70_001) and run_.outcome().ok


def test_first_seq_not_zero_counts_drops():
    dec = run(encode_record(RecordType.LOG, 7, b"late"))
    assert dec.stats.dropped_records == 7 and dec.records == [Log("late")]


def test_done_records_mismatch():
    data = encode_record(RecordType.HELLO, 0, b"a=1") + encode_record(RecordType.DONE, 1,
                                                                      struct.pack("<II", 0, 5))
    run_ = decode(data)
    assert run_.stats.done_mismatch and run_.outcome().exit_code == ExitCode.PROTOCOL


def test_records_after_done_are_flagged():
    e = StreamEncoder()
    run_ = decode(e.hello(**HELLO) + e.done() + e.log("late"))
    assert run_.stats.records_after_done == 1
    assert run_.outcome().exit_code == ExitCode.PROTOCOL


def test_duplicate_frames_are_ignored_and_flagged():
    f = _three_logs()
    dec = run(b"".join([f[0], f[0], f[1], f[2], f[1], f[2], f[3]]))
    assert dec.records == [Hello(HELLO), Log("one"), Log("two"), Done(0, 3)]
    assert dec.stats.duplicate_frames == 3 and dec.stats.dropped_records == 0
    assert RunRecords.build(dec.records, dec.stats).outcome().exit_code == ExitCode.PROTOCOL


def test_reboot_is_a_reset_not_a_duplicate():
    f = _three_logs()
    dec = run(b"".join([f[0], f[1], f[0], f[1], f[2], f[3]]))
    s = dec.stats
    assert s.resets == 1 and s.duplicate_frames == 0 and s.dropped_records == 0
    assert [type(r) for r in dec.records] == [Hello, Log, Hello, Log, Log, Done]
    assert "rebooted" in RunRecords.build(dec.records, s).outcome().cause


def test_tensor_chunks_out_of_order_missing_and_conflicting():
    arr = np.arange(50, dtype=np.int16)
    chunks = tensor_payloads(4, arr, chunk_size=16)  # 7 chunks
    order = [3, 0, 6, 1, 5, 2, 4]

    def stream(payloads):
        e = StreamEncoder()
        return (e.hello(**HELLO) + b"".join(e.frame(RecordType.TENSOR, p) for p in payloads)
                + e.done())

    run_ = decode(stream([chunks[i] for i in order]))
    assert run_.tensors == {4: tensor(4, arr)} and run_.stats.clean
    # Overlap with identical bytes is fine.
    assert decode(stream([chunks[0], chunks[0][:-2], *chunks[1:]])).stats.clean
    # A missing chunk (renumbered, so no seq gap): the tensor is never reported.
    run_ = decode(stream(chunks[:2] + chunks[3:]))
    assert run_.tensors == {} and run_.stats.incomplete_tensors == [4]
    assert run_.stats.dropped_records == 0
    assert run_.outcome().exit_code == ExitCode.PROTOCOL
    # Overlapping chunk with different bytes: conflict, reassembly restarts.
    evil = bytearray(chunks[1])
    evil[-1] ^= 1
    run_ = decode(stream([chunks[0], chunks[1], bytes(evil), *chunks[2:]]))
    assert run_.stats.tensor_conflicts == 1 and run_.tensors == {}
    assert run_.stats.incomplete_tensors == [4]
    # Header mismatch between chunks of one index.
    other = tensor_payloads(4, arr.astype(np.int32), chunk_size=16)
    run_ = decode(stream([chunks[0], other[1]]))
    assert run_.stats.tensor_conflicts == 1


def test_huge_tensor_claim_is_refused_without_allocating():
    payload = (struct.pack("<HBB", 0, 0, 2) + struct.pack("<2I", 65536, 65535)
               + struct.pack("<fiII", 0, 0, 65536 * 65535, 0) + b"x")
    dec = run(encode_record(RecordType.TENSOR, 0, payload))
    assert dec.stats.malformed_records == 1


def test_truncated_trailing_frame():
    f = _three_logs()
    data = b"".join(f[:3]) + b"noise" + f[3][:10]
    dec = run(data)
    assert dec.stats.truncated_trailing_frame and dec.stats.truncated_bytes == 10
    assert dec.stats.noise_bytes == 5 and dec.stats.corrupted_frames == 0
    assert RunRecords.build(dec.records, dec.stats).outcome().exit_code == ExitCode.PROTOCOL


def test_false_start_with_long_length_does_not_hide_later_frames():
    f = _three_logs()
    bogus = MAGIC + b"\x01\x08\x00\x09\x00" + struct.pack("<I", 60000)
    dec = Decoder()
    got = dec.feed(f[0] + bogus + f[1] + f[2] + f[3])
    assert got == [Hello(HELLO)]  # the rest waits for the bogus frame's 60000 bytes
    got = dec.finish()
    assert got == [Log("one"), Log("two"), Done(0, 3)]
    assert dec.stats.corrupted_frames == 1 and not dec.stats.truncated_trailing_frame
    assert dec.stats.noise_bytes == len(bogus)


def test_finish_is_idempotent_and_feed_accepts_buffers():
    dec = Decoder()
    f = _three_logs()
    assert dec.feed(memoryview(f[0])) == [Hello(HELLO)]
    assert dec.feed(bytearray(f[1])) == [Log("one")]
    dec.finish()
    assert dec.finish() == [] and dec.stats.finished


# ---- fuzzing --------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(0, 300), max_size=10))
def test_random_bytes_never_crash_nor_invent_records(data, chunks):
    dec = run(data, chunks)
    assert dec.stats.frames_accepted + dec.stats.duplicate_frames == len(reference_frames(data))
    assert dec.stats.bytes_total == len(data)


@FUZZ
@given(streams(), st.lists(_clean_noise, min_size=1, max_size=6),
       st.lists(st.integers(0, 200), max_size=12))
def test_round_trip_with_clean_noise_and_any_chunking(stream, noise, chunks):
    frames, expected = stream
    data, _ = join(frames, noise)
    dec = run(data, chunks)
    assert dec.records == expected
    s = dec.stats
    assert s.clean, s.problems()
    assert s.noise_bytes == len(data) - sum(len(f) for f in frames)
    assert s.frames_accepted == len(frames)
    run_ = RunRecords.build(dec.records, s)
    known = [CODES[e.code] for e in run_.errors if e.code in CODES]  # errors.yaml's classes
    assert run_.outcome().exit_code == (
        ExitCode.FAULT if run_.fault else
        ExitCode[known[0].exit_class] if known else
        ExitCode.DEVICE_ERROR if run_.errors or run_.done.status else ExitCode.OK)


@FUZZ
@given(streams(max_ops=5), st.lists(_dirty_noise, min_size=1, max_size=6),
       st.lists(st.integers(0, 200), max_size=12))
def test_dirty_noise_between_frames_loses_nothing(stream, noise, chunks):
    frames, expected = stream
    data, _ = join(frames, noise)
    dec = run(data, chunks)
    assert dec.records == expected
    assert dec.stats.dropped_records == 0 and dec.stats.malformed_records == 0
    one_shot = run(data)
    assert one_shot.stats == dec.stats  # chunking never changes the counts


@st.composite
def mutated(draw):
    frames, expected = draw(streams(max_ops=5))
    data = bytearray(join(frames, [b"boot\r\n"])[0])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[pos:pos] = draw(_dirty_noise)
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 20))]
        else:
            del data[pos:]
    return bytes(data), expected


@FUZZ
@given(mutated(), st.lists(st.integers(0, 200), max_size=12))
def test_corrupted_streams_only_yield_true_records(case, chunks):
    data, expected = case
    dec = run(data, chunks)
    # Every reported record is one the device really sent, in order; nothing is invented.
    assert is_subsequence(dec.records, expected)
    ref = reference_frames(data)
    s = dec.stats
    assert s.frames_accepted + s.duplicate_frames == len(ref)
    framed = sum(end - start for start, end, _ in ref)
    assert s.noise_bytes + framed + s.truncated_bytes == len(data)
    if len(dec.records) < len(expected):  # a loss is never reported as success
        assert not RunRecords.build(dec.records, s).outcome().ok
    assert run(data).stats == s


@FUZZ
@given(streams(max_ops=6), st.data())
def test_dropped_and_duplicated_frames_are_counted(stream, data):
    frames, _ = stream
    n = len(frames)
    middle = list(range(1, n - 1))  # keep hello and done
    dropped = set(data.draw(st.lists(st.sampled_from(middle), unique=True, max_size=n),
                            label="dropped")) if middle else set()
    kept = [f for i, f in enumerate(frames) if i not in dropped]
    dups = data.draw(st.lists(st.integers(1, len(kept) - 1), max_size=3), label="dups")
    out = list(kept)
    for i in sorted(dups, reverse=True):
        out.insert(i + 1, kept[i])  # a copy right after the original
    dec = run(b"".join(out))
    s = dec.stats
    assert s.dropped_records == len(dropped)
    assert s.duplicate_frames == len(dups)
    assert s.frames_accepted == len(kept)
    run_ = RunRecords.build(dec.records, s)
    if dropped or dups:
        # A device error that arrived is classified by the error table (0x31, a delegate's
        # failed allocation, is MEMORY); anything else is the protocol's or a fault's.
        table = {ExitCode[CODES[e.code].exit_class] for e in run_.errors if e.code in CODES}
        assert run_.outcome().exit_code in {ExitCode.PROTOCOL, ExitCode.FAULT,
                                            ExitCode.DEVICE_ERROR, *table}


@FUZZ
@given(streams(max_ops=4), st.integers(0, 10_000))
def test_truncation_is_reported_precisely(stream, cut_seed):
    frames, expected = stream
    data, spans = join(frames, [b"log line\r\n"])
    cut = cut_seed % (len(data) + 1)
    dec = run(data[:cut])
    inside = [(a, b) for a, b in spans if a < cut < b]
    s = dec.stats
    if inside and cut - inside[0][0] >= 3:
        assert s.truncated_trailing_frame and s.truncated_bytes == cut - inside[0][0]
    else:
        assert not s.truncated_trailing_frame
    complete = sum(1 for _, b in spans if b <= cut)
    assert s.frames_accepted == complete and s.corrupted_frames == 0
    assert is_subsequence(dec.records, expected)


_tensor_like = st.builds(
    lambda idx, dt, dims, tail, data: struct.pack("<HBB", idx, dt, len(dims))
    + struct.pack(f"<{len(dims)}I", *dims) + tail + data,
    st.integers(0, 3), st.sampled_from([0, 1, 5, 6, 11, 200]),
    st.lists(st.integers(0, 5), max_size=3), st.binary(min_size=0, max_size=16),
    st.binary(max_size=40))


@FUZZ
@given(st.lists(st.tuples(st.integers(0, max(RecordType) + 2),
                          st.one_of(st.binary(max_size=120), _tensor_like)), max_size=12))
def test_crc_valid_frames_with_arbitrary_payloads_never_crash(frames):
    data = b"".join(encode_record(t, i, p) for i, (t, p) in enumerate(frames))
    dec = run(data)
    s = dec.stats
    assert s.frames_accepted == len(frames) and s.corrupted_frames == 0
    assert s.dropped_records == 0 and s.noise_bytes == 0
    # every record is one of the protocol's types (a type the decoder does not know is skipped)
    assert all(isinstance(r, typing.get_args(Record)) for r in dec.records)
    RunRecords.build(dec.records, s).outcome()


# ---- the npu record (Ethos-U firmware) -------------------------------------------------------

U85_COUNTERS = {"sram_rd_beats": 1_234_567, "sram_wr_beats": 456_789, "ext_rd_beats": 3_000_000,
                "ext_wr_beats": 0, "idle_cycles": 12_345, "mac_active_cycles": 987_654}


def test_npu_records_round_trip_in_order():
    from deploykit.readers.protocol import NpuRun

    enc = StreamEncoder()
    data = (enc.hello(**HELLO) + enc.npu(0, 1_900_000, 2_100_000, U85_COUNTERS)
            + enc.npu(1, 2**40, 7, {"idle_cycles": 3}) + enc.done(0))
    run_ = decode(data)
    assert run_.stats.clean, run_.stats.problems()
    assert run_.npu_runs == [NpuRun(0, 1_900_000, 2_100_000, U85_COUNTERS),
                             NpuRun(1, 2**40, 7, {"idle_cycles": 3})]
    assert run_.outcome().exit_code == ExitCode.OK


@pytest.mark.parametrize("payload", [
    b"\x00" * 20,  # shorter than its fixed part
    struct.pack("<IQQB", 0, 1, 2, 1) + b"\x05idle",  # a counter cut short
    struct.pack("<IQQB", 0, 1, 2, 0) + b"x",  # bytes after the counters
])
def test_malformed_npu_records_are_not_reported(payload):
    run_ = decode(StreamEncoder().hello(**HELLO) + encode_record(9, 1, payload)
                  + encode_record(7, 2, struct.pack("<II", 0, 2)))
    assert run_.npu_runs == [] and run_.stats.malformed_records == 1
    assert run_.outcome().exit_code == ExitCode.PROTOCOL


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no host C compiler")
def test_firmware_npu_encoder_matches_the_decoder(tmp_path):
    """dk_protocol.c's dk_send_npu, compiled for the host, decoded by the host decoder."""
    import subprocess

    from deploykit.readers.boards import repo_root
    from deploykit.readers.protocol import NpuRun

    fw = repo_root() / "firmware"
    main = tmp_path / "main.c"
    main.write_text(r'''#include <stdio.h>
#include "dk_protocol.h"
void dk_console_write(const void *d, size_t n) { fwrite(d, 1, n, stdout); }
int main(void) {
  const dk_counter_t c[] = {{"axi0_rd_beats", 11}, {"axi0_wr_beats", 22},
                            {"axi1_rd_beats", 33}, {"idle_cycles", 0xFFFFFFFFull + 1}};
  dk_send_hello("protocol=1\nboard=corstone-300");
  dk_send_npu(0, 123456789012ull, 42, c, 4);
  dk_send_npu(1, 5, 6, NULL, 0);
  dk_send_done(0);
  return 0;
}
''')
    exe = tmp_path / "enc"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{fw / 'protocol'}",
                    f"-I{fw / 'boards'}", str(main), str(fw / "protocol" / "dk_protocol.c"),
                    "-o", str(exe)], check=True, capture_output=True)
    run_ = decode(subprocess.run([str(exe)], check=True, capture_output=True).stdout)
    assert run_.stats.clean, run_.stats.problems()
    assert run_.npu_runs == [
        NpuRun(0, 123456789012, 42, {"axi0_rd_beats": 11, "axi0_wr_beats": 22,
                                     "axi1_rd_beats": 33, "idle_cycles": 2**32}),
        NpuRun(1, 5, 6, {})]


def test_no_npu_error_says_what_to_do():
    enc = StreamEncoder()
    run_ = decode(enc.hello(**HELLO) + enc.error(0x1007, "no Ethos-U at 0x58102000: ID register "
                                                        "read 0x00000000") + enc.done(1))
    outcome = run_.outcome()
    assert outcome.exit_code == ExitCode.DEVICE_ERROR
    assert "DK_ERR_NO_NPU (0x1007): no Ethos-U at 0x58102000" in outcome.cause
    assert "FVP" in outcome.hint and "--flow cortex_m_int8" in outcome.hint
