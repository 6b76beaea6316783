"""Serve firmware's side of the host -> device frames (docs/protocol.md, "Host -> device").

The device side is not a mock: firmware/protocol/dk_stream.c (the parser) and dk_protocol.c
(the encoder), compiled for the host with serve firmware's loop around a stand-in model
(tests/serve_standin.c). Scripts of host frames made with deploykit's own encoder
(deploykit.readers.protocol.host_frames) go to its stdin, fed to the parser byte by byte or in
chunks, and its records are read back with the host decoder: good samples, and every kind of
bad frame, each followed by a good sample that must still be served.
"""

from __future__ import annotations

import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from deploykit.program.export import memory_order_bytes
from deploykit.readers.protocol import (
    DeviceError,
    Ready,
    RunRecords,
    SampleDone,
    Tensor,
    TensorSpec,
    decode,
)
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.readers.protocol.host_frames import (
    HostEncoder,
    HostType,
    chunks_of,
    encode_frame,
    input_head_size,
    input_payloads,
)
from deploykit.run.report import logical_order
from deploykit.util.errors import ExitCode
from tests.protocol_encoder import StreamEncoder
from tests.serve import CC, F32, I8, I32, IN0_ORDER, build_standin, sample

needs_cc = pytest.mark.skipif(CC is None, reason="no host C compiler (apt-get install gcc)")
CODE = {name: BY_NAME[name].code for name in (
    "STREAM_CRC", "STREAM_VERSION", "STREAM_TYPE", "STREAM_LENGTH", "STREAM_SHAPE",
    "STREAM_OFFSET", "STREAM_OVERRUN", "STREAM_INCOMPLETE")}

@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    if CC is None:
        pytest.skip("no host C compiler (apt-get install gcc)")
    return build_standin(tmp_path_factory.mktemp("serve"))


def device(exe: Path, script: bytes, chunk: int = 4096) -> RunRecords:
    """The device's records for a script of host frames, fed `chunk` bytes at a time."""
    proc = subprocess.run([str(exe), f"chunk={chunk}"], input=script, capture_output=True,
                          timeout=30, check=True)
    return decode(proc.stdout)


def input_arrays(in0: np.ndarray, in1: np.ndarray) -> list[tuple[int, list[int], bytes]]:
    return [(F32, [1, 2, 3], memory_order_bytes(in0, IN0_ORDER)), (I8, [5], in1.tobytes())]


def send_sample(enc: HostEncoder, k: int, chunk_bytes: int = 4096) -> bytes:
    return enc.inputs(k, input_arrays(*sample(k)), chunk_bytes)


def answers(run: RunRecords) -> list[tuple[SampleDone, dict[int, Tensor]]]:
    """Each sample_done with the tensors sent right before it."""
    out, tensors = [], {}
    for r in run.records:
        if isinstance(r, Tensor):
            tensors[r.index] = r
        elif isinstance(r, SampleDone):
            out.append((r, tensors))
            tensors = {}
    return out


def assert_answer(answer: tuple[SampleDone, dict[int, Tensor]], k: int, run_seq: int) -> None:
    done, tensors = answer
    assert (done.sample, done.status, done.ticks, done.run_seq) == (k, 0, 1000 + k, run_seq)
    in0, in1 = sample(k)
    np.testing.assert_array_equal(logical_order(tensors[0].data, IN0_ORDER), in0 * 2)
    assert tensors[1].data.tolist() == [int(in1.astype(np.int32).sum())]


def error_codes(run: RunRecords) -> list[int]:
    return [r.code for r in run.records if isinstance(r, DeviceError)]


# ---- the encoder ------------------------------------------------------------------------------

def test_input_frame_layout():
    data = bytes(range(10))
    (p,) = input_payloads(7, 1, F32, [1, 2, 3], data, chunk_bytes=100)
    assert p == struct.pack("<IHBB3iI", 7, 1, F32, 3, 1, 2, 3, 0) + data
    assert len(p) == input_head_size(3) + 10
    frame = encode_frame(HostType.RUN, 65537, struct.pack("<I", 9))
    assert frame[:3] == b"\xa5DK" and frame[3:12] == struct.pack("<BBBHI", 1, 0x41, 0, 1, 4)
    assert frame[-4:] == struct.pack("<I", zlib.crc32(frame[3:-4]))


def test_inputs_are_chunked_in_order_and_an_empty_one_is_one_chunk():
    chunks = input_payloads(0, 0, I8, [10], bytes(range(10)), chunk_bytes=4)
    head = input_head_size(1)
    assert [struct.unpack_from("<I", c, head - 4)[0] for c in chunks] == [0, 4, 8]
    assert b"".join(c[head:] for c in chunks) == bytes(range(10))
    assert chunks_of(10, 1, chunk_bytes=4) == 3
    assert len(input_payloads(0, 0, F32, [0], b"")) == 1
    with pytest.raises(ValueError, match="rank 9"):
        input_payloads(0, 0, F32, [1] * 9, b"")


def test_host_seq_wraps():
    enc = HostEncoder(start_seq=65535)
    assert enc.run(0)[0] == 65535 and enc.end()[0] == 0


# ---- the decoder's side: ready, sample_done, per-sample errors --------------------------------

def test_ready_and_sample_done_round_trip():
    e = StreamEncoder()
    data = (e.hello(protocol="1", serve="1") + e.ready([(F32, [1, 2, 3], [0, 2, 1])],
                                                         [(I32, [1], [0])])
            + e.sample_done(4, 0, 1234, 17) + e.done())
    run = decode(data)
    assert run.ready == Ready((TensorSpec(F32, (1, 2, 3), (0, 2, 1), 24),),
                              (TensorSpec(I32, (1,), (0,), 4),))
    assert run.ready.inputs[0].describe() == "float32 [1, 2, 3] dim order [0, 2, 1]"
    assert run.sample_dones == [SampleDone(4, 0, 1234, 17)]
    assert run.outcome().ok


@pytest.mark.parametrize("payload", [
    struct.pack("<HHBBI", 1, 0, F32, 1, 4) + struct.pack("<i", 1) + bytes([1]),  # order [1]
    struct.pack("<HHBBI", 1, 0, F32, 1, 8) + struct.pack("<i", 1) + bytes([0]),  # nbytes
    struct.pack("<HHBBI", 1, 0, F32, 1, 4) + struct.pack("<i", 1) + bytes([0, 9]),  # tail
    struct.pack("<HHBBI", 2, 0, F32, 1, 4) + struct.pack("<i", 1) + bytes([0]),  # 2nd missing
])
def test_malformed_ready_is_not_reported(payload):
    e = StreamEncoder()
    run = decode(e.frame(15, payload))
    assert run.ready is None and run.stats.malformed_records == 1


def test_serve_errors_are_per_sample_and_do_not_fail_the_run():
    """Rejections, and an error right before a sample_done, belong to one sample; an error at
    the end (no sample_done after it) still fails the run."""
    e = StreamEncoder()
    head = e.hello(protocol="1", serve="1") + e.ready([], [])
    served = (head + e.error(CODE["STREAM_CRC"], "host frame: CRC mismatch")
              + e.error(0x21, "execute failed") + e.sample_done(0, 0x21)
              + e.sample_done(1) + e.done())
    run = decode(served)
    assert [x.code for x in run.sample_errors] == [CODE["STREAM_CRC"], 0x21]
    assert run.errors == [] and run.outcome().ok
    e = StreamEncoder()
    failed = decode(e.hello(serve="1") + e.error(0x23, "Program::load failed") + e.done(1))
    assert [x.code for x in failed.errors] == [0x23]
    assert failed.outcome().exit_code == ExitCode.DEVICE_ERROR


# ---- the parser, compiled for the host ---------------------------------------------------------

@needs_cc
@pytest.mark.parametrize("chunk", [1, 3, 64, 4096])
def test_samples_are_served_in_any_chunking(standin, chunk):
    enc = HostEncoder()
    script, run_seqs = b"", []
    for k in range(4):
        script += send_sample(enc, k, chunk_bytes=4)  # input 0 in six 4-byte chunks
        seq, frame = enc.run(k)
        script += frame
        run_seqs.append(seq)
    seq, frame = enc.run(3)  # the host did not get the answer: asks again
    script += frame + enc.end()[1]
    run = device(standin, script, chunk)
    assert run.hello.fields["serve"] == "1" and run.ready.inputs[0].dim_order == (0, 2, 1)
    got = answers(run)
    assert len(got) == 5
    for k in range(4):
        assert_answer(got[k], k, run_seqs[k])
    assert_answer(got[4], 3, seq)  # the same answer, not executed again:
    assert run.timing.iterations == 4 and run.timing.ticks == sum(1000 + k for k in range(4))
    assert error_codes(run) == [] and run.done.status == 0
    assert run.outcome().ok and run.stats.clean


def _bad(enc: HostEncoder, ftype: int, payload: bytes, **kw) -> bytes:
    return encode_frame(ftype, enc.frame(ftype, b"")[0], payload, **kw)


def _input(k: int, index: int, dtype: int, sizes: list[int], offset: int, data: bytes) -> bytes:
    return struct.pack(f"<IHBB{len(sizes)}iI", k, index, dtype, len(sizes), *sizes,
                       offset) + data


# Each case: the bad frames (made with the sample's encoder), the codes they draw, and a piece of
# the message. Every case then sends sample 0 whole and runs it, which must be answered.
BAD = {
    "crc": (lambda enc: _flip(send_sample(enc, 0, chunk_bytes=8), 2 * 48 + 40)
            + enc.run(0)[1], ["STREAM_CRC", "STREAM_INCOMPLETE"], "CRC mismatch"),
    "version": (lambda enc: _bad(enc, HostType.RUN, struct.pack("<I", 0), version=2),
                ["STREAM_VERSION"], "version 2"),
    "type": (lambda enc: _bad(enc, 0x43, b"xyz"), ["STREAM_TYPE"], "unknown type"),
    "run length": (lambda enc: _bad(enc, HostType.RUN, bytes(5)), ["STREAM_LENGTH"],
                   "a run carries 4 bytes"),
    "end length": (lambda enc: _bad(enc, HostType.END, b"\0"), ["STREAM_LENGTH"],
                   "an end carries none"),
    "input shorter than 8": (lambda enc: _bad(enc, HostType.INPUT, bytes(6)), ["STREAM_LENGTH"],
                             "shorter than the input header (8 bytes)"),
    "input header cut": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, F32, [1, 2, 3], 0,
                                                                       b"")[:-4]),
                         ["STREAM_LENGTH"], "shorter than the input header (24 bytes)"),
    "length over the limit": (lambda enc: b"\xa5DK" + struct.pack("<BBBHI", 1, 0x40, 0, 0,
                                                                   70000),
                              ["STREAM_LENGTH"], "over the protocol's 65536"),
    "dtype": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, I32, [1, 2, 3], 0, bytes(24))),
              ["STREAM_SHAPE"], "input 0 is dtype 3 [1, 2, 3], the method takes dtype 6"),
    "rank": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, F32, [1, 6], 0, bytes(24))),
             ["STREAM_SHAPE"], "dtype 6 [1, 6], the method takes dtype 6 [1, 2, 3]"),
    "sizes": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, F32, [1, 3, 2], 0, bytes(24))),
              ["STREAM_SHAPE"], "[1, 3, 2]"),
    "index": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 2, F32, [1], 0, bytes(4))),
              ["STREAM_SHAPE"], "input 2, the method has 2"),
    "rank over 8": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, F32, [1] * 9, 0,
                                                                  bytes(4))),
                    ["STREAM_SHAPE"], "of rank 9"),
    "gap": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 0, F32, [1, 2, 3], 8, bytes(8))),
            ["STREAM_OFFSET"], "do not start at 0 or at its next byte, 0"),
    "overrun": (lambda enc: _bad(enc, HostType.INPUT, _input(0, 1, I8, [5], 0, bytes(6))),
                ["STREAM_OVERRUN"], "bytes 0+6 run past its 5"),
    "run incomplete": (lambda enc: enc.inputs(0, input_arrays(*sample(0))[:1]) + enc.run(0)[1],
                       ["STREAM_INCOMPLETE"], "input 1 has 0 of 5 bytes"),
    "run of another sample": (lambda enc: send_sample(enc, 1) + enc.run(0)[1],
                              ["STREAM_INCOMPLETE"], "input 0 holds bytes of sample 1"),
    "noise between frames": (lambda enc: b"boot banner\r\n\xa5\xa5D\x16DKR" + bytes(range(256)),
                             [], ""),
}


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]


@needs_cc
@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("chunk", [1, 4096])
def test_a_bad_frame_is_rejected_and_the_next_sample_is_served(standin, case, chunk):
    make, codes, message = BAD[case]
    enc = HostEncoder()
    script = make(enc)
    script += send_sample(enc, 0)
    seq, frame = enc.run(0)
    run = device(standin, script + frame + enc.end()[1], chunk)
    assert error_codes(run) == [CODE[c] for c in codes]
    assert message in " ".join(e.message for e in run.sample_errors), run.sample_errors
    got = answers(run)
    if "STREAM_INCOMPLETE" in codes:  # the bad run was answered with its failure
        assert got[0][0].status == CODE["STREAM_INCOMPLETE"] and got[0][1] == {}
        got = got[1:]
    assert len(got) == 1
    assert_answer(got[0], 0, seq)
    assert run.errors == [] and run.done.status == 0 and run.outcome().ok


@needs_cc
def test_a_damaged_chunk_voids_only_what_it_wrote(standin):
    """The host may resume an input at its next byte after a rejected chunk, instead of
    sending the whole sample again."""
    enc = HostEncoder()
    in0, in1 = sample(0)
    raw = memory_order_bytes(in0, IN0_ORDER)
    chunks = input_payloads(0, 0, F32, [1, 2, 3], raw, chunk_bytes=8)
    frames = [enc.frame(HostType.INPUT, c)[1] for c in chunks]  # 48 bytes, data from 36
    script = frames[0] + _flip(frames[1], 40) + frames[1] + frames[2]
    script += enc.frame(HostType.INPUT, input_payloads(0, 1, I8, [5], in1.tobytes())[0])[1]
    seq, frame = enc.run(0)
    run = device(standin, script + frame)
    assert error_codes(run) == [CODE["STREAM_CRC"]]
    assert_answer(answers(run)[0], 0, seq)


@needs_cc
def test_writing_the_next_sample_voids_the_last_answer(standin):
    """Once a byte of the next sample is written (even by a chunk that then fails its CRC),
    the last sample's outputs may be gone: asking for its answer again is refused."""
    enc = HostEncoder()
    script = send_sample(enc, 0) + enc.run(0)[1] + _flip(send_sample(enc, 1), 40)
    run = device(standin, script + enc.run(0)[1])
    assert error_codes(run) == [CODE["STREAM_CRC"], CODE["STREAM_INCOMPLETE"]]
    assert [d.status for d in run.sample_dones] == [0, CODE["STREAM_INCOMPLETE"]]
