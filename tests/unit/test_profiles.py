"""Build profiles: one typed object from the board file / command line to the CMake cache, and a
runtime cache key that changes with every input of the runtime's objects (docs/profiles.md).

Fast, no cross toolchain: the key is computed by cmake/executorch-runtime/key.cmake itself, in
CMake script mode (`cmake -P`), on fake inputs."""

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.cli import build_parser
from deploykit.families import family_of
from deploykit.flows.base import ExportOptions
from deploykit.pipeline.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    get_profile,
    resolve_profile,
    soft_float_flags,
)
from deploykit.readers.boards import load_board, repo_root
from deploykit.util.errors import ConfigError
from tests.markers import requires_cmake, requires_sources

RUNTIME_CMAKE = repo_root() / "cmake" / "ExecuTorchRuntime.cmake"
KEY_CMAKE = repo_root() / "cmake" / "executorch-runtime" / "key.cmake"
# The profile's options that change the runtime's objects (the rest are model-side).
RUNTIME_OPTIONS = ("DK_ET_BUILD_TYPE", "DK_ET_KERNEL_OPT", "DK_ET_CMSIS_NN_OPT",
                   "DK_ET_LOGGING", "DK_ET_PIC", "DK_LTO")
MODEL_SIDE_OPTIONS = ("DK_PROFILE", "DK_ET_EXACT_KERNEL_REGISTRY", "DK_ET_MODEL_PRIM_OPS",
                      "DK_LEAN_LIBC")


def _required_variables() -> list[str]:
    text = RUNTIME_CMAKE.read_text()
    m = re.search(r"set\(DK_PROFILE_VARIABLES(.*?)\)", text, re.S)
    assert m, "ExecuTorchRuntime.cmake lists the profile variables it requires"
    return m.group(1).split()


def test_size_is_the_default():
    assert DEFAULT_PROFILE == "size"
    assert resolve_profile(load_board("qemu-an505")).name == "size"
    assert resolve_profile(load_board("qemu-an547"), None) is PROFILES["size"]


def test_board_file_sets_the_default_and_the_command_line_overrides_it():
    board = load_board("qemu-an505")
    with_default = dataclasses.replace(board, raw={**board.raw, "profile": "speed"})
    assert resolve_profile(with_default).name == "speed"
    assert resolve_profile(with_default, "reference").name == "reference"
    with pytest.raises(ConfigError, match="Unknown build profile 'fast'"):
        resolve_profile(board, "fast")
    with pytest.raises(ConfigError, match="reference, size, speed"):
        get_profile("")


def test_every_profile_sets_every_variable_the_cmake_side_requires():
    required = _required_variables()
    assert set(required) >= {*RUNTIME_OPTIONS, *MODEL_SIDE_OPTIONS}
    for profile in PROFILES.values():
        defs = profile.cmake_definitions(family_of(load_board("qemu-an505")))
        assert set(required) <= set(defs), profile.name
        assert defs["DK_PROFILE"] == profile.name
        for flag in ("DK_ET_LOGGING", "DK_ET_PIC", "DK_LTO", "DK_ET_EXACT_KERNEL_REGISTRY",
                     "DK_ET_MODEL_PRIM_OPS", "DK_LEAN_LIBC"):
            assert defs[flag] in ("ON", "OFF"), (profile.name, flag)


def test_the_cmake_side_has_no_defaults_of_its_own():
    """One place decides a profile: ExecuTorchRuntime.cmake and the runtime project fail
    without the variables instead of falling back to defaults of their own."""
    for path in (RUNTIME_CMAKE, repo_root() / "cmake/executorch-runtime/CMakeLists.txt"):
        text = path.read_text()
        for var in ("DK_ET_LOGGING", "DK_ET_BUILD_TYPE", "DK_ET_PIC", "DK_LTO"):
            assert not re.search(rf"option\({var}\b|set\({var} \S+ CACHE", text), (path, var)


def test_profiles_differ_where_the_spec_says():
    ref, size, speed = (PROFILES[n].cmake_definitions() for n in ("reference", "size", "speed"))
    assert (ref["DK_ET_LOGGING"], ref["DK_ET_PIC"], ref["DK_LTO"]) == ("ON", "ON", "OFF")
    assert ref["DK_ET_EXACT_KERNEL_REGISTRY"] == "OFF" and ref["DK_ET_MODEL_PRIM_OPS"] == "OFF"
    assert (size["DK_ET_LOGGING"], size["DK_ET_PIC"], size["DK_LTO"]) == ("OFF", "OFF", "ON")
    assert size["DK_ET_EXACT_KERNEL_REGISTRY"] == "ON" and size["DK_LEAN_LIBC"] == "ON"
    assert speed["DK_ET_KERNEL_OPT"] in ("-O2", "-O3") and size["DK_ET_KERNEL_OPT"] == ""
    assert all(d["DK_ET_BUILD_TYPE"] == "MinSizeRel" for d in (ref, size))
    assert PROFILES["reference"].memory == "fixed"
    assert PROFILES["size"].memory == PROFILES["speed"].memory == "fit"


def test_export_options_per_profile():
    ref, size, speed = (PROFILES[n].export_options() for n in ("reference", "size", "speed"))
    assert ref == ExportOptions(fold_constants=False, int8_io=False, plan_inputs=True)
    assert size == ExportOptions(fold_constants=True, int8_io=False, plan_inputs=False)
    assert speed.int8_io and speed.fold_constants
    assert len({ref.key(), size.key(), speed.key()}) == 3  # the export cache keys on them


def test_soft_float_flags_are_derived_from_the_board_cpu():
    assert soft_float_flags(["-mcpu=cortex-m33", "-mfloat-abi=hard", "-mfpu=fpv5-sp-d16"]) == \
        ["-mcpu=cortex-m33+nofp", "-mfloat-abi=soft"]
    pico = load_board("pico2").cpu["gcc_flags"]
    assert soft_float_flags(pico) == ["-mcpu=cortex-m33+nofp", "-mthumb",
                                      "-march=armv8-m.main+dsp", "-mfloat-abi=soft", "-mcmse"]
    assert soft_float_flags(["-mcpu=cortex-m4+nofp"]) == ["-mcpu=cortex-m4+nofp",
                                                          "-mfloat-abi=soft"]


def test_reference_compiles_soft_float_except_on_mve_cores():
    ref = PROFILES["reference"]
    m33 = ref.board_for(load_board("qemu-an505"))
    assert m33.cpu["float_abi"] == "soft" and "fpu" not in m33.cpu
    assert "-mcpu=cortex-m33+nofp" in m33.cpu_flags and "-mfpu=fpv5-sp-d16" not in m33.cpu_flags
    assert m33.cpu["core"] == "cortex-m33"  # the export's CPU is unchanged
    m55 = load_board("qemu-an547")
    assert ref.board_for(m55) is m55  # soft float would switch MVE off too
    assert PROFILES["size"].board_for(load_board("qemu-an505")).cpu["float_abi"] == "hard"


def test_the_pico_gets_the_size_profile_like_the_mps_boards():
    # The proxy (qemu-an505 built with the Pico's flags) must see the Pico's options: the same
    # definitions for both, LTO and the lean libc included (firmware/pico keeps the SDK's own
    # sources out of LTO and its printf wrappers and operator new/delete).
    size, reference = PROFILES["size"], PROFILES["reference"]
    for board in ("qemu-an505", "pico2", "pico2-uart"):
        defs = size.cmake_definitions(family_of(load_board(board)))
        assert (defs["DK_LEAN_LIBC"], defs["DK_LTO"], defs["DK_ET_LOGGING"]) == ("ON", "ON", "OFF")
        ref = reference.cmake_definitions(family_of(load_board(board)))
        assert (ref["DK_LEAN_LIBC"], ref["DK_LTO"]) == ("OFF", "OFF")


def test_a_family_without_lto_turns_it_off(monkeypatch):
    from deploykit.families import get_family

    monkeypatch.setattr(type(get_family("rp2350")), "supports_lto", False)
    assert PROFILES["size"].cmake_definitions(get_family("rp2350"))["DK_LTO"] == "OFF"
    assert PROFILES["size"].cmake_definitions(get_family("mps"))["DK_LTO"] == "ON"


def test_fixed_pools_pad_the_first_planned_buffer():
    from deploykit.program.inspect import ProgramInfo

    program = ProgramInfo(Path("x.pte"), 100, "forward", (), (), (3920, 64), (), (), 10, 3, 0)
    ref = PROFILES["reference"].fixed_program(program)
    assert ref.planned_buffers == (200 * 1024, 64)
    assert PROFILES["size"].fixed_program(program) is program


def test_build_help_documents_the_profiles():
    parser = build_parser()
    build = next(a for a in parser._subparsers._group_actions[0].choices.items()
                 if a[0] == "build")[1]
    text = build.format_help()
    for profile in PROFILES.values():
        assert profile.summary in text
    assert "--profile {reference,size,speed}" in text
    args = parser.parse_args(["build", "--board", "qemu-an505", "--model", "mlp_mnist",
                              "--profile", "speed"])
    assert args.profile == "speed"


# ---- the runtime cache key, computed by key.cmake in script mode ----------------------------

def _inputs(tmp: Path) -> dict[str, str]:
    et = tmp / "executorch"
    et.mkdir(exist_ok=True)
    (et / "version.txt").write_text("1.4.1\n")
    gen = tmp / "generated"
    gen.mkdir(exist_ok=True)
    (gen / "board.cmake").write_text(
        'set(DK_CPU_CORE "cortex-m33")\nset(DK_CPU_FLAGS "-mcpu=cortex-m33" '
        '"-mfloat-abi=hard" "-mfpu=fpv5-sp-d16")\n')
    toolchain = tmp / "toolchain.cmake"
    toolchain.write_text("# toolchain\n")
    return {"EXECUTORCH_SOURCE_DIR": str(et), "DK_GENERATED_DIR": str(gen),
            "CMAKE_TOOLCHAIN_FILE": str(toolchain), "DK_ET_COMMIT": "e4d02f41",
            "DK_CMSIS_NN_DIR": "/ws/cmsis-nn", "_dk_flatc": "/ws/flatc",
            "CMAKE_C_COMPILER": "/usr/bin/arm-none-eabi-gcc", "CMAKE_C_COMPILER_VERSION": "12.2.1",
            "CMAKE_CXX_COMPILER": "/usr/bin/arm-none-eabi-g++",
            "CMAKE_CXX_COMPILER_VERSION": "12.2.1", "CMAKE_GENERATOR": "Ninja",
            "CMAKE_C_FLAGS": "-mcpu=cortex-m33", "CMAKE_CXX_FLAGS": "-mcpu=cortex-m33",
            "CMAKE_C_FLAGS_MINSIZEREL": "-Os -DNDEBUG", "DK_ET_FP_CONTRACT": "off",
            "DK_DEPLOYKIT_VERSION": "0.1.0", **PROFILES["size"].cmake_definitions()}


def _key(tmp: Path, defs: dict[str, str], key_cmake: Path = KEY_CMAKE) -> tuple[str, str]:
    probe = tmp / "probe.cmake"
    probe.write_text(f'include("{key_cmake}")\n'
                     "dk_et_runtime_key(_key _label _text)\n"
                     'message("KEY=${_key} LABEL=${_label}")\n')
    args = [f"-D{k}={v}" for k, v in defs.items()]
    proc = subprocess.run(["cmake", *args, "-P", str(probe)], capture_output=True, text=True,
                          check=True)
    m = re.search(r"KEY=(\w+) LABEL=(\S+)", proc.stderr)
    assert m, proc.stderr
    return m.group(1), m.group(2)


@requires_cmake
def test_runtime_key_is_stable_and_differs_per_profile(tmp_path):
    base = _inputs(tmp_path)
    key, label = _key(tmp_path, base)
    assert re.fullmatch(r"[0-9a-f]{16}", key) and label == "et1.4.1-cortex-m33"
    assert _key(tmp_path, dict(base)) == (key, label)  # same inputs, same key
    keys = {name: _key(tmp_path, {**base, **p.cmake_definitions()})[0]
            for name, p in PROFILES.items()}
    assert keys["size"] == key
    assert len(set(keys.values())) == len(PROFILES), keys


@requires_cmake
def test_every_runtime_input_changes_the_key(tmp_path):
    base = _inputs(tmp_path)
    key, _ = _key(tmp_path, base)
    changes = {
        "DK_ET_LOGGING": "ON", "DK_ET_PIC": "ON", "DK_LTO": "OFF", "DK_ET_KERNEL_OPT": "-O2",
        "DK_ET_CMSIS_NN_OPT": "", "DK_ET_BUILD_TYPE": "Release", "DK_ET_COMMIT": "0123abcd",
        "DK_CMSIS_NN_DIR": "/other/cmsis-nn", "_dk_flatc": "/other/flatc",
        "CMAKE_C_COMPILER_VERSION": "13.2.1", "CMAKE_CXX_COMPILER_VERSION": "13.2.1",
        "CMAKE_C_FLAGS": "-mcpu=cortex-m33 -flto", "DK_ET_FP_CONTRACT": "fast",
        "CMAKE_GENERATOR": "Unix Makefiles", "DK_DEPLOYKIT_VERSION": "0.2.0",
    }
    seen = {key}
    for var, value in changes.items():
        assert base[var] != value, var
        changed, _ = _key(tmp_path, {**base, var: value})
        assert changed not in seen, f"{var} does not change the runtime key"
        seen.add(changed)
    # Files: the CPU flags in board.cmake, the toolchain file's content, the ExecuTorch version.
    gen = Path(base["DK_GENERATED_DIR"]) / "board.cmake"
    gen.write_text(gen.read_text().replace('"-mcpu=cortex-m33"', '"-mcpu=cortex-m33+nofp"'))
    assert _key(tmp_path, base)[0] not in seen
    seen.add(_key(tmp_path, base)[0])
    Path(base["CMAKE_TOOLCHAIN_FILE"]).write_text("# toolchain, edited\n")
    assert _key(tmp_path, base)[0] not in seen


@requires_cmake
def test_the_runtime_projects_own_files_are_in_the_key(tmp_path):
    """Another deploykit's runtime project (another checkout, an upgraded install: the files of
    cmake/executorch-runtime/, configure.cmake among them) may build the same inputs into other
    objects: a copy of the project gives the same key, an edit of any of its files another. The
    model-side ExecuTorchRuntime.cmake is not in the key: an edit of how a firmware links its
    runtime leaves every cached runtime valid."""
    base = _inputs(tmp_path)
    key, _ = _key(tmp_path, base)
    copy = tmp_path / "other-cmake"
    shutil.copytree(KEY_CMAKE.parents[1], copy)
    other_key = copy / "executorch-runtime" / "key.cmake"
    assert _key(tmp_path, base, other_key)[0] == key
    seen = {key}
    for name in ("executorch-runtime/CMakeLists.txt", "executorch-runtime/build.cmake",
                 "executorch-runtime/ethos_u.cmake", "executorch-runtime/configure.cmake"):
        with (copy / name).open("a") as f:
            f.write("# edited\n")
        changed = _key(tmp_path, base, other_key)[0]
        assert changed not in seen, f"{name} is not in the runtime key"
        seen.add(changed)
    with (copy / "ExecuTorchRuntime.cmake").open("a") as f:
        f.write("# edited\n")
    assert _key(tmp_path, base, other_key)[0] in seen



def _key_text(tmp: Path, defs: dict[str, str], key_cmake: Path = KEY_CMAKE) -> str:
    """The text key.cmake hashes (dk-runtime-key.txt)."""
    probe = tmp / "probe-text.cmake"
    probe.write_text(f'include("{key_cmake}")\n'
                     "dk_et_runtime_key(_key _label _text)\n"
                     'message("BEGIN\n${_text}END")\n')
    args = [f"-D{k}={v}" for k, v in defs.items()]
    proc = subprocess.run(["cmake", *args, "-P", str(probe)], capture_output=True, text=True,
                          check=True, timeout=60)
    m = re.search(r"BEGIN\n(.*)END", proc.stderr, re.S)
    assert m, proc.stderr
    return m.group(1)


@requires_cmake
@pytest.mark.timeout(120)
def test_checkouts_with_the_same_files_share_the_runtime_key(tmp_path):
    """Two checkouts of deploykit at different paths (a second clone, a git worktree, another
    install) whose runtime project and toolchain file are byte-identical compute the same key,
    each with its own key.cmake and toolchain file: the key is by content, and its text names
    neither checkout, so they share one runtime directory of the workspace. A toolchain file
    with other content gives another key."""
    base = _inputs(tmp_path)
    checkouts = []
    for name in ("checkout-a", "checkout-b"):
        cmake_dir = tmp_path / name / "deploykit" / "cmake"
        shutil.copytree(KEY_CMAKE.parents[1], cmake_dir)
        checkouts.append(cmake_dir)
    keys, texts = [], []
    for cmake_dir in checkouts:
        defs = {**base, "CMAKE_TOOLCHAIN_FILE": str(cmake_dir / "arm-none-eabi-gcc.cmake")}
        key_cmake = cmake_dir / "executorch-runtime" / "key.cmake"
        keys.append(_key(tmp_path, defs, key_cmake))
        texts.append(_key_text(tmp_path, defs, key_cmake))
    assert keys[0] == keys[1]
    assert texts[0] == texts[1]
    for cmake_dir, text in zip(checkouts, texts, strict=True):
        assert str(cmake_dir.parents[1]) not in text, text
        assert "checkout-" not in text, text
    toolchain_lines = [line for line in texts[0].splitlines() if line.startswith("toolchain=")]
    assert toolchain_lines and toolchain_lines[0].startswith("toolchain=arm-none-eabi-gcc.cmake ")
    # Another toolchain file's content: another key, wherever it is.
    edited = checkouts[1] / "arm-none-eabi-gcc.cmake"
    edited.write_text(edited.read_text() + "# edited\n")
    other = _key(tmp_path, {**base, "CMAKE_TOOLCHAIN_FILE": str(edited)},
                 checkouts[1] / "executorch-runtime" / "key.cmake")
    assert other[0] != keys[0][0]


@requires_cmake
@pytest.mark.timeout(60)
def test_the_copied_project_files_are_the_hashed_ones(tmp_path):
    """configure.cmake configures a runtime directory from copies of the files
    dk_et_runtime_project_files() lists (key.cmake hashes the same list): every file the
    runtime project includes is among them."""
    probe = tmp_path / "probe-files.cmake"
    probe.write_text(f'include("{KEY_CMAKE}")\n'
                     "dk_et_runtime_project_files(_files)\n"
                     'message("FILES=${_files}")\n')
    proc = subprocess.run(["cmake", "-P", str(probe)], capture_output=True, text=True,
                          check=True, timeout=60)
    names = {Path(f).name for f in re.search(r"FILES=(.*)", proc.stderr).group(1).split(";")}
    assert names == {p.name for p in KEY_CMAKE.parent.iterdir() if p.is_file()}, names
    runtime = (KEY_CMAKE.parent / "configure.cmake").read_text()
    assert "-S ${_rt}/project" in runtime
    assert "-DCMAKE_TOOLCHAIN_FILE=${_rt}/project/toolchain/" in runtime


@requires_cmake
def test_model_side_options_share_the_runtime(tmp_path):
    """Kernel registry size, primitive operators and the lean libc are compiled with the model:
    builds that differ only there share one runtime directory."""
    base = _inputs(tmp_path)
    key, _ = _key(tmp_path, base)
    for var in MODEL_SIDE_OPTIONS:
        flipped = {"ON": "OFF", "OFF": "ON"}.get(base[var], "other")
        assert _key(tmp_path, {**base, var: flipped})[0] == key, var


@requires_sources
def test_only_the_models_primitive_operators_are_selected(tmp_path):
    """A model's primitive operators (sym_size, et_view, ...) are listed in its operator list;
    with DK_ET_MODEL_PRIM_OPS the registration compiles register_prim_ops.cpp with ExecuTorch's
    prim-ops selective build and exactly those."""
    import sys

    from deploykit.readers.sources import load_workspace

    et = load_workspace().executorch_dir
    ops = tmp_path / "ops.yaml"
    ops.write_text("operators:\n  executorch_prim::et_view.default: {}\n"
                   "  aten::_local_scalar_dense: {}\n  aten::relu.out: {}\n")
    header = tmp_path / "prim" / "selected_prim_ops.h"
    subprocess.run([sys.executable, str(repo_root() / "cmake/executorch_select_kernels.py"),
                    f"--ops-yaml={ops}", f"--executorch-root={et}",
                    f"--output={tmp_path / 'sel.cmake'}",
                    f"--selected-prim-ops-header={header}"], check=True)
    sel = (tmp_path / "sel.cmake").read_text()
    assert 'set(DK_SEL_PORTABLE_OPS "aten::relu.out")' in sel
    assert ('set(DK_SEL_MODEL_PRIM_OPS "aten::_local_scalar_dense;'
            'executorch_prim::et_view.default")') in sel
    assert "set(DK_SEL_MODEL_MAX_KERNEL_NUM 3)" in sel  # relu + 2 prim ops
    assert "set(DK_SEL_MAX_KERNEL_NUM 29)" in sel  # relu + all 28
    text = header.read_text()
    assert "#define EXECUTORCH_ENABLE_PRIM_OPS_SELECTIVE_BUILD" in text
    # The macros are register_prim_ops.cpp's own (upstream's name normalisation would give
    # INCLUDE_ATEN__LOCAL_SCALAR_DENSE here).
    assert "#define INCLUDE_ATEN_LOCAL_SCALAR_DENSE\n" in text
    assert "#define INCLUDE_EXECUTORCH_PRIM_ET_VIEW_DEFAULT\n" in text
    source = (et / "kernels/prim_ops/register_prim_ops.cpp").read_text()
    for macro in re.findall(r"#define (INCLUDE_\w+)", text):
        assert f"defined({macro})" in source


@requires_cmake
def test_ethos_u_options_are_in_the_key(tmp_path):
    """The NPU half of the runtime (DK_ETHOS_U) keys on the driver, CMSIS, its commit and the
    NPU configuration; DK_ETHOS_U=OFF leaves the CPU-only key as it was."""
    base = _inputs(tmp_path)
    key, label = _key(tmp_path, base)
    assert _key(tmp_path, {**base, "DK_ETHOS_U": "OFF", "DK_ETHOS_U_NPU_CONFIG": "x"}) == (
        key, label)
    npu = {**base, "DK_ETHOS_U": "ON", "DK_ETHOS_U_NPU_CONFIG": "ethos-u85-256",
           "DK_ETHOS_U_DRIVER_DIR": "/ws/ethos-u/core_driver", "DK_CMSIS_DIR": "/ws/cmsis_6",
           "DK_ETHOS_U_DRIVER_COMMIT": "03567073"}
    npu_key, npu_label = _key(tmp_path, npu)
    assert npu_key != key and npu_label == "et1.4.1-cortex-m33-ethos-u85-256"
    seen = {key, npu_key}
    for var, value in (("DK_ETHOS_U_NPU_CONFIG", "ethos-u85-512"),
                       ("DK_ETHOS_U_DRIVER_DIR", "/other/driver"),
                       ("DK_CMSIS_DIR", "/other/cmsis"), ("DK_ETHOS_U_DRIVER_COMMIT", "26.02")):
        changed, _ = _key(tmp_path, {**npu, var: value})
        assert changed not in seen, var
        seen.add(changed)
