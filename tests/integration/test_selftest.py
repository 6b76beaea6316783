"""The self-test firmware, built with the real toolchain and run on the real QEMU boards."""

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from deploykit import api
from deploykit.build.render import render_board_files
from deploykit.families import family_of
from deploykit.readers.boards import load_board
from deploykit.run.runners import runner_for_board
from deploykit.util.errors import ExitCode, RunError
from tests.markers import requires_cmake, requires_qemu, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu]
BOARDS = ["qemu-an547", "qemu-an505"]


@pytest.mark.parametrize("board", BOARDS)
def test_selftest_passes_bit_exact(tmp_path, board):
    report = api.selftest(board, out=tmp_path)
    assert report.passed, report.summary()
    assert report.ticks and report.ticks > 0
    assert 0 < report.stack_used < load_board(board).stack_size
    # The board file is the only source of addresses: the vector table sits at the origin of
    # the region the board places `vectors` in.
    with open(report.firmware.elf, "rb") as f:
        vectors = ELFFile(f).get_section_by_name(".vectors")
        assert vectors["sh_addr"] == load_board(board).region_for("vectors").origin


@pytest.mark.parametrize("board", BOARDS)
def test_fault_is_reported_not_a_lockup(tmp_path, board):
    b = load_board(board)
    render_board_files(b, tmp_path / "generated")
    fw = family_of(b).build_image(b, tmp_path / "generated", tmp_path / "fw", "selftest",
                                  {"DK_SELFTEST_FAULT": "1"})
    with pytest.raises(RunError) as exc:
        runner_for_board(b).run(fw.elf, tmp_path, timeout_s=30)
    assert exc.value.exit_code == ExitCode.FAULT
    result = runner_for_board(b).run(fw.elf, tmp_path, timeout_s=30, check=False)
    fault = result.records.fault
    with open(fw.elf, "rb") as f:
        symbols = ELFFile(f).get_section_by_name(".symtab")
        site = symbols.get_symbol_by_name("dk_selftest_fault_site")[0]["st_value"] & ~1
    assert fault.registers["pc"] == site
    assert fault.registers["cfsr"] & 0x00010000  # UNDEFINSTR
    assert result.exit_code == 2 and result.records.done.status == 2


def test_unknown_board_is_a_clean_error(capsys):
    from deploykit.cli import main

    assert main(["selftest", "--board", "nope"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "Unknown board 'nope'" in err and "Traceback" not in err


def test_an_out_built_by_another_checkout_is_configured_from_scratch(tmp_path):
    """Another checkout of deploykit (tests/other_checkout.py, run as its own process) builds
    into the same --out first: its firmware build directory is CMake's cache of another source
    tree, which CMake refuses to configure again. This checkout's build configures it from
    scratch instead, and passes."""
    from deploykit.util.paths import data_root
    from tests.other_checkout import copy_checkout, run_python

    def configured_source(build_dir):  # CMake's own record of the source tree
        cache = (build_dir / "CMakeCache.txt").read_text()
        return Path(cache.split("CMAKE_HOME_DIRECTORY:INTERNAL=")[1].splitlines()[0])

    other = copy_checkout(tmp_path / "other-checkout")
    out = tmp_path / "out"
    first = run_python(other, ["-m", "deploykit", "selftest", "--board", "qemu-an547", "--out",
                               str(out), "--quiet"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert configured_source(out / "firmware") == other / "firmware"
    messages: list[str] = []
    report = api.selftest("qemu-an547", out=out, progress=messages.append)
    assert report.passed, report.summary()
    assert configured_source(out / "firmware") == data_root() / "firmware"
    assert any(f"was configured from {other / 'firmware'}" in m for m in messages), messages
