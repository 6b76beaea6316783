"""The host side of profiling and numerical debugging against a real export, without the
runtime: the event streams were recorded from profiling firmware on QEMU (tests/data/), the
export is real (about 15 s, shared by the tests here).

- ExecuTorch's Inspector opens deploykit's ETDump with the export's ETRecord, and its operator
  names agree with deploykit's;
- the host's operator-by-operator run of the .pte agrees with the device's traced outputs, and
  names the operator whose requantization scale was changed as the first divergence.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deploykit.pipeline.profiles import PROFILES  # noqa: E402
from deploykit.profiling.etdump import write_etdump  # noqa: E402
from deploykit.profiling.intermediates import compare_intermediates  # noqa: E402
from deploykit.program.export import ETRECORD_NAME, export  # noqa: E402
from deploykit.program.models import load_model  # noqa: E402
from deploykit.readers.protocol import decode  # noqa: E402
from deploykit.readers.trace import (  # noqa: E402
    NATIVE_CALL_PREFIX,
    profile_from_records,
    program_instructions,
)
from tests.perturb import perturb_requantize_scale  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
PROFILE_STREAM = DATA / "profile-mlp_mnist-cortex_m_int8-qemu-an505.bin"
DEBUG_STREAM = DATA / "debug-mlp_mnist-cortex_m_int8-qemu-an505.bin"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """mlp_mnist, cortex_m_int8, as `deploykit profile --board qemu-an505` exported it (the
    board's default profile, size)."""
    out = tmp_path_factory.mktemp("export")
    return export(
        load_model("mlp_mnist", REPO),
        "cortex_m_int8",
        out,
        cpu="cortex-m33",
        options=PROFILES["size"].export_options(),
    )


def _same_program(records, pte: bytes) -> None:
    # The recorded runs are of this very program (the export is reproducible).
    assert records.hello.fields["pte_sha256"] == hashlib.sha256(pte).hexdigest()[:16]


def test_inspector_reads_the_etdump_with_the_etrecord(exported, tmp_path):
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale

    etrecord = exported.pte_path.parent / ETRECORD_NAME
    assert etrecord.is_file()
    records = decode(PROFILE_STREAM.read_bytes())
    pte = exported.pte_path.read_bytes()
    _same_program(records, pte)
    profile = profile_from_records(records, program_instructions(pte))
    etdump = write_etdump(profile, tmp_path / "model.etdump")

    inspector = Inspector(
        etdump_path=str(etdump),
        etrecord=str(etrecord),
        source_time_scale=TimeScale.NS,
        target_time_scale=TimeScale.US,
    )
    (block,) = inspector.event_blocks
    ours = {
        t.event.debug_handle: r.operator
        for r in profile.rows
        for t in profile.events
        if t.event.name == "OPERATOR_CALL" and t.event.debug_handle in r.instructions
    }
    native = [e for e in block.events if e.name.startswith(NATIVE_CALL_PREFIX)]
    assert len(native) == 5
    for event in native:
        # Inspector's name (native_call_<op>) is deploykit's operator without its namespace.
        assert (
            ours[event._instruction_id].split("::", 1)[1] == event.name[len(NATIVE_CALL_PREFIX) :]
        )
        assert event.op_types  # the ETRecord mapped the instruction to its graph nodes
    execute = next(e for e in block.events if e.name == "Method::execute")
    assert execute.perf_data.raw[0] == pytest.approx(profile.micros(profile.total_ticks), rel=1e-3)


def test_device_operator_outputs_agree_with_the_host(exported):
    records = decode(DEBUG_STREAM.read_bytes())
    pte = exported.pte_path.read_bytes()
    _same_program(records, pte)
    assert records.trace_clock.debug_level == 2
    report = compare_intermediates(records, pte, exported.input_sets[0], atol=0.01, rtol=0.0)
    assert [r.operator for r in report.rows] == [
        "cortex_m::quantize_per_tensor.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::dequantize_per_tensor.out",
    ]
    assert report.first_divergence is None
    assert all(r.max_abs == 0 for r in report.rows)  # CMSIS-NN is bit-exact with the reference


def test_a_changed_scale_is_named_as_the_first_divergence(exported):
    records = decode(DEBUG_STREAM.read_bytes())
    pte = exported.pte_path.read_bytes()
    # The same comparison against a program whose second linear layer has its output scale
    # changed by 20%: that operator is the first to differ, and the error carries on.
    broken = perturb_requantize_scale(pte, instruction=2, factor=0.8)
    report = compare_intermediates(records, broken, exported.input_sets[0], atol=0.01, rtol=0.0)
    first = report.first_divergence
    assert first is not None
    assert (first.instruction, first.operator) == (2, "cortex_m::quantized_linear.out")
    assert first.steps and first.max_abs > 1
    assert [r.passed for r in report.rows[:2]] == [True, True]
    assert "first divergence: instruction 2" in report.table()


def test_a_missing_device_output_is_a_divergence_with_a_reason(exported):
    import json

    records = decode(DEBUG_STREAM.read_bytes())
    records.trace_tensors = [t for t in records.trace_tensors if t.debug_handle != 3]
    report = compare_intermediates(
        records, exported.pte_path.read_bytes(), exported.input_sets[0], atol=0.01, rtol=0.0
    )
    first = report.first_divergence
    assert (first.instruction, first.note, first.max_abs) == (3, "no device output", None)
    assert "first divergence: instruction 3" in report.table()
    json.dumps(report.json(), allow_nan=False)  # valid JSON, no NaN
