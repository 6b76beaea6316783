"""The host side of per-operator profiling, without the runtime: the decoder and the profile
on event streams recorded from real profiling firmware (tests/data/profile-*.bin, captured from
`deploykit profile` on QEMU, committed with the programs they ran; tests/data/README.md), on
streams from the reference encoder, and the ETDump serializer round trip through ExecuTorch's
own deserializer."""

from __future__ import annotations

import numpy as np
import pytest

from deploykit.profiling.chart import profile_chart
from deploykit.readers.protocol import decode
from deploykit.readers.protocol.records import RecordType
from deploykit.readers.trace import (
    EXECUTE,
    Instruction,
    TraceError,
    kernel_of,
    profile_from_records,
    program_instructions,
)
from deploykit.util import charts
from tests import recorded
from tests.protocol_encoder import StreamEncoder

DATA = recorded.DATA

# What the recorded programs run at each instruction (chain 0), as read from their .pte.
MLP_INT8 = {
    (0, i): Instruction(op, kernel_of(op))
    for i, op in enumerate(
        [
            "cortex_m::quantize_per_tensor.out",
            "cortex_m::quantized_linear.out",
            "cortex_m::quantized_linear.out",
            "cortex_m::quantized_linear.out",
            "cortex_m::dequantize_per_tensor.out",
        ]
    )
}
TINY_CNN_FP32 = {
    (0, i): Instruction(op, kernel_of(op))
    for i, op in enumerate(
        [
            "aten::convolution.out",
            "aten::relu.out",
            "aten::convolution.out",
            "aten::relu.out",
            "aten::max_pool2d_with_indices.out",
            "aten::mean.out",
            "aten::addmm.out",
        ]
    )
}


def _recorded(name: str):
    return decode((DATA / name).read_bytes())


@pytest.mark.parametrize(
    "streams, pte, instructions",
    [
        (
            [recorded.MLP_PROFILE_STREAM, recorded.MLP_DEBUG_STREAM],
            recorded.MLP_PTE,
            MLP_INT8,
        ),
        ([recorded.TINY_CNN_PROFILE_STREAM], recorded.TINY_CNN_PTE, TINY_CNN_FP32),
    ],
)
def test_recorded_streams_are_of_the_committed_programs(streams, pte, instructions):
    """Each stream's hello names the program it ran: the .pte committed beside it, whose
    instructions are the ones the tests here read its events by."""
    program = pte.read_bytes()
    for stream in streams:
        assert decode(stream.read_bytes()).hello.fields["pte_sha256"] == recorded.short_sha(
            program
        )
    assert program_instructions(program) == instructions


def test_the_committed_input_is_the_one_the_device_ran():
    (array,) = recorded.first_input()
    assert array.shape == (1, 784) and array.dtype == np.float32
    for stream in (recorded.MLP_PROFILE_STREAM, recorded.MLP_DEBUG_STREAM):
        hello = decode(stream.read_bytes()).hello.fields
        assert hello["inputs_sha256"] == recorded.short_sha(array.tobytes())


@pytest.mark.parametrize(
    "stream, instructions, calls",
    [
        (
            "profile-mlp_mnist-cortex_m_int8-qemu-an505.bin",
            MLP_INT8,
            {
                "cortex_m::quantized_linear.out": 3,
                "cortex_m::quantize_per_tensor.out": 1,
                "cortex_m::dequantize_per_tensor.out": 1,
            },
        ),
        (
            "profile-tiny_cnn-portable_fp32-qemu-an547.bin",
            TINY_CNN_FP32,
            {
                "aten::convolution.out": 2,
                "aten::relu.out": 2,
                "aten::max_pool2d_with_indices.out": 1,
                "aten::mean.out": 1,
                "aten::addmm.out": 1,
            },
        ),
    ],
)
def test_recorded_stream_operators_add_up_to_execute(stream, instructions, calls):
    records = _recorded(stream)
    assert records.stats.clean, records.stats.problems()
    assert records.done is not None and records.done.status == 0
    assert records.trace_clock is not None and records.trace_clock.clock == "systick"
    assert records.trace_clock.event_cost > 0  # measured on the device, subtracted here
    profile = profile_from_records(records, instructions)
    assert {r.operator: r.calls for r in profile.rows} == calls
    # Per-operator times add up to execute() within 2% (the rest is the runtime's dispatch).
    assert profile.operator_ticks <= profile.total_ticks
    assert profile.operator_ticks >= 0.98 * profile.total_ticks
    # The firmware's own execute() ticks minus the tracer's agree with the events' total.
    assert profile.runner_ticks == pytest.approx(profile.total_ticks, rel=0.01)
    assert [r.ticks for r in profile.rows] == sorted((r.ticks for r in profile.rows), reverse=True)


def test_recorded_int8_profile_shows_matmul_and_input_quantize():
    profile = profile_from_records(
        _recorded("profile-mlp_mnist-cortex_m_int8-qemu-an505.bin"), MLP_INT8
    )
    share = {r.operator: r.ticks / profile.total_ticks for r in profile.rows}
    assert profile.rows[0].operator == "cortex_m::quantized_linear.out"
    assert profile.rows[0].kernel == "cortex_m"
    assert share["cortex_m::quantized_linear.out"] > 0.7
    assert 0.05 < share["cortex_m::quantize_per_tensor.out"] < 0.3


def test_recorded_fp32_profile_is_dominated_by_convolutions():
    profile = profile_from_records(
        _recorded("profile-tiny_cnn-portable_fp32-qemu-an547.bin"), TINY_CNN_FP32
    )
    assert profile.rows[0].operator == "aten::convolution.out"
    assert profile.rows[0].kernel == "portable"
    assert profile.rows[0].ticks / profile.total_ticks > 0.9


def _synthetic(cost_q8: int = 0):
    """Two runs of a two-instruction program; the nested native_call events cost 10 ticks
    each that the tracer could not see (event_cost)."""
    enc = StreamEncoder()
    stream = enc.hello(protocol="1", board="test", firmware="executorch-runner")
    stream += enc.trace_clock(1, 1_000_000, cost_q8)
    for base in (1000, 5000):
        stream += enc.trace_event("native_call_add.out", 0, 0, base + 10, base + 110)
        stream += enc.trace_event("OPERATOR_CALL", 0, 0, base + 5, base + 125)
        stream += enc.trace_event("native_call_mul.out", 0, 1, base + 210, base + 510)
        stream += enc.trace_event("OPERATOR_CALL", 0, 1, base + 205, base + 525)
        stream += enc.trace_event(EXECUTE, -1, 0, base, base + 600)
    stream += enc.timing(1300, 1_000_000, 2)
    stream += enc.trace_summary(1300, 60, 10, 2)
    stream += enc.done()
    return decode(stream)


def test_nested_events_lose_the_measured_event_cost():
    program = {
        (0, 0): Instruction("aten::add.out", "portable"),
        (0, 1): Instruction("aten::mul.out", "portable"),
    }
    plain = profile_from_records(_synthetic(0), program)
    assert plain.total_ticks == 1200
    assert {r.operator: r.ticks for r in plain.rows} == {"aten::mul.out": 640, "aten::add.out": 240}
    costed = profile_from_records(_synthetic(10 * 256), program)
    # Each OPERATOR_CALL holds one nested event, each execute() four.
    assert {r.operator: r.ticks for r in costed.rows} == {
        "aten::mul.out": 620,
        "aten::add.out": 220,
    }
    assert costed.total_ticks == 1200 - 2 * 4 * 10
    assert costed.runner_ticks == 1300 - 60 - 10 * 10


def test_profile_needs_profiling_records():
    enc = StreamEncoder()
    records = decode(enc.hello(protocol="1") + enc.timing(10, 1000, 1) + enc.done())
    with pytest.raises(TraceError, match="not built for profiling"):
        profile_from_records(records, {})


def test_trace_records_decode_and_reassemble_traced_tensors():
    enc = StreamEncoder()
    a = np.arange(700, dtype=np.int8).reshape(7, 100)
    b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    stream = (
        enc.hello(protocol="1")
        + enc.trace_clock(2, 150_000_000, 300, debug_level=2)
        + enc.trace_tensor(0, 3, 0, a, chunk_size=256)
        + enc.trace_tensor(0, 4, 0, b)
        + enc.done()
    )
    records = decode(stream)
    assert records.stats.clean, records.stats.problems()
    assert records.trace_clock.clock == "dwt-cyccnt" and records.trace_clock.debug_level == 2
    got = {(t.debug_handle, t.ordinal): t.tensor.data for t in records.trace_tensors}
    np.testing.assert_array_equal(got[(3, 0)], a)
    np.testing.assert_array_equal(got[(4, 0)], b)


def test_malformed_trace_event_is_counted_not_reported():
    enc = StreamEncoder()
    bad = enc.frame(RecordType.TRACE_EVENT, b"\x00" * 10)  # shorter than its fixed part
    backwards = enc.trace_event("OPERATOR_CALL", 0, 0, 100, 50)  # ends before it starts
    records = decode(enc.hello(protocol="1") + bad + backwards + enc.done())
    assert records.trace_events == []
    assert records.stats.malformed_records == 2


def test_etdump_round_trips_through_executorch_deserializer(tmp_path):
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    from deploykit.profiling.etdump import etdump_bytes

    profile = profile_from_records(
        _recorded("profile-mlp_mnist-cortex_m_int8-qemu-an505.bin"), MLP_INT8
    )
    etdump = deserialize_from_etdump_flatcc(etdump_bytes(profile))
    (run,) = etdump.run_data
    names = [e.profile_event.name for e in run.events]
    assert names.count("OPERATOR_CALL") == 5 and names[-1] == EXECUTE
    assert "Method::init" not in names  # load_method's events stay out of the Execute block
    ns = 1e9 / profile.clock_hz
    execute = run.events[-1].profile_event
    assert execute.end_time - execute.start_time == pytest.approx(profile.total_ticks * ns, abs=1)
    calls = [e.profile_event for e in run.events if e.profile_event.name == "OPERATOR_CALL"]
    assert [c.instruction_id for c in calls] == [0, 1, 2, 3, 4]


def test_chart_has_one_bar_per_operator():
    profile = profile_from_records(
        _recorded("profile-tiny_cnn-portable_fp32-qemu-an547.bin"), TINY_CNN_FP32
    )
    chart = profile_chart(profile, "tiny_cnn")
    (panel,) = chart.panels
    assert [g.label for g in panel.groups] == [r.operator for r in profile.rows]
    assert len(panel.groups) == 5
    assert {g.bars[0].series for g in panel.groups} == {"portable"}
    svg = charts.render(chart)
    assert "aten::convolution.out" in svg  # each text group's comment names it
    # (tests/unit/test_charts.py draws the charts in Chromium and measures every text)


def test_report_text_labels_vela_estimates_and_the_ram_cost(tmp_path):
    from deploykit.profiling.stage import ProfileReport, RamCost
    from deploykit.program.inspect import NpuEstimate

    profile = profile_from_records(
        _recorded("profile-mlp_mnist-cortex_m_int8-qemu-an505.bin"), MLP_INT8
    )
    profile.unit, profile.scale = "instructions", 1e9 / (32 * profile.clock_hz)
    report = ProfileReport(
        "qemu-an505",
        "mlp_mnist",
        "cortex_m_int8",
        profile,
        RamCost(60, 112),
        tmp_path,
        {},
        64839,
        {0: NpuEstimate.from_vela(
            {"total_cycles": 12300, "npu_cycles": 9000, "network_macs": 600000,
             "clock_mhz": 1000.0},
            "ethos-u85-256",
            [{"op": "Conv2D", "name": "tosa_rescale_default", "model_line": "conv1 (Conv2d)",
              "cycles": 9000, "npu_cycles": 9000, "sram_cycles": 10, "dram_cycles": 20,
              "macs": 500000, "mac_utilisation": 0.217, "bound": "compute"},
             {"op": "AvgPool", "name": "tosa_avg_pool2d_default", "model_line": None,
              "cycles": 3300, "npu_cycles": 100, "sram_cycles": 10, "dram_cycles": 3300,
              "macs": 100000, "mac_utilisation": 0.118, "bound": "DRAM"}])},
    )
    text = report.text()
    assert "delegate 0: NPU (Vela estimate): 12.3 k cycles (9 k compute)" in text
    # Under the delegate's row: each NPU operator, labelled as Vela's estimate.
    assert ("    Vela estimate: Conv2D tosa_rescale_default: 9 k cycles (73%, 9.0 us), 500 k "
            "MACs, 22% util, compute-bound <- conv1 (Conv2d)") in text
    assert "    Vela estimate: AvgPool tosa_avg_pool2d_default: 3.3 k cycles (27%" in text
    assert "DRAM-bound" in text
    assert "RAM profiling adds: 172 B (60 B static, 112 B stack peak)" in text
    # Shares are of execute(): the operators' cumulative share stops short of 100%.
    last_op = next(line for line in text.splitlines() if line.startswith("cortex_m::deq"))
    assert last_op.endswith("99.6%")
    assert report.json()["npu_estimates"]["0"].startswith("NPU (Vela estimate): 12.3 k cycles")
    layers = report.json()["npu_layers"]["0"]
    assert [(x["op"], x["cycles"], x["source"]) for x in layers] == [
        ("Conv2D", 9000, "Vela estimate"), ("AvgPool", 3300, "Vela estimate")]


def test_a_board_without_an_event_clock_is_a_clear_error():
    import dataclasses

    from deploykit.profiling.stage import trace_definitions
    from deploykit.readers.boards import load_board
    from deploykit.util.errors import ConfigError

    board = load_board("qemu-an505")
    assert trace_definitions(board, intermediates=True) == {
        "DK_PROFILE_EVENTS": "ON",
        "DK_EVENT_CLOCK": "systick",
        "DK_EVENT_CLOCK_HZ": "20000000",
        "DK_TRACE_INTERMEDIATES": "ON",
    }
    bare = dataclasses.replace(board, timer={"kind": "systick", "hz": 20_000_000})
    with pytest.raises(ConfigError, match="names no event clock") as exc:
        trace_definitions(bare, intermediates=False)
    assert "timer.event_clock" in str(exc.value)


def test_island_times_follow_program_costs_numbering():
    """program_costs numbers kernel and delegate calls over the chains in order; the
    profile's instructions are keyed (chain, index) with other instructions skipped."""
    from deploykit.profiling.stage import island_times
    from deploykit.program.costs import Island
    from deploykit.readers.trace import Instruction, InstructionTime, Profile

    # Chain 0 has a non-call instruction at index 1 (absent from the program's calls).
    program = {(0, 0): Instruction("cortex_m::quantized_linear.out", "cortex_m"),
               (0, 2): Instruction("cortex_m::dequantize_per_tensor.out", "cortex_m"),
               (0, 3): Instruction("aten::sin.out", "portable"),
               (0, 4): Instruction("cortex_m::quantize_per_tensor.out", "cortex_m"),
               (1, 0): Instruction("cortex_m::quantized_linear.out", "cortex_m")}
    ticks = {(0, 0): 50.0, (0, 2): 7.0, (0, 3): 20.0, (0, 4): 3.0, (1, 0): 40.0}
    profile = Profile("systick", 1_000_000, 0.0, 1, 125.0, [], [], instructions=[
        InstructionTime(c, i, program[(c, i)].name, 1, t) for (c, i), t in ticks.items()])
    island = Island(ops=("cortex_m::dequantize_per_tensor.out", "aten::sin.out",
                         "cortex_m::quantize_per_tensor.out"), first=1, last=3, is_float=True,
                    macs=0)
    (timed,) = island_times(profile, (island,), program)
    assert timed.ticks == 30.0 and timed.is_float
    assert timed.description == island.describe()


def test_float_island_operators_are_the_ones_the_chart_hatches():
    from deploykit.profiling.stage import float_island_operators
    from deploykit.program.costs import Island
    from deploykit.readers.trace import InstructionTime, Profile

    program = {(0, 0): Instruction("cortex_m::quantized_linear.out", "cortex_m"),
               (0, 2): Instruction("cortex_m::dequantize_per_tensor.out", "cortex_m"),
               (0, 3): Instruction("aten::sin.out", "portable"),
               (0, 4): Instruction("cortex_m::quantize_per_tensor.out", "cortex_m"),
               (0, 5): Instruction("aten::permute_copy.out", "portable")}
    profile = Profile("systick", 1_000_000, 0.0, 1, 100.0, [], [], instructions=[
        InstructionTime(c, i, what.name, 1, 10.0) for (c, i), what in program.items()])
    float_island = Island(("cortex_m::dequantize_per_tensor.out", "aten::sin.out",
                           "cortex_m::quantize_per_tensor.out"), 1, 3, True, 0)
    layout_copy = Island(("aten::permute_copy.out",), 4, 4, False, 0, is_layout_copy=True)
    # The float kernel, not the int8 dequantize and quantize around it, nor a layout copy.
    assert float_island_operators(profile, (float_island, layout_copy), program) == {
        "aten::sin.out"}


def test_deploykits_own_kernels_are_a_library_of_their_own():
    assert kernel_of("aten::avg_pool3d.out") == "deploykit"  # firmware/kernels
    assert kernel_of("aten::add.out") == "portable"
    assert kernel_of("cortex_m::quantized_add.out") == "cortex_m"
