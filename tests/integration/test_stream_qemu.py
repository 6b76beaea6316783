"""Samples streamed to serve firmware on QEMU (api.stream; issue #28): the real export, runtime
build, serve firmware and QEMU, 20 samples each compared with the host's outputs for that sample
as `run` compares them, and a damaged frame and a frame of the wrong shape sent mid-stream:
both rejected with their error records, and the next sample still served.

Needs the ExecuTorch sources (`deploykit setup`); skips with the reason without them.
"""

from __future__ import annotations

import numpy as np
import pytest

from deploykit import api
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.readers.protocol.host_frames import HostType, input_payloads
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

CASES = [("qemu-an547", "tiny_cnn", "cortex_m_int8"),  # NHWC input: memory order on the wire
         ("qemu-an505", "mlp_mnist", "cortex_m_int8")]
SAMPLES = 20


def write_samples(directory, shape: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    directory.mkdir()
    for k in range(SAMPLES):
        np.save(directory / f"s{k:02d}.npy", rng.uniform(-1.0, 1.0, shape).astype(np.float32))


@pytest.mark.parametrize(("board", "model", "flow"), CASES)
def test_streamed_samples_match_the_host(tmp_path, board, model, flow):
    from tests.unit.test_layout import ONCE_EACH, counted_resolvers

    shape = {"tiny_cnn": (1, 3, 8, 8), "mlp_mnist": (1, 784)}[model]
    write_samples(tmp_path / "samples", shape, seed=len(model))
    with counted_resolvers() as calls:  # the build path resolves the target once, as run does
        session = api.stream(board, model, flow=flow, out=tmp_path / "out",
                             inputs=tmp_path / "samples", timeout=300, project=False)
    assert dict(calls) == ONCE_EACH
    with session:
        assert session.hello.fields["serve"] == "1" and "inputs_sha256" not in session.hello.fields
        ref = session.reference
        assert len(ref.input_sets) == SAMPLES
        spec = session.ready.inputs[0]
        for k, inputs in enumerate(ref.input_sets):
            if k == SAMPLES // 2:
                # Mid-stream, straight onto the link: a chunk of sample k damaged on the way,
                # and a chunk whose sizes are not the input's.
                raw = np.ascontiguousarray(inputs[0]).tobytes()
                (chunk,) = input_payloads(k, 0, spec.dtype, list(spec.sizes), raw,
                                          chunk_bytes=len(raw))
                _, frame = session.encoder.frame(HostType.INPUT, chunk)
                damaged = frame[:40] + bytes([frame[40] ^ 0xFF]) + frame[41:]
                (wrong,) = input_payloads(k, 0, spec.dtype, [1, 4], raw[:16])
                session.link.write(damaged + session.encoder.frame(HostType.INPUT, wrong)[1])
            outputs = session.infer(inputs)
            verdict = ref.check(k, outputs)
            assert verdict.passed, (k, verdict)
    summary = session.close()
    assert summary.outcome.ok and summary.exit_code == 0
    rejected = summary.records.sample_errors
    assert [e.code for e in rejected] == [BY_NAME["STREAM_CRC"].code,
                                          BY_NAME["STREAM_SHAPE"].code]
    assert "CRC mismatch" in rejected[0].message and "[1, 4]" in rejected[1].message
    assert summary.stats.samples == SAMPLES and summary.timing.iterations == SAMPLES
    # The stack is the plain firmware's, fitted or from the board file: the serve loop stays
    # within it, and every pool within its capacity.
    for name, (used, capacity) in summary.memory.items():
        assert 0 <= used <= capacity, name
    assert summary.memory["stack"][0] > 0
    # Serve firmware holds no samples: the embedded input sets are not linked in.
    from elftools.elf.elffile import ELFFile

    elf = tmp_path / "out" / "firmware-serve" / "dk_runner.elf"
    with open(elf, "rb") as f:
        names = {s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    assert "dk_input_sets" not in names
    assert "_ZN12_GLOBAL__N_116serve_input_poolE" in names  # where the samples are received
    assert (tmp_path / "out" / "stream" / "run" / "console.bin").stat().st_size > 0
