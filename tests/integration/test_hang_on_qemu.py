"""A hang is located, not only timed out: when the time limit expires, QEMU is asked for the
CPU registers over QMP and PC and LR are mapped to function, file and line (runners/hang.py).
Deliberate-hang variants of the selftest (no sources needed) and of the runner (needs the
ExecuTorch sources) run on QEMU for real; the profiling runner that hangs inside execute() at a
chosen operator is also placed in the program ("after operator k of N"). The runner tests also
check two codes of the error table on the device: a planned-buffer count mismatch is a build
error, not a pool too small.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from deploykit import api
from deploykit.pipeline.chains import FirmwareVariant, build_firmware
from deploykit.pipeline.target import resolve_target
from deploykit.profiling.stage import trace_definitions
from deploykit.readers.boards import load_board
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.readers.trace import program_instructions
from deploykit.run.runners import runner_for_board
from deploykit.util.errors import ExitCode
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu]
# The run's time limit. Locating the hang after it (a QMP round trip, the ELF's symbols and
# lines) must cost less than a second limit would: each test checks wall < 2 x LIMIT_S. At 6 s
# that leaves 6 s for the location and QEMU's end, which holds at a load average of 8 on two
# cores (bench/soak --parts flaky; docs/failures.md).
LIMIT_S = 6.0


@pytest.mark.parametrize("board", ["qemu-an547", "qemu-an505"])
def test_selftest_hang_is_located_within_the_limit(tmp_path, board):
    report = api.selftest(board, out=tmp_path, timeout=LIMIT_S, variant="hang")
    assert report.passed, report.summary()
    hang = report.hang or ""
    assert re.search(
        r"Hung in dk_selftest_hang_site \(deploykit firmware, selftest\.c:\d+\)", hang
    ), hang
    assert re.search(r"called from main \(deploykit firmware, selftest\.c:\d+\)", hang), hang
    # The location costs a QMP round trip, not another limit.
    assert report.wall_seconds < 2 * LIMIT_S, report.wall_seconds


def _rebuild(firmware_dir: Path, **definitions: str) -> None:
    defs = [f"-D{k}={v}" for k, v in definitions.items()]
    subprocess.run(["cmake", *defs, str(firmware_dir)], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(firmware_dir), "-j2"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def built_runner(tmp_path_factory):
    out = tmp_path_factory.mktemp("runner")
    built = api.build("qemu-an547", "tiny_cnn", out=out)
    return out, built


@requires_sources
def test_runner_hang_is_located_with_its_caller(built_runner, tmp_path):
    out, built = built_runner
    fw = out / "firmware"
    try:
        _rebuild(fw, DK_RUNNER_HANG="ON")
        result = runner_for_board(load_board("qemu-an547")).run(
            built.firmware.elf, tmp_path, timeout_s=LIMIT_S, check=False
        )
    finally:
        _rebuild(fw, DK_RUNNER_HANG="OFF")
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.TIMEOUT
    assert (
        "Hung in (anonymous namespace)::dk_runner_hang_site (deploykit firmware, "
        "runner.cpp:" in outcome.cause
    ), outcome.cause
    assert "called from main (deploykit firmware, runner.cpp:" in outcome.cause
    assert "hello(board=qemu-an547" in outcome.cause  # the last records seen
    assert result.wall_seconds < 2 * LIMIT_S, result.wall_seconds


@requires_sources
def test_planned_buffer_count_mismatch_is_a_build_error_on_the_device(built_runner, tmp_path):
    out, built = built_runner
    config = out / "generated" / "model_config.h"
    original = config.read_text()
    count = re.search(r"#define DK_PLANNED_BUFFER_COUNT (\d+)u", original)
    sizes = re.search(r"#define DK_PLANNED_BUFFER_SIZES \{ (.*) \}", original)
    assert count and sizes
    wrong = original.replace(
        count.group(0), f"#define DK_PLANNED_BUFFER_COUNT {int(count.group(1)) + 1}u"
    ).replace(sizes.group(0), f"#define DK_PLANNED_BUFFER_SIZES {{ {sizes.group(1)}, 16u }}")
    try:
        config.write_text(wrong)
        _rebuild(out / "firmware")
        result = runner_for_board(load_board("qemu-an547")).run(
            built.firmware.elf, tmp_path, timeout_s=30, check=False
        )
    finally:
        config.write_text(original)
        _rebuild(out / "firmware")
    (error,) = result.records.errors
    assert error.code == BY_NAME["PLANNED_COUNT"].code
    assert result.records.done.status == 1  # not 3: no pool is too small
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.BUILD
    assert "DK_ERR_PLANNED_COUNT (0x100c)" in outcome.cause
    assert "--fit does not help" in outcome.hint


HANG_AT_OP = 3  # the operator (1-based) of execute() the profiling runner hangs in


@requires_sources
def test_hang_inside_execute_names_the_operator_position(tmp_path):
    """Profiling firmware built with DK_RUNNER_HANG_AT_OP hangs when its 3rd operator begins:
    the report names the hang site and "after operator 2 of N (its name)" from the events."""
    board = load_board("qemu-an547")
    definitions = {
        **trace_definitions(board, intermediates=False),
        "DK_RUNNER_HANG_AT_OP": str(HANG_AT_OP),
    }
    built = build_firmware(
        resolve_target(board),
        "tiny_cnn",
        tmp_path,
        None,
        lambda _msg: None,
        variant=FirmwareVariant("firmware-hang", definitions),
    )
    instructions = program_instructions(built.planned.export.pte_path.read_bytes())
    order = sorted(instructions)
    assert len(order) > HANG_AT_OP, "the model needs more operators than the hang position"
    result = runner_for_board(board).run(
        built.firmware.elf, tmp_path / "run", timeout_s=LIMIT_S, check=False
    )
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.TIMEOUT, outcome.cause
    assert re.search(
        r"Hung in (\(anonymous namespace\)::)?dk_trace_hang_site "
        r"\(deploykit firmware, event_tracer\.cpp:\d+\)",
        outcome.cause,
    ), outcome.cause
    before, hung_in = instructions[order[HANG_AT_OP - 2]], instructions[order[HANG_AT_OP - 1]]
    position = (
        f"in execute() call 1, after operator {HANG_AT_OP - 1} of {len(order)} "
        f"({before.name}); operator {HANG_AT_OP} ({hung_in.name}) did not end"
    )
    assert position in outcome.cause, outcome.cause
    assert result.wall_seconds < 2 * LIMIT_S, result.wall_seconds
