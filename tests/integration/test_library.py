"""`deploykit library` for real: the component built from the ExecuTorch sources, linked
through find_package into an application written like a user's (firmware/examples/bare_metal:
its own start-up, UART and linker script), run on QEMU, its outputs compared with the host's
reference: bit for bit for int8, within the model's tolerance for fp32.

Needs the cross toolchain, CMake/Ninja, QEMU and the ExecuTorch sources (`deploykit setup`);
without them each test skips and says which is missing.
"""

from __future__ import annotations

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
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

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
