"""The Pico 2 firmware, built for real through the pico-sdk (docs/pico2.md).

Needs the cross toolchain, CMake/Ninja and the pico-sdk + TinyUSB sources in the workspace
(`deploykit setup --group pico`, or the --source override); the model builds also need the
ExecuTorch sources. Without them each test skips and says which is missing. Nothing here runs
on a board: there is none, and no RP2350 emulator.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from deploykit import api
from deploykit.boards import load_board
from deploykit.errors import DeployKitError
from deploykit.families import get_family
from deploykit.render import render_board_files
from deploykit.sources import load_workspace, require_projects
from deploykit.uf2 import check_uf2
from tests.markers import requires_cmake, requires_sources, requires_toolchain


def _pico_sources_reason() -> str | None:
    try:
        require_projects(load_workspace(), list(get_family("rp2350").projects), "The pico2 build")
    except DeployKitError as exc:
        return (f"pico-sdk sources not in the workspace ({exc.cause}); add them with "
                "`deploykit setup --group pico` or --source pico-sdk=PATH@2.2.0 "
                "--source tinyusb=PATH@0.18.0")
    return None


requires_pico_sources = pytest.mark.skipif(_pico_sources_reason() is not None,
                                           reason=_pico_sources_reason() or "")
pytestmark = [requires_toolchain, requires_cmake, requires_pico_sources]


def attributes(path) -> str:
    return subprocess.run(["arm-none-eabi-readelf", "-A", str(path)], capture_output=True,
                          text=True, check=True).stdout


def assert_m33_softfp_dsp(attrs: str) -> None:
    assert "Tag_CPU_arch: v8-M.mainline" in attrs
    assert "Tag_FP_arch: FPv5" in attrs  # the FPU is used ...
    assert "Tag_ABI_VFP_args" not in attrs  # ... with the integer calling convention (softfp)
    assert "Tag_DSP_extension: Allowed" in attrs


def assert_bootable_image(fw, board) -> None:
    flash = board.region_for("code")
    assert fw.uf2 is not None and fw.uf2.path.exists()
    report = check_uf2(fw.uf2.path.read_bytes(), family="rp2350-arm-s",
                       flash_start=flash.origin, flash_size=flash.size, elf=fw.elf)
    assert report.matches_elf and report.abs_block == 0x10FFFF00
    d = report.image_def
    assert (d.image_type, d.cpu, d.security, d.chip) == ("exe", "arm", "secure", "rp2350")
    assert d.address < flash.origin + 4096
    assert fw.uf2.picotool_identical in (None, True)
    with open(fw.elf, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        assert text["sh_addr"] == flash.origin
        vectors = text.data()[:16]
        sp, reset = int.from_bytes(vectors[:4], "little"), int.from_bytes(vectors[4:8], "little")
        stack = board.region_for("stack")
        assert sp == stack.origin + stack.size  # __StackTop: the top of SCRATCH_X+Y
        assert reset & 1 and flash.origin <= reset < flash.origin + flash.size
        syms = elf.get_section_by_name(".symtab")
        hardfault = syms.get_symbol_by_name("isr_hardfault")[0]["st_value"]
        assert int.from_bytes(text.data()[12:16], "little") == hardfault  # ours, not a bkpt
        transcript = syms.get_symbol_by_name("dk_transcript")[0]
        assert elf.get_section(transcript["st_shndx"]).name == ".noinit"  # survives a reboot
    fit = fw.fit
    assert fit is not None and fit.fits
    assert fit.flash_size == 4 << 20 and fit.ram_size == 520 << 10


def test_selftest_image(tmp_path):
    board = load_board("pico2")
    render_board_files(board, tmp_path / "generated")
    fw = get_family("rp2350").build_image(board, tmp_path / "generated", tmp_path / "fw",
                                          "selftest")
    assert_bootable_image(fw, board)
    assert_m33_softfp_dsp(attributes(fw.elf))
    log = fw.log.read_text()
    assert "TinyUSB available" in log  # USB stdio really built in
    assert "Cloning" not in log and "picotool" not in log.lower().split("$ cmake --build")[0]
    assert fw.fit.flash_used < 64 << 10  # USB CDC stdio, no printf


@requires_sources
@pytest.mark.parametrize("flow", ["portable_fp32", "cortex_m_int8"])
def test_mlp_mnist_builds_for_pico2(tmp_path_factory, flow):
    out = tmp_path_factory.getbasetemp() / "pico2" / f"mlp_mnist-{flow}"
    built = api.build("pico2", "mlp_mnist", flow=flow, out=out)
    fw = built.firmware
    board = load_board("pico2")
    assert_bootable_image(fw, board)
    assert_m33_softfp_dsp(attributes(fw.elf))
    # The ExecuTorch runtime was built for the same CPU and ABI as the SDK and the firmware.
    linked = re.search(r"(\S+/libexecutorch_core\.a)\(", fw.map_file.read_text())
    runtime = Path(linked.group(1))
    assert_m33_softfp_dsp(attributes(runtime))
    summary = built.summary()
    assert "fit check (pico2)" in summary and "fits" in summary
    disassembly = subprocess.run(["arm-none-eabi-objdump", "-d", str(fw.elf)],
                                 capture_output=True, text=True, check=True).stdout
    assert "vmul.f32" in disassembly or "vfma.f32" in disassembly or flow == "cortex_m_int8"
    if flow == "cortex_m_int8":
        # CMSIS-NN with the M33's DSP extension: dual 16-bit MACs in the matrix kernels.
        assert "arm_nn_vec_mat_mult_t_s8" in disassembly
        assert "smlad" in disassembly or "sxtab16" in disassembly
