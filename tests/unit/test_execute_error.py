"""The execute_error record (docs/protocol.md): decoded, classified, and placed in a program
and its model; and the firmware's checked CMSIS-NN calls agree with the renaming the kernels
are built with.

The device side runs in tests/integration/test_execute_error_qemu.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from deploykit.readers.execute_failure import instruction_sources, locate, program_steps
from deploykit.readers.protocol import ExecuteError, RecordType, decode
from deploykit.util.errors import ExitCode
from tests.protocol_encoder import (
    done_payload,
    encode_record,
    error_payload,
    execute_error_payload,
    hello_payload,
)

REPO = Path(__file__).resolve().parents[2]
INTERNAL = 0x01
INVALID_ARGUMENT = 0x12
ARG_ERROR = -1


def _failed_run(step: int | None, status: int = 0, call: str = "") -> bytes:
    records = [
        (RecordType.HELLO, hello_payload({"protocol": "1", "firmware": "executorch-runner"})),
        (RecordType.EXECUTE_ERROR, execute_error_payload(INTERNAL, step, status, call)),
        (RecordType.ERROR, error_payload(INTERNAL, "execute failed")),
        (RecordType.DONE, done_payload(1, 3)),
    ]
    return b"".join(encode_record(t, i, p) for i, (t, p) in enumerate(records))


def test_the_record_decodes_and_names_the_kernel_call_in_the_outcome():
    run = decode(_failed_run(3, ARG_ERROR, "arm_convolve_wrapper_s8"))
    assert run.execute_errors == [ExecuteError(INTERNAL, 3, ARG_ERROR, "arm_convolve_wrapper_s8")]
    outcome = run.outcome()
    assert outcome.exit_code == ExitCode.DEVICE_ERROR
    assert ("execute failed at step 3: arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_ARG_ERROR"
            in outcome.cause)
    # The bare error the record comes with is not repeated.
    assert "Internal (0x01): execute failed" not in outcome.cause
    assert not run.stats.problems()


def test_a_failure_before_the_first_instruction_and_without_a_kernel_call():
    run = decode(_failed_run(None))
    assert run.execute_errors[0].step is None
    assert "execute failed before its first instruction: Internal (0x01)" in run.outcome().cause


def test_a_short_payload_is_malformed():
    data = encode_record(RecordType.EXECUTE_ERROR, 0, b"\x01\x00\x00\x00")
    run = decode(data)
    assert run.execute_errors == [] and run.stats.problems()


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y)  # the second instruction's line


@pytest.fixture(scope="module")
def exported() -> tuple[bytes, object]:
    from executorch.exir import to_edge

    ep = torch.export.export(TwoLayers().eval(), (torch.randn(1, 3, 6, 6),))
    program = to_edge(ep).to_executorch()
    return bytes(program.buffer), program.exported_program().graph_module


def test_a_step_is_placed_at_its_instruction_operator_and_model_line(exported):
    pte, graph = exported
    steps, jumps = program_steps(pte)
    assert not jumps
    assert [s.what for s in steps] == ["aten::convolution.out", "aten::relu.out"]
    sources = instruction_sources(graph, pte, Path(__file__))
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "the second instruction's line" in text)
    assert sources[1].startswith(f"test_execute_error.py:{line} in forward: return torch.relu")
    placed = locate(ExecuteError(INVALID_ARGUMENT, 1, 0, ""), pte, sources)
    assert placed.text == (f"execute failed at instruction 1 (aten::relu.out, "
                           f"test_execute_error.py:{line} in forward): InvalidArgument (0x12)")
    assert (placed.instruction, placed.operator) == (1, "aten::relu.out")
    kernel = locate(ExecuteError(INTERNAL, 0, -3, "arm_convolve_wrapper_s8"), pte, sources)
    assert kernel.text.startswith("execute failed at instruction 0 (aten::convolution.out, ")
    assert kernel.text.endswith("): arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_FAILURE")
    assert kernel.kernel_status == "ARM_CMSIS_NN_FAILURE"
    beyond = locate(ExecuteError(INTERNAL, 7, 0, ""), pte, sources)
    assert beyond.text == "execute failed at step 7 (past the program's 2 instructions): " \
        "Internal (0x01)"


def test_the_checked_cmsis_nn_calls_agree_with_the_renaming_the_kernels_get():
    header = (REPO / "cmake" / "executorch-runtime" / "dk_cmsis_nn_checked.h").read_text()
    renamed = dict(re.findall(r"^#define (arm_\w+) (dk_\w+)$", header, re.M))
    checked = {old for old, new in renamed.items() if new == f"dk_checked_{old}"}
    source = (REPO / "firmware" / "runner" / "kernel_status.c").read_text()
    defined = set(re.findall(r"^DK_CHECKED\((\w+)\);", source, re.M))
    assert checked == defined and len(defined) == 13
    # The rest go to deploykit's faster equal versions (firmware/kernels), each declared with
    # the library function's own type; not checked calls: they return no status.
    replaced = {old: new for old, new in renamed.items() if old not in checked}
    assert replaced == {"arm_softmax_s8": "dk_arm_softmax_s8"}
    kernels = "".join(p.read_text() for p in (REPO / "firmware" / "kernels").glob("*.h"))
    for old, new in replaced.items():
        assert f"__typeof__({old}) {new};" in kernels


def test_a_profile_lists_the_operators_of_the_failed_call_before_the_failing_one():
    from deploykit.profiling.stage import operators_before_failure
    from deploykit.readers.execute_failure import LocatedFailure
    from deploykit.readers.protocol import RunRecords
    from deploykit.readers.protocol.records import TraceEvent
    from deploykit.readers.trace import Instruction

    def op(handle: int, start: int, end: int) -> TraceEvent:
        return TraceEvent("OPERATOR_CALL", 0, handle, -1, start, end)

    events = [op(0, 0, 5), op(1, 5, 9), TraceEvent("Method::execute", -1, 0, -1, 0, 10),
              op(0, 20, 26), op(1, 26, 29), op(2, 29, 30)]
    instructions = {(0, i): Instruction(name, "cortex_m") for i, name in
                    enumerate(["cortex_m::quantize_per_tensor.out",
                               "cortex_m::quantized_conv2d.out", "cortex_m::quantized_add.out"])}
    failed = LocatedFailure("...", "Internal (0x01)", 2, 0, 2, "cortex_m::quantized_add.out")
    assert operators_before_failure(RunRecords.build(events), failed, instructions) == [
        "instruction 0 (cortex_m::quantize_per_tensor.out): 6 ticks",
        "instruction 1 (cortex_m::quantized_conv2d.out): 3 ticks",
    ]


def test_a_served_sample_that_fails_is_named_by_where_it_stopped():
    from types import SimpleNamespace

    from deploykit.readers.protocol import DeviceError
    from deploykit.run.stream import StreamSession

    session = StreamSession(SimpleNamespace(description="qemu-an547's console"))
    session._placed = ExecuteError(INTERNAL, 4, ARG_ERROR, "arm_fully_connected_s8")
    failed = session._failure(3, INTERNAL, [DeviceError(INTERNAL, "execute failed")])
    assert failed.cause == ("sample 3 failed on qemu-an547's console: execute failed at step 4: "
                            "arm_fully_connected_s8 returned ARM_CMSIS_NN_ARG_ERROR.")
    assert session._placed is None  # the next failure is not named by this one's place
