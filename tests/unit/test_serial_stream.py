"""Samples streamed over the serial link (docs/pico2.md, "Serve firmware on the link"): the
Pico 2's own link code (firmware/boards/rp2350/dk_link.c) with serve firmware's parser and loop
(firmware/protocol/dk_stream.c, dk_protocol.c, tests/serve_standin.c's stand-in model), compiled
for the host on the master side of a raw pty, and deploykit's host side on the slave through
real pyserial: the link's handshake (SerialStreamLink), then a serve session (StreamSession).
Both directions carry frames at once on one port, the link's REQUEST/ACK markers among them;
a frame is damaged on the wire each way; a sample whose bytes hold the link's markers is data,
not a command; and a long session does not fill the transcript.
"""

from __future__ import annotations

import numpy as np
import pytest

from deploykit.readers.boards import repo_root
from deploykit.readers.protocol.budget import transcript_bytes
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.run.runners.serial_port import ACK, REQUEST, SerialStreamLink
from deploykit.run.stream import StreamSession
from tests.serve import CC, build_standin, sample
from tests.unit.test_serial_port import Device

pytestmark = pytest.mark.skipif(CC is None, reason="no host C compiler (apt-get install gcc)")
# The transcript the runner would get for the stand-in's outputs (protocol/budget.py).
TRANSCRIPT = transcript_bytes([(24, 3), (4, 1)])


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    fw = repo_root() / "firmware"
    return build_standin(tmp_path_factory.mktemp("serve-link"), "-DSTANDIN_LINK=1",
                         f"-DDK_LINK_TRANSCRIPT_BYTES={TRANSCRIPT}",
                         str(fw / "boards" / "rp2350" / "dk_link.c"), name="serve-link")


# Retries on a timer are slow enough here that a loaded machine does not set them off: these
# tests count what the damage they make costs, nothing else.
def connect(dev: Device) -> SerialStreamLink:
    link = SerialStreamLink(lambda: dev.path, request_interval_s=2.0, description="the pty")
    link.connect(20.0)
    return link


def serve(dev: Device, samples: list[tuple[np.ndarray, np.ndarray]], **kw):
    session = StreamSession(connect(dev), timeout_s=30.0, answer_wait_s=5.0, **kw)
    with session:
        answers = [session.infer(list(s)) for s in samples]
    return session, answers


def check(answers, samples) -> None:
    for outputs, (in0, in1) in zip(answers, samples, strict=True):
        np.testing.assert_array_equal(outputs[0], in0 * 2)
        assert outputs[1].tolist() == [int(in1.astype(np.int32).sum())]


def test_samples_over_the_link_both_ways_on_one_port(standin):
    dev = Device(standin)
    samples = [sample(k) for k in range(6)]
    session, answers = serve(dev, samples)
    check(answers, samples)
    summary = session.close()
    assert summary.outcome.ok and summary.timing.iterations == 6
    assert summary.stats.frames_sent == 6 * 3 + 1  # two inputs and a run each, then end
    code, stats = dev.finish()
    assert code == 0
    # One handshake; every frame reached the firmware as a frame; the ACK after done.
    assert stats["requests"] == 1 and stats["frames"] == 6 * 3 + 1 and stats["acks"] == 1


def test_frames_polled_before_the_firmware_reads_are_kept_for_it(standin):
    """The Pico's timer tick polls the port at any time, also between `ready` and the serve
    loop's first read: the host's first sample, read then, waits for the firmware in the link's
    ring instead of going to the REQUEST/ACK recognizer alone."""
    dev = Device(standin, "poll_ms=500")
    samples = [sample(k) for k in range(2)]
    session, answers = serve(dev, samples)
    check(answers, samples)
    st = session.close().stats
    assert (st.runs_resent, st.samples_resent, st.rejected_frames) == (0, 0, 0)
    assert dev.finish()[0] == 0


def test_a_long_session_goes_out_live_and_does_not_fill_the_transcript(standin):
    """200 answers are about 30 kB, many times the transcript: from the first host frame on,
    the answers go out at once and the transcript keeps only hello and ready."""
    dev = Device(standin)
    samples = [sample(k % 7) for k in range(200)]
    session, answers = serve(dev, samples)
    check(answers, samples)
    assert session.close().stats.bytes_received > 20 * TRANSCRIPT
    _, stats = dev.finish()
    assert stats["overflow"] == 0 and stats["repeats"] == 0
    assert 0 < stats["kept"] < 200  # hello and ready


def test_link_markers_inside_a_sample_are_data(standin):
    """Input 0's bytes hold a REQUEST (16 'D' 'K' 'R' + a nonce), input 1's an ACK: inside a
    host frame they are the sample, so the link answers no second REQUEST, and the firmware
    computes on exactly those bytes."""
    dev = Device(standin)
    in0 = np.frombuffer(REQUEST + b"\x00\x00\x80\x3f" + bytes(16), dtype="<f4").reshape(1, 3, 2)
    in0 = np.ascontiguousarray(in0.transpose(0, 2, 1))  # logical, so that memory is as above
    in1 = np.frombuffer(ACK + b"\x01", dtype=np.int8)
    session, answers = serve(dev, [(in0, in1)])
    np.testing.assert_array_equal(answers[0][0], in0 * 2)
    assert answers[0][1].tolist() == [int(in1.astype(np.int32).sum())]
    session.close()
    _, stats = dev.finish()
    assert stats["requests"] == 1 and stats["acks"] == 1


@pytest.mark.parametrize("direction", ["to the device", "from the device"])
def test_a_frame_damaged_on_the_wire_each_way_is_recovered(standin, direction):
    # To the device: a data byte of sample 1's input 0 (the host's handshake is 8 bytes; each
    # sample is 64 + 37 bytes of input frames and a 20-byte run). From the device: a byte of
    # sample 1's answer (after its SYNC and transcript, and sample 0's answer).
    if direction == "to the device":
        option = f"flip_in={8 + 121 + 12 + 24 + 3}"
    else:
        probe = Device(standin)
        with StreamSession(connect(probe)) as session:
            session.infer(list(sample(0)))
            first_answer = session.stats.bytes_received  # the transcript and sample 0's answer
        probe.finish()
        option = f"flip_out={8 + first_answer + 40}"  # after the SYNC: in output 0's chunk
    dev = Device(standin, option)
    samples = [sample(k) for k in range(3)]
    session, answers = serve(dev, samples)
    check(answers, samples)
    summary = session.close()
    assert summary.outcome.ok and summary.timing.iterations == 3
    if direction == "to the device":
        assert summary.stats.samples_resent == 1
        assert BY_NAME["STREAM_CRC"].code in [e.code for e in summary.records.sample_errors]
    else:
        assert summary.stats.runs_resent >= 1 and summary.stats.samples_resent == 0
        assert summary.records.stats.corrupted_frames == 1
    assert dev.finish()[0] == 0
