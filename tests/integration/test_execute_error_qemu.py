"""A failed execute() is located on the device, in the size profile (ExecuTorch's log compiled
out): the runner built with DK_TEST_CMSIS_NN_NO_SCRATCH (a test-only CMake option; the
convolutions' CMSIS-NN call gets no scratch buffer, which arm_convolve_s8 refuses with
ARM_CMSIS_NN_ARG_ERROR) runs tiny_cnn on qemu-an547, and the report names the instruction, the
operator, the model line and the CMSIS-NN status (firmware/runner/kernel_status.c,
readers/execute_failure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.pipeline.chains import FirmwareVariant, build_firmware, locate_execute_failure
from deploykit.pipeline.target import resolve_target
from deploykit.profiling.stage import failed_execute, trace_definitions
from deploykit.readers.boards import load_board, repo_root
from deploykit.readers.execute_failure import program_steps
from deploykit.readers.trace import program_instructions
from deploykit.run.runners import runner_for_board
from deploykit.util.errors import ExitCode
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

BOARD = "qemu-an547"
MODEL = "tiny_cnn"
REFUSING = FirmwareVariant("firmware-refusing", {"DK_TEST_CMSIS_NN_NO_SCRATCH": "ON"})


@pytest.fixture(scope="module")
def refusing_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("refusing")
    board = load_board(BOARD)
    target = resolve_target(board, flow="cortex_m_int8", profile="size")
    built = build_firmware(target, MODEL, out, None, lambda _msg: None, variant=REFUSING)
    result = runner_for_board(board).run(built.firmware.elf, out / "run", timeout_s=60,
                                         check=False)
    return built, result


def test_the_refusing_convolution_is_named_with_its_model_line_and_status(refusing_run):
    built, result = refusing_run
    exported = built.planned.export
    (failure,) = result.records.execute_errors
    assert failure.kernel_call == "arm_convolve_wrapper_s8"
    assert failure.kernel_message == "arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_ARG_ERROR"
    steps, _ = program_steps(exported.pte_path.read_bytes())
    first_conv = next(s for s in steps if s.what == "cortex_m::quantized_conv2d.out")
    model_file = repo_root() / "models" / f"{MODEL}.py"
    line = next(i for i, text in enumerate(model_file.read_text().splitlines(), 1)
                if "self.conv1(x)" in text)
    located = locate_execute_failure(result, exported)
    assert located is not None
    expected = (f"execute failed at instruction {first_conv.index} "
                f"(cortex_m::quantized_conv2d.out, {Path(model_file).name}:{line} in forward): "
                "arm_convolve_wrapper_s8 returned ARM_CMSIS_NN_ARG_ERROR")
    assert located.text == expected
    assert located.source is not None and "self.conv1(x)" in located.source
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.DEVICE_ERROR
    assert expected in outcome.cause, outcome.cause
    # The size profile: ExecuTorch's log is compiled out, so the record is all there is.
    assert not result.records.logs
    assert "profile=size" in (result.records.hello.fields.get("build") or "")


def test_profiling_firmware_lists_the_operators_that_ran_before_the_refusal(tmp_path):
    """`deploykit profile` on the same refusal: instead of stopping at the plain run, the report
    names the failure and the operators that ran before it, with their times."""
    board = load_board(BOARD)
    target = resolve_target(board, flow="cortex_m_int8", profile="size")
    variant = FirmwareVariant("firmware-refusing-profile", {
        **trace_definitions(board, intermediates=False), **REFUSING.definitions})
    built = build_firmware(target, MODEL, tmp_path, None, lambda _msg: None, variant=variant)
    exported = built.planned.export
    pte = exported.pte_path.read_bytes()
    result = runner_for_board(board).run(built.firmware.elf, tmp_path / "run", timeout_s=60,
                                         check=False)
    error = failed_execute(result, exported, program_instructions(pte))
    assert error.exit_code == ExitCode.DEVICE_ERROR
    steps, _ = program_steps(pte)
    first_conv = next(s for s in steps if s.what == "cortex_m::quantized_conv2d.out")
    assert (f"execute failed at instruction {first_conv.index} (cortex_m::quantized_conv2d.out"
            in error.cause), error.cause
    listing = error.cause.split("Operators that ran before it in execute() call 1", 1)[1]
    ran = [s for s in steps[:first_conv.index] if s.what.startswith("cortex_m::")]
    assert ran, "the model starts with the convolution: nothing ran before it"
    for s in ran:
        assert f"instruction {s.index} ({s.what}): " in listing, error.cause
    assert f"instruction {first_conv.index} " not in listing  # the failing one is named above
