"""`deploykit library` without the ExecuTorch sources: names, the union of the operator lists,
the rendered C API (reproducible, compiles with -Wall -Wextra -Werror as C and as C++), the
staged package (layout, manifest, README), and its CMake check of the consumer's CPU and float
ABI (a configure-time error naming both). The component built for real, linked and run on
QEMU: tests/integration/test_library.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploykit.build.library import (
    ComponentModel,
    TensorSpec,
    c_name,
    check_names,
    component_name,
    merged_ops_yaml,
    render_component_sources,
    stage_component,
)
from deploykit.memory.plan import MemoryPlan, PlanItem
from deploykit.program.export import ExportResult
from deploykit.readers.boards import load_board
from deploykit.util.errors import ConfigError
from tests.markers import requires_cmake, requires_toolchain

BOARD = "qemu-an547"


def _model(tmp_path: Path, name: str, *, int8_io: bool = False,
           npu: tuple[str, str, int, int] | None = None) -> ComponentModel:
    """A model of the component; `npu` = (program region, scratch region, Vela scratch, fast
    arena): its plan has the Ethos-U items a program with delegates gets (memory/plan.py)."""
    pte = tmp_path / f"{name}.pte"
    pte.write_bytes(name.encode() * 8)
    ops = tmp_path / f"{name}.ops.yaml"
    ops.write_text(yaml.safe_dump({"operators": {f"cortex_m::{name}.out": {
        "debug_info": [name], "include_all_overloads": False, "is_root_operator": True,
        "is_used_for_training": False}}, "et_kernel_metadata": {}}))
    export = ExportResult(
        flow="cortex_m_int8", cpu="cortex-m55", model_name=name, pte_path=pte,
        report_path=tmp_path / "export.json", reference_path=tmp_path / "reference.npz",
        ops_yaml_path=ops, op_list=[f"cortex_m::{name}.out"], inputs=[],
        input_dim_orders=[[0, 2, 3, 1]], host_outputs=[], output_dim_orders=[[0, 1]],
        reference_kind="test", eager_outputs=[], eager_max_abs_diff=0.0, input_quant=[None],
        output_quant=[None], tolerance={}, tolerance_source="default", export_seconds=0.0,
        pte_size=pte.stat().st_size, pte_sha256=hashlib.sha256(pte.read_bytes()).hexdigest(),
        planned_buffers=[816], kernel_calls={})
    dtype, scale = ("int8", 0.00390625) if int8_io else ("float32", None)
    size = 1 if int8_io else 4
    inputs = (TensorSpec("input", 0, dtype, (1, 1, 49, 10), (0, 2, 3, 1), 490 * size, False,
                         scale, -128 if int8_io else 0),)
    outputs = (TensorSpec("output", 0, dtype, (1, 12), (0, 1), 12 * size, True, scale,
                          5 if int8_io else 0),)
    items: tuple[PlanItem, ...] = ()
    flow = "cortex_m_int8"
    if npu is not None:
        model_region, scratch_region, scratch, fast = npu
        items = (PlanItem("model (.pte constant data)", "model", 80, "pte", model_region),
                 PlanItem("Ethos-U scratch (test, largest of 1 delegate)", "npu_scratch", scratch,
                          "pte", scratch_region),
                 *([PlanItem("Ethos-U fast scratch (test)", "npu_scratch", fast, "board",
                             "sram")] if fast else []))
        flow = "ethos_u_int8"
    plan = MemoryPlan(BOARD, items, (), method_pool=1872, temp_pool=176, planned_buffers=(816,))
    return ComponentModel(c_name(name), name, flow, export, plan, "test sizes",
                          inputs, outputs)


def test_c_names_are_identifiers_and_never_collide():
    assert c_name("mlp_mnist") == "mlp_mnist"
    assert c_name("models/DS-CNN.py") == "ds_cnn"
    assert c_name("3layer") == "m_3layer"
    assert check_names(["mlp_mnist", "ds_cnn"]) == ["mlp_mnist", "ds_cnn"]
    with pytest.raises(ConfigError, match="both get the C name dk_ds_cnn"):
        check_names(["ds_cnn", "other/DS-CNN.py"])
    with pytest.raises(ConfigError, match="shared API"):
        check_names(["error_name"])
    with pytest.raises(ConfigError, match="shared API"):
        check_names(["models/NPU.py"])  # dk_npu_init is the NPU's
    assert component_name(["a", "b"], None) == "a_b"
    with pytest.raises(ConfigError, match="--name my_set"):
        component_name(["a"], "my-set")


def test_the_operator_lists_are_merged_into_one(tmp_path):
    a, b = _model(tmp_path, "alpha"), _model(tmp_path, "beta")
    both = yaml.safe_load(merged_ops_yaml([a.export.ops_yaml_path, b.export.ops_yaml_path,
                                           a.export.ops_yaml_path]))
    assert sorted(both["operators"]) == ["cortex_m::alpha.out", "cortex_m::beta.out"]
    assert all("debug_info" not in e for e in both["operators"].values())


def _render(tmp_path: Path, out: str, models: list[ComponentModel]) -> list[Path]:
    return render_component_sources(models, "set", load_board(BOARD), tmp_path / out,
                                     "deploykit library test")


def test_rendering_is_reproducible_and_has_the_api(tmp_path):
    models = [_model(tmp_path, "alpha", int8_io=True), _model(tmp_path, "beta")]
    first = _render(tmp_path, "a", models)
    second = _render(tmp_path, "b", models)
    assert [p.name for p in first] == [p.name for p in second]
    for x, y in zip(first, second, strict=True):
        assert x.read_bytes() == y.read_bytes(), x.name
    header = (tmp_path / "a/include/dk_alpha.h").read_text()
    for line in ("int dk_alpha_init(void);", "int dk_alpha_init_with(void *arena, size_t size);",
                 "int dk_alpha_run(void);", "void *dk_alpha_input(int index);",
                 "const void *dk_alpha_output(int index);",
                 "#define DK_ALPHA_INPUT0_SHAPE { 1, 1, 49, 10 }",
                 "#define DK_ALPHA_INPUT0_DIM_ORDER { 0, 2, 3, 1 }",
                 "#define DK_ALPHA_INPUT0_SCALE 0.00390625f",
                 "#define DK_ALPHA_INPUT0_ZERO_POINT (-128)",
                 "#define DK_ALPHA_OUTPUT0_ZERO_POINT (5)",
                 # method 1872 + temp 176 + planned 816 + the in-place input 490 -> 496
                 "#define DK_ALPHA_ARENA_SIZE 3360u",
                 "int dk_alpha_quantize_input(int index, const float *values, size_t count);"):
        assert line in header, line
    assert "DK_BETA_INPUT0_SCALE" not in (tmp_path / "a/include/dk_beta.h").read_text()
    program = (tmp_path / "a/dk_beta_program.c").read_text()
    assert '.section .dk_model.beta,\\"a\\",%progbits' in program
    assert (tmp_path / "a/beta.pte").read_bytes() == models[1].export.pte_path.read_bytes()
    common = (tmp_path / "a/include/deploykit.h").read_text()
    assert "#define DK_ET_INVALID_ARGUMENT 0x12" in common
    assert '"NOT_INITIALIZED"' in (tmp_path / "a/deploykit.c").read_text()
    # No date or time: the header line carries the inputs' hash only.
    assert "inputs sha256" in header.splitlines()[0]


@requires_toolchain
@pytest.mark.parametrize("language", ["c", "c++"])
def test_the_api_compiles_warning_free(tmp_path, language):
    _render(tmp_path, "src", [_model(tmp_path, "alpha", int8_io=True), _model(tmp_path, "beta")])
    src = tmp_path / "src"
    use = tmp_path / ("use.c" if language == "c" else "use.cpp")
    use.write_text('#include "dk_alpha.h"\n#include "dk_beta.h"\n'
                   "int use(void);\n"
                   "int use(void) { static const int32_t shape[] = DK_ALPHA_INPUT0_SHAPE; "
                   "return dk_alpha_init() + (int)sizeof shape + (int)DK_BETA_ARENA_SIZE; }\n")
    compiler = "arm-none-eabi-gcc" if language == "c" else "arm-none-eabi-g++"
    extra = ["-std=c11"] if language == "c" else ["-std=c++17", "-fno-exceptions", "-fno-rtti"]
    flags = [*load_board(BOARD).cpu_flags, "-Wall", "-Wextra", "-Werror", "-pedantic", *extra]
    for source in [use] + ([src / "deploykit.c"] if language == "c" else []):
        subprocess.run([compiler, *flags, "-I", str(src / "include"), "-c", str(source), "-o",
                        str(tmp_path / (source.name + ".o"))], check=True, timeout=60)


@pytest.mark.parametrize("board_name", ["corstone-300", "corstone-320"])
def test_an_npu_component_declares_the_npu_with_the_board_files_values(tmp_path, board_name):
    """deploykit.h of a component with Ethos-U models declares dk_npu_init() and
    dk_npu_irq_handler() and defines the board file's NPU facts (read here from the board file,
    never written in the test); each NPU model's header has its NPU arena, whose section and
    region the plan decided; a CPU component's has none of it."""
    board = load_board(board_name)
    npu = board.npu
    assert npu is not None and board.cpu.get("security") == "secure"
    models = [_model(tmp_path, "alpha", int8_io=True, npu=("ddr", "sram", 3568, 0)),
              _model(tmp_path, "beta")]
    render_component_sources(models, "set", board, tmp_path / "src", "test")
    common = (tmp_path / "src/include/deploykit.h").read_text()
    for line in ("int dk_npu_init(void *npu_base, int secure_enable, int privilege_enable);",
                 "void dk_npu_irq_handler(void);",
                 f"#define DK_NPU_BASE 0x{npu.base:08X}u",  # secure alias: the board runs secure
                 f"#define DK_NPU_IRQ {npu.irq}",
                 f"#define DK_NPU_SECURE_ENABLE {int(bool(npu.secure_enable))}",
                 f"#define DK_NPU_PRIVILEGE_ENABLE {int(npu.privilege_enable)}",
                 f'#define DK_NPU_TARGET "{npu.target}"',
                 f'#define DK_NPU_MEMORY_MODE "{npu.memory_mode}"',
                 f"#define DK_NPU_{npu.type.upper().replace('-', '_')} 1",
                 "#define DK_NPU_FAST_SCRATCH_SIZE 0u",
                 f"exception 16 + DK_NPU_IRQ\n *      ({npu.irq + 16})",
                 "before the first dk_<model>_init()"):
        assert line in common, line
    sram, ddr = board.region(npu.sram_region), board.region(npu.ext_region)
    assert f"region {ddr.name} (0x{ddr.origin:08X}" in common  # the programs (Shared_Sram)
    assert f"region {sram.name} (0x{sram.origin:08X}" in common  # the scratch
    alpha = (tmp_path / "src/include/dk_alpha.h").read_text()
    for line in ("#define DK_ALPHA_NPU_SCRATCH_SIZE 3568u",
                 "#define DK_ALPHA_NPU_ARENA_SIZE 3744u",  # temp pool 176 + scratch 3568
                 '#define DK_ALPHA_NPU_ARENA_SECTION ".bss.dk_npu_scratch.alpha"',
                 '#define DK_ALPHA_NPU_ARENA_REGION "sram"',
                 '#define DK_ALPHA_PROGRAM_REGION "ddr"',
                 # method 1872 + planned 816 + the in-place input 490 -> 496; no temp pool
                 "#define DK_ALPHA_ARENA_SIZE 3184u",
                 "DK_ERR_NPU_NOT_INITIALIZED before dk_npu_init() succeeded"):
        assert line in alpha, line
    source = (tmp_path / "src/dk_alpha.cpp").read_text()
    assert '__attribute__((section(".bss.dk_npu_scratch.alpha")' in source
    assert "if (!dk_lib_npu_ready()) return DK_ERR_NPU_NOT_INITIALIZED;" in source
    assert "_NPU_" not in (tmp_path / "src/include/dk_beta.h").read_text()  # a CPU model
    assert "dk_lib_npu_ready" not in (tmp_path / "src/dk_beta.cpp").read_text()
    render_component_sources([_model(tmp_path, "beta")], "cpu", board, tmp_path / "cpu", "test")
    assert "dk_npu" not in (tmp_path / "cpu/include/deploykit.h").read_text()


def test_a_dedicated_sram_component_has_the_fast_arena(tmp_path):
    """Dedicated_Sram_384KB: the scratch behind the external port, the fast arena in the SRAM."""
    from deploykit.readers.npu import with_npu_overrides

    board = with_npu_overrides(load_board("corstone-320"), memory_mode="Dedicated_Sram_384KB")
    model = _model(tmp_path, "alpha", npu=("ddr", "ddr", 1024, 384 * 1024))
    render_component_sources([model], "set", board, tmp_path / "src", "test")
    common = (tmp_path / "src/include/deploykit.h").read_text()
    assert "#define DK_NPU_FAST_SCRATCH_SIZE 393216u" in common
    assert '#define DK_NPU_MEMORY_MODE "Dedicated_Sram_384KB"' in common
    assert "the fast arena, section .bss.dk_npu_fast:\n *     region sram" in common
    assert '#define DK_ALPHA_NPU_ARENA_REGION "ddr"' in (
        tmp_path / "src/include/dk_alpha.h").read_text()


def test_the_npu_application_memory_block_names_the_plans_regions():
    """The example application's memory.ld for an NPU component: FLASH and RAM, the plan's
    regions declared once, and the aliases app_npu.ld places the NPU's sections with."""
    from deploykit.run.library_app import memory_ld

    board = load_board("corstone-300")
    text = memory_ld(board, {"model": "ddr", "npu_scratch": "sram"})
    ddr, sram = board.region("ddr"), board.region("sram")
    assert f"ddr (rwx) : ORIGIN = 0x{ddr.origin:08X}, LENGTH = {ddr.size}" in text
    assert f"sram (rwx) : ORIGIN = 0x{sram.origin:08X}, LENGTH = {sram.size}" in text
    assert 'REGION_ALIAS("MODEL", ddr);' in text
    assert 'REGION_ALIAS("NPU_SCRATCH", sram);' in text
    assert 'REGION_ALIAS("NPU_FAST", sram);' in text  # no fast arena: the scratch's region
    assert text.count("sram (rwx)") == 1
    assert "REGION_ALIAS" not in memory_ld(board)  # a CPU component's: FLASH and RAM only


@requires_toolchain
@pytest.mark.parametrize("language", ["c", "c++"])
def test_the_npu_api_compiles_warning_free(tmp_path, language):
    board = load_board("corstone-300")
    render_component_sources([_model(tmp_path, "alpha", npu=("ddr", "sram", 3568, 0))], "set",
                             board, tmp_path / "src", "test")
    use = tmp_path / ("use.c" if language == "c" else "use.cpp")
    use.write_text('#include "dk_alpha.h"\n'
                   "int use(void);\n"
                   "int use(void) { return dk_npu_init((void *)DK_NPU_BASE, "
                   "DK_NPU_SECURE_ENABLE, DK_NPU_PRIVILEGE_ENABLE) + DK_NPU_IRQ + "
                   "(int)DK_ALPHA_NPU_ARENA_SIZE; }\n"
                   "void (*const npu_vector)(void) = dk_npu_irq_handler;\n")
    compiler = "arm-none-eabi-gcc" if language == "c" else "arm-none-eabi-g++"
    extra = ["-std=c11"] if language == "c" else ["-std=c++17", "-fno-exceptions", "-fno-rtti"]
    flags = [*board.cpu_flags, "-Wall", "-Wextra", "-Werror", "-pedantic", *extra]
    subprocess.run([compiler, *flags, "-I", str(tmp_path / "src/include"), "-c", str(use), "-o",
                    str(tmp_path / "use.o")], check=True, timeout=60)


def _staged(tmp_path: Path) -> tuple[Path, dict]:
    models = [_model(tmp_path, "alpha"), _model(tmp_path, "beta")]
    sources = tmp_path / "sources"
    render_component_sources(models, "set", load_board(BOARD), sources, "test")
    archives = []
    for name in ("libdeploykit_set.a", "libexecutorch_core.a", "libdeploykit_set_libc.a"):
        path = tmp_path / "archives" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"!<arch>\n")
        archives.append(path)
    out = tmp_path / "component"
    manifest = stage_component(
        directory=out, component="set", board=load_board(BOARD), models=models,
        sources=sources, archives=archives,
        build_facts={"lto": "ON", "compiler": "GNU 12.2.1", "et_runtime": "k",
                     "max_kernel_num": "3"},
        profile="size", et_commit="e4d02f41f790" + "0" * 28,
        versions={"executorch": "1.4.1"})
    return out, manifest


def test_the_package_layout_manifest_and_readme(tmp_path):
    out, manifest = _staged(tmp_path)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == sorted([
        "README.md", "manifest.json", "include/deploykit.h", "include/dk_errors.h",
        "include/dk_alpha.h", "include/dk_beta.h", "lib/libdeploykit_set.a",
        "lib/libexecutorch_core.a", "lib/libdeploykit_set_libc.a",
        "lib/cmake/deploykit_set/deploykit_setConfig.cmake",
        "lib/cmake/deploykit_set/deploykit_setConfigVersion.cmake"])
    saved = json.loads((out / "manifest.json").read_text())
    assert saved == manifest
    assert saved["target"] == "deploykit::set"
    assert saved["aliases"] == ["deploykit::alpha", "deploykit::beta"]
    assert saved["cpu_flags"] == load_board(BOARD).cpu_flags
    assert [m["name"] for m in saved["models"]] == ["alpha", "beta"]
    for rel, digest in saved["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    readme = (out / "README.md").read_text()
    for line in ("find_package(deploykit_set CONFIG REQUIRED PATHS",
                 "target_link_libraries(app PRIVATE deploykit::set)", "dk_alpha_init()",
                 "ExecuTorch 1.4.1"):
        assert line in readme
    # Restaging replaces the directory; nothing is left beside it.
    _staged(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _consume(tmp_path: Path, component: Path, cpu_flags: str) -> subprocess.CompletedProcess:
    project = tmp_path / "consumer"
    project.mkdir(exist_ok=True)
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(consumer C)\n"
        "find_package(deploykit_set CONFIG REQUIRED)\n"
        "add_library(app STATIC app.c)\ntarget_link_libraries(app PRIVATE deploykit::set)\n")
    (project / "app.c").write_text('#include "dk_alpha.h"\n'
                                   "int f(void) { return dk_alpha_run(); }\n")
    toolchain = Path(__file__).resolve().parents[2] / "firmware/examples/bare_metal/toolchain.cmake"
    build = tmp_path / f"build-{hashlib.sha256(cpu_flags.encode()).hexdigest()[:8]}"
    shutil.rmtree(build, ignore_errors=True)
    return subprocess.run(["cmake", "-S", str(project), "-B", str(build), "-G", "Ninja",
                           f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", f"-DAPP_CPU_FLAGS={cpu_flags}",
                           f"-DCMAKE_PREFIX_PATH={component}"],
                          capture_output=True, text=True, timeout=120, check=False)


@requires_toolchain
@requires_cmake
def test_a_consumer_for_another_cpu_or_float_abi_fails_at_configure(tmp_path):
    component, _ = _staged(tmp_path)
    ok = _consume(tmp_path, component, "-mcpu=cortex-m55 -mfloat-abi=hard")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for flags in ("-mcpu=cortex-m33 -mfloat-abi=hard", "-mcpu=cortex-m55 -mfloat-abi=softfp"):
        bad = _consume(tmp_path, component, flags)
        assert bad.returncode != 0
        text = " ".join((bad.stdout + bad.stderr).split())
        assert "deploykit_set was built for -mcpu=cortex-m55 -mfloat-abi=hard" in text
        assert f"but this project compiles C for {flags}" in text
