"""The host's serve session (deploykit.run.stream.StreamSession) against serve firmware's own
parser and loop (firmware/protocol/dk_stream.c, dk_protocol.c around the stand-in model of
tests/serve_standin.c), compiled for the host and talking over a pipe. The link between them
loses or damages chosen bytes in either direction: a damaged input chunk, a damaged `run`, a
lost answer, a damaged output chunk; the session must get every sample answered right, and
name the sample when the device stops answering.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from deploykit.readers.protocol import RecordType
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.run.stream import (
    SampleTimeout,
    StreamClosed,
    StreamError,
    StreamLink,
    StreamSession,
)
from deploykit.util.errors import ConfigError, ExitCode
from tests.serve import CC, build_standin, expected, sample

pytestmark = pytest.mark.skipif(CC is None, reason="no host C compiler (apt-get install gcc)")


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return build_standin(tmp_path_factory.mktemp("serve"))


Fault = Callable[[int, bytes], bytes]  # (offset of the chunk in its direction, chunk) -> chunk


class PipeLink(StreamLink):
    """The stand-in on a pipe. `to_device` and `from_device` change what passes: each gets a
    chunk and its offset in that direction's stream (bytes lost: return fewer)."""

    description = "the stand-in"

    def __init__(self, exe: Path, *, to_device: Fault | None = None,
                 from_device: Fault | None = None) -> None:
        self.proc = subprocess.Popen([str(exe), "chunk=64"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.to_device, self.from_device = to_device, from_device
        self.sent = self.received = 0
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        out = self.to_device(self.sent, data) if self.to_device else data
        self.sent += len(data)
        try:
            self.proc.stdin.write(out)
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise StreamClosed("the stand-in exited") from exc

    def read(self, timeout_s: float) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return b""
        data = os.read(self.fd, 4096)
        if not data:
            raise StreamClosed(f"the stand-in exited with {self.proc.wait()}")
        out = self.from_device(self.received, data) if self.from_device else data
        self.received += len(data)
        return out

    def close(self, grace_s: float = 5.0) -> int | None:
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def frames(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, frame length) of every frame in a clean stream."""
    out, i = [], 0
    while (i := data.find(b"\xa5DK", i)) >= 0:
        length = int.from_bytes(data[i + 8:i + 12], "little")
        out.append((i, data[i + 4], 16 + length))
        i += 16 + length
    return out


def once(at: int, change: Callable[[bytes], bytes]) -> Fault:
    """A fault on the byte at stream offset `at` (the first time it passes)."""
    def fault(offset: int, chunk: bytes) -> bytes:
        if offset <= at < offset + len(chunk):
            k = at - offset
            return chunk[:k] + change(chunk[k:k + 1]) + chunk[k + 1:]
        return chunk
    return fault


def flip(at: int) -> Fault:
    return once(at, lambda b: bytes([b[0] ^ 0x40]))


def drop(start: int, n: int) -> Fault:
    """Bytes [start, start + n) are lost (counted from where they would have been)."""
    def fault(offset: int, chunk: bytes) -> bytes:
        lo, hi = max(start - offset, 0), min(start + n - offset, len(chunk))
        return chunk if lo >= hi else chunk[:lo] + chunk[hi:]
    return fault


def session(link: StreamLink, **kw) -> StreamSession:
    """A session whose timed retries a loaded machine does not set off (the tests count what
    the damage they make costs), unless a test asks for a short wait."""
    kw.setdefault("timeout_s", 30.0)
    kw.setdefault("answer_wait_s", 5.0)
    return StreamSession(link, **kw)


def serve(link: StreamLink, samples: int = 4, **kw) -> tuple[StreamSession, list]:
    s = session(link, **kw)
    with s:
        answers = [s.infer(list(sample(k))) for k in range(samples)]
    return s, answers


def check(answers: list) -> None:
    for k, outputs in enumerate(answers):
        want = expected(k)
        assert [o.dtype for o in outputs] == [w.dtype for w in want]
        for got, w in zip(outputs, want, strict=True):
            np.testing.assert_array_equal(got, w)


def clean_stream(standin: Path, samples: int = 4) -> bytes:
    seen = bytearray()

    def tap(_offset: int, chunk: bytes) -> bytes:
        seen.extend(chunk)
        return chunk

    serve(PipeLink(standin, from_device=tap), samples)
    return bytes(seen)


def test_samples_come_back_in_logical_order_and_the_totals_at_close(standin):
    s, answers = serve(PipeLink(standin))
    check(answers)
    summary = s.close()  # the second close returns the same summary
    assert summary.outcome.ok and summary.exit_code == 0
    assert summary.timing.iterations == 4 and summary.timing.ticks == 1000 * 4 + 6
    assert summary.memory == {"stack": (100, 1000)}
    st = summary.stats
    assert (st.samples, st.runs_resent, st.samples_resent, st.rejected_frames) == (4, 0, 0, 0)
    assert s.ready.inputs[0].dim_order == (0, 2, 1) and st.samples_per_second > 0


def test_a_damaged_input_chunk_makes_the_host_send_the_sample_again(standin):
    # The host writes each sample's input frames, then its run: damage a data byte of input 0
    # of sample 2.
    clean = PipeLink(standin)
    serve(clean)
    sizes = [len(w) for w in clean.writes]
    at = sum(sizes[:4]) + 12 + 24 + 5  # sample 2's first frame: header, input header, data
    link = PipeLink(standin, to_device=flip(at))
    s, answers = serve(link)
    check(answers)
    summary = s.close()
    assert summary.stats.samples_resent == 1
    # The chunk, then the run of an incomplete sample (twice when the host had sent the run
    # again on the chunk's rejection before the device's first answer reached it).
    codes = [e.code for e in summary.records.sample_errors]
    assert codes[:2] == [BY_NAME["STREAM_CRC"].code, BY_NAME["STREAM_INCOMPLETE"].code]
    assert set(codes[2:]) <= {BY_NAME["STREAM_INCOMPLETE"].code}


def test_a_damaged_run_is_sent_again(standin):
    clean = PipeLink(standin)
    serve(clean)
    sizes = [len(w) for w in clean.writes]
    at = sum(sizes[:6]) - 2  # the CRC of sample 2's run frame, the host's sixth write
    s, answers = serve(PipeLink(standin, to_device=flip(at)))
    check(answers)
    st = s.close().stats
    assert st.runs_resent == 1 and st.samples_resent == 0 and st.rejected_frames == 1


@pytest.mark.parametrize("what", ["lost answer", "damaged output chunk", "damaged answer"])
def test_a_lost_or_damaged_answer_is_asked_for_again(standin, what):
    stream = clean_stream(standin)
    done = [f for f in frames(stream) if f[1] == RecordType.SAMPLE_DONE][1]  # sample 1's
    tensor = [f for f in frames(stream) if f[1] == RecordType.TENSOR][2]  # sample 1's output 0
    fault = {"lost answer": drop(done[0], done[2]),
             "damaged output chunk": flip(tensor[0] + 30),
             "damaged answer": flip(done[0] + 14)}[what]
    # Nothing tells the host that an answer was lost whole: it asks again after the wait.
    s, answers = serve(PipeLink(standin, from_device=fault), answer_wait_s=0.3)
    check(answers)  # sample 1 answered again from the device's last run, not executed again
    summary = s.close()
    assert summary.stats.runs_resent >= 1 and summary.stats.samples_resent == 0
    assert summary.timing.iterations == 4 and summary.outcome.ok
    assert any(n.startswith("recovered on the way") for n in summary.notes)


def test_a_device_that_stops_answering_names_the_sample(standin):
    stream = clean_stream(standin)
    cut = [f for f in frames(stream) if f[1] == RecordType.SAMPLE_DONE][1][0]
    link = PipeLink(standin, from_device=drop(cut, 1 << 30))  # nothing from sample 1's answer on
    s = session(link, timeout_s=1.5, answer_wait_s=0.2)
    with pytest.raises(SampleTimeout, match=r"^sample 1: no answer") as info, s:
        check([s.infer(list(sample(0)))])
        s.infer(list(sample(1)))
    assert info.value.sample == 1 and info.value.exit_code == ExitCode.TIMEOUT
    assert link.proc.poll() is not None  # leaving the block ended the session


def test_inputs_are_checked_before_anything_is_sent(standin):
    link = PipeLink(standin)
    with session(link) as s:
        in0, in1 = sample(0)
        with pytest.raises(ConfigError, match=r"1 input\(s\) given; the model takes 2"):
            s.infer([in0])
        with pytest.raises(ConfigError, match=r"input 0 is float64 \[1, 2, 3\]; the model takes "
                                              r"float32 \[1, 2, 3\] dim order \[0, 2, 1\]"):
            s.infer([in0.astype(np.float64), in1])
        with pytest.raises(ConfigError, match=r"input 1 is int8 \[1, 5\]"):
            s.infer([in0, in1.reshape(1, 5)])
        assert link.writes == []
        check([s.infer([in0, in1])])


def test_a_device_that_ends_the_session_is_an_error_not_a_hang(standin):
    link = PipeLink(standin)
    s = session(link)
    s.start()
    link.proc.kill()  # the device went away without done
    with pytest.raises(StreamError, match="the stand-in closed the link"):
        s.infer(list(sample(0)))
    link.close()


def test_a_session_on_firmware_that_does_not_serve_is_refused(tmp_path):
    from tests.protocol_encoder import StreamEncoder

    e = StreamEncoder()
    exe = tmp_path / "plain.sh"
    exe.write_bytes(b"#!/bin/sh\nprintf '" + "".join(
        f"\\{b:03o}" for b in e.hello(protocol="1", firmware="executorch-runner")).encode()
        + b"'\ncat >/dev/null\n")
    exe.chmod(0o755)
    link = PipeLink(exe)
    with pytest.raises(StreamError, match="does not serve samples") as info:
        session(link, start_timeout_s=5.0).start()
    assert info.value.exit_code == ExitCode.CONFIG
    link.close()


def test_runners_that_cannot_stream_say_so_before_anything_is_built(tmp_path):
    from deploykit import api
    from deploykit.readers.boards import load_board
    from deploykit.run.runners import (
        FvpRunner,
        LinuxRunner,
        PicoRunner,
        QemuRunner,
        runner_for_board,
    )

    assert QemuRunner.supports_stream and PicoRunner.supports_stream
    assert not FvpRunner.supports_stream and not LinuxRunner.supports_stream
    fvp = runner_for_board(load_board("corstone-300"))
    with pytest.raises(ConfigError, match="The fvp runner cannot stream samples"):
        fvp.open_stream(tmp_path / "dk_runner.elf", tmp_path)
    with pytest.raises(ConfigError, match="corstone-300 runs on the fvp runner, which cannot "
                                          "stream samples"):
        api.stream("corstone-300", "tiny_cnn", flow="cortex_m_int8", out=tmp_path / "out",
                   project=False)
    assert not (tmp_path / "out" / "export").exists()


def test_serve_firmware_is_sized_for_the_inputs_the_program_does_not_plan():
    """The size profile's programs read their inputs in place (the plain firmware, from
    flash): serve firmware receives them into a buffer of their size; planned outputs need
    none."""
    from deploykit.pipeline.stream import serve_definitions
    from deploykit.readers.boards import repo_root
    from deploykit.readers.pte_reader import read_pte_info

    data = repo_root() / "tests" / "data"
    pte = data / "tiny_cnn-portable_fp32-qemu-an547.pte"
    info = read_pte_info(pte)
    assert [t.planned for t in info.inputs] == [False] and info.outputs[0].planned
    assert serve_definitions(pte) == {"DK_SERVE": "ON", "DK_SERVE_INPUT_BYTES": "768"}
    assert serve_definitions(data / "mlp_mnist-cortex_m_int8-qemu-an505.pte")[
        "DK_SERVE_INPUT_BYTES"] == str(784 * 4)
