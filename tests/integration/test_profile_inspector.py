"""The host side of profiling and numerical debugging, without the runtime: the event streams
were recorded from profiling firmware on QEMU and are committed with the program they ran
(tests/data/, tests/data/README.md).

- ExecuTorch's Inspector opens deploykit's ETDump with the ETRecord of a real export (about
  15 s), and its operator names agree with deploykit's;
- the host's operator-by-operator run of the recorded .pte agrees with the device's traced
  outputs, and names the operator whose requantization scale was changed as the first
  divergence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.pipeline.profiles import PROFILES
from deploykit.profiling.etdump import write_etdump
from deploykit.profiling.intermediates import compare_intermediates
from deploykit.program.export import ETRECORD_NAME, export
from deploykit.program.models import load_model
from deploykit.readers.protocol import decode
from deploykit.readers.trace import (
    NATIVE_CALL_PREFIX,
    profile_from_records,
    program_instructions,
)
from tests.perturb import perturb_requantize_scale
from tests.recorded import (
    MLP_DEBUG_STREAM,
    MLP_PROFILE_STREAM,
    MLP_PTE,
    first_input,
    short_sha,
)

REPO = Path(__file__).resolve().parents[2]
PROFILE_STREAM = MLP_PROFILE_STREAM
DEBUG_STREAM = MLP_DEBUG_STREAM


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """mlp_mnist, cortex_m_int8, as `deploykit profile --board qemu-an505` exports it (the
    board's default profile, size), for its ETRecord. Its .pte need not be byte for byte the
    recorded one (an int8 export's calibration runs on the host's CPU float path); its
    instructions are the same."""
    out = tmp_path_factory.mktemp("export")
    return export(
        load_model("mlp_mnist", REPO),
        "cortex_m_int8",
        out,
        cpu="cortex-m33",
        options=PROFILES["size"].export_options(),
    )


def _recorded_program(records) -> bytes:
    """The committed .pte, which the recorded run ran (its hello says so)."""
    pte = MLP_PTE.read_bytes()
    assert records.hello.fields["pte_sha256"] == short_sha(pte)
    return pte


def test_inspector_reads_the_etdump_with_the_etrecord(exported, tmp_path):
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale

    etrecord = exported.pte_path.parent / ETRECORD_NAME
    assert etrecord.is_file()
    records = decode(PROFILE_STREAM.read_bytes())
    pte = _recorded_program(records)
    # The ETRecord maps instruction ids to graph nodes: the export's instructions are the
    # recorded program's, operator for operator.
    assert program_instructions(exported.pte_path.read_bytes()) == program_instructions(pte)
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


def test_device_operator_outputs_agree_with_the_host():
    records = decode(DEBUG_STREAM.read_bytes())
    pte = _recorded_program(records)
    assert records.trace_clock.debug_level == 2
    report = compare_intermediates(records, pte, first_input(), atol=0.01, rtol=0.0)
    assert [r.operator for r in report.rows] == [
        "cortex_m::quantize_per_tensor.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::dequantize_per_tensor.out",
    ]
    assert report.first_divergence is None
    assert all(r.max_abs == 0 for r in report.rows)  # CMSIS-NN is bit-exact with the reference


def test_a_changed_scale_is_named_as_the_first_divergence():
    records = decode(DEBUG_STREAM.read_bytes())
    pte = _recorded_program(records)
    # The same comparison against a program whose second linear layer has its output scale
    # changed by 20%: that operator is the first to differ, and the error carries on.
    broken = perturb_requantize_scale(pte, instruction=2, factor=0.8)
    report = compare_intermediates(records, broken, first_input(), atol=0.01, rtol=0.0)
    first = report.first_divergence
    assert first is not None
    assert (first.instruction, first.operator) == (2, "cortex_m::quantized_linear.out")
    assert first.steps and first.max_abs > 1
    assert [r.passed for r in report.rows[:2]] == [True, True]
    assert "first divergence: instruction 2" in report.table()


def test_a_missing_device_output_is_a_divergence_with_a_reason():
    import json

    records = decode(DEBUG_STREAM.read_bytes())
    pte = _recorded_program(records)
    records.trace_tensors = [t for t in records.trace_tensors if t.debug_handle != 3]
    report = compare_intermediates(records, pte, first_input(), atol=0.01, rtol=0.0)
    first = report.first_divergence
    assert (first.instruction, first.note, first.max_abs) == (3, "no device output", None)
    assert "first divergence: instruction 3" in report.table()
    json.dumps(report.json(), allow_nan=False)  # valid JSON, no NaN
