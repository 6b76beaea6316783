"""`deploykit library` for real: the component built from the ExecuTorch sources, linked
through find_package into an application written like a user's (firmware/examples/bare_metal:
its own start-up, UART and linker script), run on QEMU, its outputs compared with the host's
reference: bit for bit for int8, within the model's tolerance for fp32.

The Ethos-U boards (corstone-300/320, ethos_u_int8) at the end: built and linked, checked from
the ELF, and run on QEMU's mps3-an547 up to the NPU (there is no FVP here).

Needs the cross toolchain, CMake/Ninja, QEMU and the ExecuTorch sources (`deploykit setup`;
the Ethos-U tests also the Ethos-U driver and CMSIS_6); without them each test skips and says
which is missing.
"""

from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest

from deploykit import api
from deploykit.readers.boards import load_board
from deploykit.readers.protocol.error_codes import CODES
from deploykit.run.library_app import (
    build_app,
    configure_args,
    device_outputs,
    example_dir,
    run_app,
    write_app_data,
)
from tests.markers import (
    requires_cmake,
    requires_ethos_u_sources,
    requires_qemu,
    requires_sources,
    requires_toolchain,
)

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

BOARDS = ["qemu-an547", "qemu-an505"]
RUN_TIMEOUT = 60.0  # seconds of QEMU per application run (the runs take about a second)
BUILD_TIMEOUT = 600.0  # seconds per CMake step of the application


def _code(name: str) -> int:
    return next(code for code, entry in CODES.items() if entry.name == name)


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    """Components built once per (board, models, flow) in this module."""
    built = {}

    def get(board: str, models: tuple[str, ...], flow: str):
        key = (board, models, flow)
        if key not in built:
            base = tmp_path_factory.mktemp(f"lib-{board}-{'-'.join(models)}-{flow}")
            built[key] = api.library(board, list(models), base / "component", flow=flow,
                                     work=base / "work")
        return built[key]

    return get


def _assert_matches_host(run, component) -> None:
    assert run.exit_code == 0, run.console
    for model in component.models:
        assert run.init[model.name] == 0 and run.run[model.name] == 0, run.console
        exact = model.flow != "portable_fp32"  # int8: bit for bit
        tolerance = model.export.tolerance
        for i, (device, host) in enumerate(zip(device_outputs(run, model),
                                               model.export.reference_sets[0], strict=True)):
            assert device.shape == host.shape and device.dtype == host.dtype
            if exact:
                assert np.array_equal(device, host), (model.name, i, device, host)
            else:
                np.testing.assert_allclose(device, host, atol=tolerance.get("atol", 1e-5),
                                           rtol=tolerance.get("rtol", 0.0))


@pytest.mark.parametrize("board", BOARDS)
@pytest.mark.parametrize(("model", "flow"), [("mlp_mnist", "cortex_m_int8"),
                                             ("tiny_cnn", "portable_fp32")])
def test_an_application_runs_the_component_like_the_host(components, tmp_path, board, model,
                                                         flow):
    component = components(board, (model,), flow)
    b = load_board(board)
    app = build_app(component, b, tmp_path / "app", timeout=BUILD_TIMEOUT)
    run = run_app(app.elf, b, timeout=RUN_TIMEOUT)
    _assert_matches_host(run, component)
    # The program is in its own section, beside the read-only data (the application's linker
    # script does not name it).
    from elftools.elf.elffile import ELFFile

    with open(app.elf, "rb") as f:
        elf = ELFFile(f)
        section = elf.get_section_by_name(f".dk_model.{component.models[0].name}")
        assert section is not None and section["sh_size"] == component.models[0].export.pte_size
        flash = b.region_for("vectors")
        assert flash.origin <= section["sh_addr"] < flash.origin + flash.size
        # No C++ constructors were needed: the application's start-up runs none.
        init_array = elf.get_section_by_name(".init_array")
        assert init_array is None or init_array["sh_size"] == 0


@pytest.mark.parametrize("board", BOARDS)
def test_two_models_in_one_image(components, tmp_path, board):
    """mlp_mnist and ds_cnn (int8) in one component: one runtime and one kernel registry with
    the union of their operators, one API each; initialised, then run one after the other,
    each with its own arena, both bit for bit the host's."""
    component = components(board, ("mlp_mnist", "ds_cnn"), "cortex_m_int8")
    assert [m.name for m in component.models] == ["mlp_mnist", "ds_cnn"]
    union = set(component.models[0].export.op_list) | set(component.models[1].export.op_list)
    assert component.manifest["max_kernel_num"] >= len(union)
    b = load_board(board)
    app = build_app(component, b, tmp_path / "app", timeout=BUILD_TIMEOUT)
    run = run_app(app.elf, b, timeout=RUN_TIMEOUT)
    _assert_matches_host(run, component)
    # The misuse checks of main.c, on the first model: each a clear code of the error table.
    first = component.models[0].name
    assert run.checks[("run_before_init", first)] == _code("NOT_INITIALIZED")
    assert run.checks[("input_before_init", first)] == 0  # NULL before init
    assert run.checks[("init_with_short", first)] == _code("ARENA")  # one byte too small
    assert run.checks[("init_with_null", first)] == _code("ARENA")
    assert run.checks[("run_after_failed_init", first)] == _code("NOT_INITIALIZED")
    assert f"check init_with_short {first} {_code('ARENA')} ARENA" in run.console


def test_a_cxx_application_without_exceptions_or_rtti(components, tmp_path):
    """main.cpp, compiled with -fno-exceptions -fno-rtti, links the component and runs it."""
    board = "qemu-an547"
    component = components(board, ("mlp_mnist", "ds_cnn"), "cortex_m_int8")
    b = load_board(board)
    app = build_app(component, b, tmp_path / "app", cxx=True, timeout=BUILD_TIMEOUT)
    log = app.log.read_text()
    assert "-fno-exceptions" in (tmp_path / "app/cmake/build.ninja").read_text()
    assert "-fno-rtti" in (tmp_path / "app/cmake/build.ninja").read_text()
    run = run_app(app.elf, b, timeout=RUN_TIMEOUT)
    _assert_matches_host(run, component)
    assert log  # the build's commands are kept for a failure's diagnosis


def test_the_component_is_refused_for_another_cpu(components, tmp_path):
    """The same application configured for the Cortex-M33 against the Cortex-M55 component:
    a configure-time error naming both CPUs."""
    component = components("qemu-an547", ("mlp_mnist",), "cortex_m_int8")
    b = load_board("qemu-an547")
    data = tmp_path / "data"
    write_app_data(component, b, data)
    args = configure_args(component, b, data, cpu_flags=["-mcpu=cortex-m33", "-mfloat-abi=hard"])
    proc = subprocess.run(["cmake", "-S", str(example_dir()), "-B", str(tmp_path / "cmake"),
                           "-G", "Ninja", *args],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert "was built for -mcpu=cortex-m55 -mfloat-abi=hard" in text
    assert "compiles C for -mcpu=cortex-m33 -mfloat-abi=hard" in text


def _pico_sources_reason() -> str | None:
    from deploykit.families import get_family
    from deploykit.readers.sources import load_workspace, require_projects
    from deploykit.util.errors import DeployKitError

    try:
        require_projects(load_workspace(), list(get_family("rp2350").projects),
                         "The pico-sdk example")
    except DeployKitError as exc:
        return (f"pico-sdk sources not in the workspace ({exc.cause}); add them with "
                "`deploykit setup --group pico` or --source pico-sdk=PATH@2.2.0 "
                "--source tinyusb=PATH@0.18.0")
    return None


@pytest.mark.skipif(_pico_sources_reason() is not None, reason=_pico_sources_reason() or "")
def test_a_pico_sdk_application_builds_to_a_checked_uf2(components, tmp_path):
    """firmware/examples/pico: pico_sdk_init(), find_package, target_link_libraries(app
    pico_stdlib deploykit::...), built by the SDK's own toolchain setup into an ELF that
    deploykit writes as a UF2 and its checker passes (no board here to run it)."""
    from deploykit.readers.sources import load_workspace
    from deploykit.readers.uf2 import check_uf2, write_uf2
    from deploykit.run.library_app import build_pico_app

    board = load_board("pico2")
    component = components("pico2", ("mlp_mnist",), "cortex_m_int8")
    app = build_pico_app(component, board, tmp_path / "app",
                         load_workspace().path_of("pico-sdk"), timeout=BUILD_TIMEOUT)
    flash = board.region_for("code")
    family = board.raw["pico_sdk"]["platform"]
    uf2 = write_uf2(app.elf, tmp_path / "app.uf2", family=family, flash_start=flash.origin,
                    flash_size=flash.size)
    report = check_uf2(uf2.path.read_bytes(), family=family, flash_start=flash.origin,
                       flash_size=flash.size, elf=app.elf)
    assert report.matches_elf
    # The program is in the image, in flash.
    from elftools.elf.elffile import ELFFile

    with open(app.elf, "rb") as f:
        section = ELFFile(f).get_section_by_name(".dk_model.mlp_mnist")
    assert section is not None and flash.origin <= section["sh_addr"] < flash.origin + flash.size


# ---- the Ethos-U boards (ethos_u_int8): built and linked; run where QEMU can -----------------
#
# There is no FVP and no Corstone board here, so the NPU never runs: the components are built
# from the workspace's Ethos-U driver and CMSIS_6, the example application (APP_NPU: the NPU's
# vector slot, dk_npu_init, app_npu.ld) is linked against each, and the ELF is checked from its
# symbols, sections and link map. The corstone-300 application also runs on QEMU's mps3-an547
# (Corstone-300's memory map without the NPU): everything up to the NPU.

NPU_MODEL = "tiny_cnn"
NPU_CASES = [("corstone-300", None), ("corstone-320", None),
             ("corstone-320", "Dedicated_Sram_384KB")]
QEMU_AN547 = {"kind": "qemu", "machine": "mps3-an547", "cpu": "cortex-m55"}


@pytest.fixture(scope="module")
def npu_components(tmp_path_factory):
    built = {}

    def get(board: str, memory_mode: str | None):
        key = (board, memory_mode)
        if key not in built:
            base = tmp_path_factory.mktemp(f"npu-{board}-{memory_mode or 'default'}")
            built[key] = api.library(board, [NPU_MODEL], base / "component",
                                     flow="ethos_u_int8", work=base / "work",
                                     npu_memory_mode=memory_mode)
        return built[key]

    return get


def _symbols(elf) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of the ELF's symbols."""
    from elftools.elf.sections import SymbolTableSection

    table = next(s for s in elf.iter_sections() if isinstance(s, SymbolTableSection))
    return {s.name: (s["st_value"], s["st_size"]) for s in table.iter_symbols() if s.name}


def _map_input_section(map_text: str, name: str) -> tuple[int, int]:
    """(address, size) of input section `name` in a GNU ld map."""
    import re

    m = re.search(rf"^ {re.escape(name)}\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)", map_text, re.M)
    assert m is not None, f"{name} is not in the link map"
    return int(m.group(1), 16), int(m.group(2), 16)


def _word(elf, address: int) -> int:
    """The initialised 32-bit word at `address` of the ELF."""
    section = next(s for s in elf.iter_sections() if s["sh_type"] == "SHT_PROGBITS"
                   and s["sh_addr"] <= address < s["sh_addr"] + s["sh_size"])
    return struct.unpack_from("<I", section.data(), address - section["sh_addr"])[0]


def _in_region(board, name: str, address: int) -> bool:
    region = board.region(name)
    return region.origin <= address < region.end


@requires_ethos_u_sources
@pytest.mark.parametrize(("board", "memory_mode"), NPU_CASES)
def test_an_npu_component_links_into_the_application(npu_components, tmp_path, board,
                                                     memory_mode):
    """The component of tiny_cnn (one Ethos-U delegate) through find_package into the example
    application: EthosUBackend's deferred registration, the driver's ethosu_init and its IRQ
    handler are linked, the NPU's vector slot holds dk_npu_irq_handler, `.dk_model.tiny_cnn`
    holds the program in the region the plan chose, the NPU arena (and the fast arena) in
    theirs, and nothing needs a C++ constructor. Linked without LTO for the symbols (with LTO
    the driver's functions are inlined), and with LTO as a user links it by default."""
    from elftools.elf.elffile import ELFFile

    from deploykit.readers.npu import npu_placement

    component = npu_components(board, memory_mode)
    b = load_board(board)
    if memory_mode:
        from deploykit.readers.npu import with_npu_overrides

        b = with_npu_overrides(b, memory_mode=memory_mode)
    (model,) = component.models
    assert model.npu and component.manifest["npu"]["base"] == b.npu.base
    placement = npu_placement(model.plan)
    assert component.manifest["npu"]["regions"]["model"] == placement["model"]
    header = (component.directory / "include/deploykit.h").read_text()
    assert f"#define DK_NPU_BASE 0x{b.npu.base:08X}u" in header
    assert f"#define DK_NPU_IRQ {b.npu.irq}\n" in header
    # The component's archive registers nothing from a static constructor.
    objdump = subprocess.run(["arm-none-eabi-objdump", "-h",
                              str(component.directory / f"lib/libdeploykit_{component.name}.a")],
                             capture_output=True, text=True, check=True).stdout
    assert ".init_array" not in objdump and "dk_deferred_ethos_u_backend" in objdump

    for lto in (False, True):
        app = build_app(component, b, tmp_path / f"app-lto-{lto}", lto=lto,
                        timeout=BUILD_TIMEOUT)
        map_text = app.map_file.read_text()
        with open(app.elf, "rb") as f:
            elf = ELFFile(f)
            symbols = _symbols(elf)
            if not lto:
                for name in ("dk_lib_register_ethos_u_backend",  # the deferred registration
                             "_ZTVN10executorch8backends3arm13EthosUBackendE",  # its vtable
                             "ethosu_init", "ethosu_irq_handler", "ethosu_invoke_v3",
                             "dk_npu_init", "dk_npu_irq_handler"):
                    assert name in symbols, name
            assert not any("_GLOBAL__sub_I" in s for s in symbols)
            init_array = elf.get_section_by_name(".init_array")
            assert init_array is None or init_array["sh_size"] == 0
            # The vector table: slot 16 + irq holds the component's handler (Thumb bit set).
            vectors = elf.get_section_by_name(".vectors")
            slot = 16 + b.npu.irq
            (entry,) = struct.unpack_from("<I", vectors.data(), 4 * slot)
            assert entry == symbols["dk_npu_irq_handler"][0] | 1
            # The program in .dk_model.tiny_cnn, byte for byte, where the NPU reads it.
            address, size = _map_input_section(map_text, f".dk_model.{model.name}")
            assert (address, size) == (symbols[f"dk_{model.name}_program"][0],
                                       model.export.pte_size)
            assert _in_region(b, placement["model"], address)
            models = elf.get_section_by_name(".dk_models")
            offset = address - models["sh_addr"]
            assert models.data()[offset:offset + size] == model.export.pte_path.read_bytes()
            # The NPU arena (temp pool + Vela scratch) and the fast arena in the plan's regions.
            address, size = _map_input_section(map_text, f".bss.dk_npu_scratch.{model.name}")
            assert size == model.npu_arena and address % 32 == 0
            assert _in_region(b, placement["npu_scratch"], address)
            if memory_mode:
                address, size = _map_input_section(map_text, ".bss.dk_npu_fast")
                assert size == component.manifest["npu"]["fast_scratch"] == 384 * 1024
                assert _in_region(b, placement["npu_fast"], address)
                if not lto:
                    # EthosUBackend's weak ethosu_fast_scratch(_size) are the component's.
                    assert _word(elf, symbols["ethosu_fast_scratch"][0]) == address
                    assert _word(elf, symbols["ethosu_fast_scratch_size"][0]) == size


@requires_ethos_u_sources
def test_the_corstone_300_application_without_an_npu_says_so(npu_components, tmp_path):
    """QEMU's mps3-an547 is Corstone-300 without the NPU (its ID register reads 0): the
    application's dk_npu_init() returns NO_NPU, the model still initialises (so EthosUBackend
    was registered at init: its program's delegate found its backend, and its handle came from
    the pool), reloads (the handle given back), and its run returns NPU_NOT_INITIALIZED instead
    of waiting for an NPU that is not there."""
    import yaml

    component = npu_components("corstone-300", None)
    b = load_board("corstone-300")
    app = build_app(component, b, tmp_path / "app", timeout=BUILD_TIMEOUT)
    data = yaml.safe_load(b.path.read_text())
    data["runner"] = QEMU_AN547
    board_file = tmp_path / "board" / "corstone-300.yaml"
    board_file.parent.mkdir()
    board_file.write_text(yaml.safe_dump(data, sort_keys=False))
    run = run_app(app.elf, load_board(str(board_file)), timeout=RUN_TIMEOUT)
    name = component.models[0].name
    assert run.init == {"npu": _code("NO_NPU"), name: 0}, run.console
    assert run.checks[("reinit", name)] == 0
    assert run.checks[("run_before_init", name)] == _code("NOT_INITIALIZED")
    assert run.run == {name: _code("NPU_NOT_INITIALIZED")}
    assert f"run {name} {_code('NPU_NOT_INITIALIZED')} NPU_NOT_INITIALIZED" in run.console
    assert run.exit_code == 2 and "fault" not in run.console  # the two failures, no fault
