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
from deploykit.build.render import render_board_files
from deploykit.families import get_family
from deploykit.readers.boards import load_board
from deploykit.readers.sources import load_workspace, require_projects
from deploykit.readers.uf2 import check_uf2
from deploykit.util.errors import DeployKitError
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain


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
        syms = elf.get_section_by_name(".symtab")
        top = syms.get_symbol_by_name("__StackTop")[0]["st_value"]
        assert sp == top and stack.origin < top <= stack.origin + stack.size  # in SCRATCH_X+Y
        assert reset & 1 and flash.origin <= reset < flash.origin + flash.size
        syms = elf.get_section_by_name(".symtab")
        hardfault = syms.get_symbol_by_name("isr_hardfault")[0]["st_value"]
        assert int.from_bytes(text.data()[12:16], "little") == hardfault  # ours, not a bkpt
        # LTO may give the static array a private suffix (dk_transcript.lto_priv.0)
        transcript = next(s for s in syms.iter_symbols()
                          if s.name.split(".")[0] == "dk_transcript")
        assert elf.get_section(transcript["st_shndx"]).name == ".noinit"  # survives a reboot
        config = fw.elf.parent.parent / "generated" / "model_config.h"
        if config.exists():  # the runner: sized from the model, not the board file's 16 KiB
            result = re.search(r"#define DK_RESULT_BYTES (\d+)u", config.read_text())
            assert transcript["st_size"] == int(result.group(1)) < 4096
        else:  # the self-test: the board file's serial.transcript_bytes
            assert transcript["st_size"] == board.raw["serial"]["transcript_bytes"]
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


@pytest.fixture(scope="module")
def fitted_by_proxy(tmp_path_factory):
    """mlp_mnist (cortex_m_int8) built for pico2 with `--fit` and no Pico 2 attached: (the
    build, its progress messages, its out directory). A fixture, so that each test that
    needs it gets it whatever ran before."""
    from deploykit.run.runners import RUNNERS
    from deploykit.util.errors import EnvironmentProblem

    def nothing_attached(self):
        raise EnvironmentProblem("No pico2 is connected: none found.", "plug it in")

    out = tmp_path_factory.mktemp("pico2-fit") / "mlp_mnist"
    said: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RUNNERS["pico"], "check_environment", nothing_attached)
        built = api.build("pico2", "mlp_mnist", flow="cortex_m_int8", out=out, fit=True,
                          progress=said.append)
    return built, said, out


@requires_sources
@requires_qemu
def test_fit_by_proxy_without_a_board(fitted_by_proxy, monkeypatch):
    """`build --fit` with no Pico 2 attached measures on the board file's proxy (qemu-an505,
    built with the Pico's softfp flags and runtime options) and links the Pico image at those
    peaks plus margin plus the SDK's stack (docs/memory.md, Fit by proxy)."""
    built, said, out = fitted_by_proxy
    board = load_board("pico2")
    record = built.planned.fit
    assert record is not None
    assert record.measured_on == ("measured on qemu-an505 (proxy: same core, ABI and runtime "
                                  "options)")
    assert any("measuring on its proxy qemu-an505" in m for m in said)
    # the proxy firmware: an505's map, the Pico's softfp FPU + DSP ABI
    proxy_elf = out / "fit" / "proxy" / "firmware" / "dk_runner.elf"
    assert_m33_softfp_dsp(attributes(proxy_elf))
    an505_ram = load_board("qemu-an505").region("ram")
    with open(proxy_elf, "rb") as f:
        stack = ELFFile(f).get_section_by_name(".stack")
        assert an505_ram.origin <= stack["sh_addr"] < an505_ram.end  # the proxy's memory map
    assert (out / "fit" / "proxy" / "run").is_dir()
    # the Pico image is linked at the peaks + margin (+ the SDK's stack)
    extra = board.raw["proxy"]["extra_stack"]
    from deploykit.memory import fit as fitting

    assert record.fitted["stack"] == fitting.fitted_stack(record.peaks["stack"]) + extra
    fw = built.firmware
    assert_bootable_image(fw, board)
    with open(fw.elf, "rb") as f:
        syms = ELFFile(f).get_section_by_name(".symtab")

        def size(name: str) -> int:
            return syms.get_symbol_by_name(name)[0]["st_size"]

        assert size("_ZN12_GLOBAL__N_111method_poolE") == record.fitted["method_pool"]
        top = syms.get_symbol_by_name("__dk_stack_top")[0]["st_value"]
        limit = syms.get_symbol_by_name("__dk_stack_limit")[0]["st_value"]
        assert top - limit == record.fitted["stack"]
    assert "qemu-an505 (proxy" in built.footprint.table()
    # stored: a second build reuses it without running anything (still no board attached)
    from deploykit.run.runners import RUNNERS
    from deploykit.util.errors import EnvironmentProblem

    def nothing_attached(self):
        raise EnvironmentProblem("No pico2 is connected: none found.", "plug it in")

    monkeypatch.setattr(RUNNERS["pico"], "check_environment", nothing_attached)
    again: list[str] = []
    api.build("pico2", "mlp_mnist", flow="cortex_m_int8", out=out, fit=True,
              progress=again.append)
    assert not any("measuring" in m for m in again)


def _ram_sections(elf) -> dict[str, int]:
    with open(elf, "rb") as f:
        return {s.name: s["sh_size"] for s in ELFFile(f).iter_sections() if s.name in (
            ".ram_vectors", ".noinit", ".data", ".bss", ".heap", ".dk_pools", ".stack")}


@requires_sources
@requires_qemu
def test_serve_firmware_adds_under_1_kib_besides_the_sample(fitted_by_proxy):
    """Serve firmware (issue #28; docs/pico2.md "Serve firmware on the link") of the fitted
    image: the link's frame handling and the serve loop add at most 1 KiB of RAM (.bss); the
    sample's input, which the plain image reads in place from flash, is received into
    .dk_pools (mlp_mnist's float32 [1, 784]); no other RAM section moves, pools and stack
    being the plain image's."""
    from deploykit.pipeline.stream import build_serve_firmware
    from deploykit.pipeline.target import resolve_target

    built, _said, out = fitted_by_proxy
    board = load_board("pico2")
    serve = build_serve_firmware(resolve_target("pico2", flow="cortex_m_int8"), "mlp_mnist",
                                 out, None, lambda _m: None)
    assert serve.firmware.elf.parent.name == "firmware-serve"
    assert_bootable_image(serve.firmware, board)
    plain, served = _ram_sections(built.firmware.elf), _ram_sections(serve.firmware.elf)
    assert 0 < served[".bss"] - plain[".bss"] <= 1024
    assert served[".dk_pools"] - plain[".dk_pools"] == 784 * 4
    assert {k: v for k, v in served.items() if k not in (".bss", ".dk_pools")} == {
        k: v for k, v in plain.items() if k not in (".bss", ".dk_pools")}


def _static_ram_and_code(fw) -> tuple[int, int]:
    """(static RAM: every RAM section of the ELF, code: flash without the model and inputs)."""
    with open(fw.elf, "rb") as f:
        ram = sum(s["sh_size"] for s in ELFFile(f).iter_sections() if s.name in (
            ".ram_vectors", ".noinit", ".data", ".bss", ".heap", ".dk_pools", ".stack"))
    flash = dict(fw.sizes.flash_by_component)
    code = sum(v for k, v in flash.items() if k not in ("model data", "model inputs"))
    return ram, code


@requires_sources
@requires_qemu
def test_uart_console_without_tinyusb_fitted_by_proxy(tmp_path_factory, monkeypatch):
    """pico2-uart: stdio on UART0, no TinyUSB linked, fitted by proxy; the goals of issue 18
    (int8 mlp_mnist, size profile): static RAM <= 8 KiB and code <= 24 KiB."""
    from deploykit.run.runners import RUNNERS
    from deploykit.util.errors import EnvironmentProblem

    def nothing_attached(self):
        raise EnvironmentProblem("No pico2-uart is connected: none found.", "plug it in")

    monkeypatch.setattr(RUNNERS["pico"], "check_environment", nothing_attached)
    out = tmp_path_factory.getbasetemp() / "pico2-uart-fit" / "mlp_mnist"
    built = api.build("pico2-uart", "mlp_mnist", flow="cortex_m_int8", out=out, fit=True)
    board = load_board("pico2-uart")
    fw = built.firmware
    assert_bootable_image(fw, board)
    assert "qemu-an505 (proxy" in built.planned.fit.measured_on
    assert "outputs match the host reference" in built.planned.fit.parity
    assert "lib/tinyusb/" not in fw.map_file.read_text().lower()  # not even an object of it
    with open(fw.elf, "rb") as f:
        names = {s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    assert not any(n.startswith(("tud_", "dcd_", "tusb_")) for n in names)  # no TinyUSB
    assert "stdio_uart_out_chars" in names
    ram, code = _static_ram_and_code(fw)
    # Code without the model: 24,692 B with the execute_error record (its checked CMSIS-NN
    # calls and encoder, +232 B; docs/failures.md).
    assert ram <= 8 * 1024 and code <= 25 * 1024, (ram, code)


@requires_sources
@requires_qemu
def test_usb_cdc_image_goals(fitted_by_proxy):
    """The USB CDC image of the proxy test meets the goals of issue 18: every RAM section
    together <= 10 KiB, code <= 40 KiB; and no code runs from RAM (the E15 workaround is off on
    the RP2350, and the SDK's flash-write/second-core RAM functions are linked in flash:
    docs/pico2.md)."""
    _, _, out = fitted_by_proxy
    assert (out / "fit.json").exists()
    built = api.build("pico2", "mlp_mnist", flow="cortex_m_int8", out=out)
    ram, code = _static_ram_and_code(built.firmware)
    sram = load_board("pico2").region("sram")
    with open(built.firmware.elf, "rb") as f:
        in_ram = sorted(s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()
                        if s["st_info"]["type"] == "STT_FUNC" and s["st_size"]
                        and sram.origin <= s["st_value"] < sram.end)
    assert in_ram == []
    assert code <= 40 * 1024, code
    assert ram <= 10 * 1024, ram
