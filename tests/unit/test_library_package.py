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
from deploykit.memory.plan import MemoryPlan
from deploykit.program.export import ExportResult
from deploykit.readers.boards import load_board
from deploykit.util.errors import ConfigError
from tests.markers import requires_cmake, requires_toolchain

BOARD = "qemu-an547"


def _model(tmp_path: Path, name: str, *, int8_io: bool = False) -> ComponentModel:
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
    plan = MemoryPlan(BOARD, (), (), method_pool=1872, temp_pool=176, planned_buffers=(816,))
    return ComponentModel(c_name(name), name, "cortex_m_int8", export, plan, "test sizes",
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
