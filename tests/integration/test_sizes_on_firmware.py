"""Size reports of real firmware against binutils' own reading of the ELF: the totals (flash:
allocated sections with contents; RAM: those without contents, or copied), the C library's
share, and the pools split by their symbols. The firmware is built here (the board-support
selftest needs no sources; the tiny_cnn runner needs the ExecuTorch sources), never taken
from whatever a developer left in build/."""

from __future__ import annotations

import pytest

from deploykit import api
from deploykit.build.render import render_board_files
from deploykit.families import family_of
from deploykit.readers.boards import load_board
from deploykit.readers.sizes import POOL_SECTIONS, size_report
from tests.markers import requires_cmake, requires_sources, requires_toolchain
from tests.unit.test_sizes import _objdump_totals

pytestmark = [requires_toolchain, requires_cmake]


def _check_against_objdump(map_file, elf) -> None:
    r = size_report(map_file)
    assert (r.flash_total, r.ram_total) == _objdump_totals(elf)
    assert "C/C++ library" in r.flash_by_component, r.flash_by_component
    if ".dk_pools" in r.sections:  # the NPU firmware's temp pool sits in its scratch
        assert sum(r.pools.values()) <= sum(r.sections.get(s, 0) for s in POOL_SECTIONS)


@pytest.mark.parametrize("board_name", ["qemu-an547", "qemu-an505"])
def test_selftest_image_totals_match_objdump(tmp_path, board_name):
    board = load_board(board_name)
    render_board_files(board, tmp_path / "generated")
    fw = family_of(board).build_image(board, tmp_path / "generated", tmp_path / "fw",
                                      "selftest")
    _check_against_objdump(fw.map_file, fw.elf)


@requires_sources
def test_runner_totals_match_objdump(tmp_path):
    built = api.build("qemu-an547", "tiny_cnn", out=tmp_path)
    _check_against_objdump(built.firmware.map_file, built.firmware.elf)
