"""What the NPU firmware build takes from the board file and the plan: the generated files
(board_config.h, irq_vectors.h, memory.ld, model_config.h) and the CMake definitions."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from deploykit.build.render import render_board_files, render_model_files
from deploykit.memory.plan import MemoryPlan, PlanItem
from deploykit.readers.boards import board_from_dict, load_board
from deploykit.readers.npu import (
    npu_board_facts,
    npu_firmware_definitions,
    npu_placement,
    npu_plan_sizes,
    with_npu_overrides,
)
from deploykit.readers.sources import ProjectState, Workspace
from deploykit.util.errors import ConfigError, EnvironmentProblem
from tests.markers import requires_toolchain
from tests.unit.test_render import _model_sources

REPO = Path(__file__).resolve().parents[2]


def _npu_plan(board_name: str, mode: str) -> MemoryPlan:
    """A plan as plan_memory makes it for an Ethos-U program in `mode` (items and regions)."""
    scratch_region = "ddr" if mode.startswith("Dedicated") else "sram"
    items = [PlanItem("model (.pte constant data)", "model", 3_500_000, "pte",
                      "sram" if mode == "Sram_Only" else "ddr"),
             PlanItem("planned buffer 1", "pools", 752_640, "pte", "ddr"),
             PlanItem(f"Ethos-U scratch ({mode}, largest of 1 delegate)", "npu_scratch",
                      1_510_224, "pte", scratch_region)]
    if mode.startswith("Dedicated"):
        items.append(PlanItem(f"Ethos-U fast scratch ({mode})", "npu_scratch", 384 * 1024,
                              "board", "sram"))
    items += [PlanItem("method pool", "pools", 2048, "estimate", "ddr"),
              PlanItem("temp pool", "pools", 160, "estimate", scratch_region)]
    return MemoryPlan(board_name, tuple(items), (), 2048, 160, (752_640,))


def test_board_facts_pick_the_alias_of_the_firmwares_security_state():
    c300 = load_board("corstone-300")
    facts = npu_board_facts(c300)
    assert facts == {"type": "ethos-u55", "macs": 128, "target": "ethos-u55-128",
                     "base": 0x58102000, "irq": 56, "security": "secure",
                     "secure_enable": True, "privilege_enable": True}
    raw = {**c300.raw, "cpu": {**c300.raw["cpu"], "security": "non-secure"}}
    raw["npu"] = {k: v for k, v in raw["npu"].items() if k != "secure_enable"}
    ns = board_from_dict(raw, c300.path)
    assert npu_board_facts(ns)["base"] == 0x48102000
    assert npu_board_facts(ns)["secure_enable"] is False
    raw["npu"] = {k: v for k, v in raw["npu"].items() if k != "ns_base"}
    with pytest.raises(ConfigError, match="ns_base"):
        npu_board_facts(board_from_dict(raw, c300.path))
    assert npu_board_facts(load_board("qemu-an547")) is None


def test_generated_board_files_of_an_npu_board(tmp_path):
    render_board_files(load_board("corstone-320"), tmp_path)
    cfg = (tmp_path / "board_config.h").read_text()
    for line in ('#define DK_NPU_TARGET "ethos-u85-256"', "#define DK_NPU_ETHOS_U85 1",
                 "#define DK_NPU_BASE 0x50004000u", "#define DK_NPU_IRQ 16u",
                 "#define DK_NPU_SECURE_ENABLE 1u", "#define DK_NPU_PRIVILEGE_ENABLE 1u",
                 "#define DK_CPU_CACHES 1"):
        assert line in cfg
    vectors = (tmp_path / "irq_vectors.h").read_text()
    assert "#define DK_NPU_VECTOR_SLOT (DK_NUM_SYSTEM_VECTORS + 16)" in vectors
    assert "[DK_NPU_VECTOR_SLOT] = {.handler = dk_npu_irq_handler}" in vectors
    # without a plan the NPU blocks follow the pools; the model the board's placement
    ld = (tmp_path / "memory.ld").read_text()
    assert 'REGION_ALIAS("DK_NPU_SCRATCH", "ddr");' in ld
    assert 'REGION_ALIAS("DK_MODEL", "ddr");' in ld
    # a CPU-only board: every IRQ slot through dk_irq_entry, no NPU facts
    render_board_files(load_board("qemu-an547"), tmp_path / "cpu")
    assert "dk_npu_irq_handler" not in (tmp_path / "cpu" / "irq_vectors.h").read_text()
    assert "DK_NPU_BASE" not in (tmp_path / "cpu" / "board_config.h").read_text()


@pytest.mark.parametrize("mode,model,scratch,fast", [
    ("Shared_Sram", "ddr", "sram", "sram"),
    ("Sram_Only", "sram", "sram", "sram"),
    ("Dedicated_Sram_384KB", "ddr", "ddr", "sram"),
])
def test_the_plan_places_model_scratch_and_arena(tmp_path, mode, model, scratch, fast):
    board = with_npu_overrides(load_board("corstone-320"), memory_mode=mode)
    plan = _npu_plan("corstone-320", mode)
    assert npu_placement(plan) == {"model": model, "npu_scratch": scratch, "npu_fast": fast}
    render_board_files(board, tmp_path, plan=plan)
    ld = (tmp_path / "memory.ld").read_text()
    assert f'REGION_ALIAS("DK_MODEL", "{model}");' in ld
    assert f'REGION_ALIAS("DK_NPU_SCRATCH", "{scratch}");' in ld
    assert f'REGION_ALIAS("DK_NPU_FAST", "{fast}");' in ld
    src = _model_sources()
    render_model_files(dataclasses.replace(src, plan=plan), tmp_path)
    cfg = (tmp_path / "model_config.h").read_text()
    fast_size = 384 * 1024 if mode.startswith("Dedicated") else 0
    assert npu_plan_sizes(plan) == (1_510_224, fast_size)
    assert "#define DK_NPU_SCRATCH_SIZE 1510224u" in cfg
    assert f"#define DK_NPU_FAST_SCRATCH_SIZE {fast_size}u" in cfg


def _workspace(tmp_path: Path, *names: str) -> Workspace:
    projects = {}
    for name in ("executorch", *names):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        projects[name] = ProjectState(name, name, f"{name}-commit", "override:x")
    return Workspace(tmp_path, projects)


def test_cmake_definitions_of_an_npu_build(tmp_path):
    board = load_board("corstone-320")
    plan = _npu_plan("corstone-320", "Shared_Sram")
    ws = _workspace(tmp_path, "ethos-u-core-driver", "cmsis")
    assert npu_firmware_definitions(board, ws, plan) == {
        "DK_ETHOS_U": "ON",
        "DK_ETHOS_U_DRIVER_DIR": str(tmp_path / "ethos-u-core-driver"),
        "DK_CMSIS_DIR": str(tmp_path / "cmsis"),
        "DK_ETHOS_U_NPU_CONFIG": "ethos-u85-256",
        "DK_ETHOS_U_DRIVER_COMMIT": "ethos-u-core-driver-commit",
    }
    macs = with_npu_overrides(board, macs=512)
    assert npu_firmware_definitions(macs, ws, plan)["DK_ETHOS_U_NPU_CONFIG"] == "ethos-u85-512"
    # nothing to add: a CPU-only plan, or a board without an NPU
    cpu_plan = MemoryPlan("corstone-320", (), (), 1, 1, ())
    assert npu_firmware_definitions(board, ws, cpu_plan) == {}
    assert npu_firmware_definitions(load_board("qemu-an547"), ws, plan) == {}
    # the sources missing: how to add them
    with pytest.raises(EnvironmentProblem) as exc:
        npu_firmware_definitions(board, _workspace(tmp_path / "bare"), plan)
    assert "ethos-u-core-driver, cmsis" in exc.value.cause
    assert "--source ethos-u-core-driver=PATH@26.02" in exc.value.hint


@requires_toolchain
@pytest.mark.parametrize("board_name", ["corstone-300", "corstone-320", "qemu-an547"])
def test_generated_vector_table_compiles_warning_free(tmp_path, board_name):
    """The family's vectors.c with the generated irq_vectors.h, -Wall -Wextra -Werror; the NPU
    slot holds dk_npu_irq_handler (vectors.c's weak stand-in when nothing else defines it)."""
    board = load_board(board_name)
    render_board_files(board, tmp_path)
    mps = REPO / "firmware" / "boards" / "mps"
    obj = tmp_path / "vectors.o"
    subprocess.run(["arm-none-eabi-gcc", *board.cpu_flags, "-std=c11", "-Wall", "-Wextra",
                    "-Werror", "-I", str(tmp_path), "-I", str(mps), "-I",
                    str(REPO / "firmware" / "boards"), "-c", str(mps / "vectors.c"), "-o",
                    str(obj)], check=True)
    relocs = subprocess.run(["arm-none-eabi-objdump", "-r", "-j", ".vectors", str(obj)],
                            check=True, capture_output=True, text=True).stdout
    npu = npu_board_facts(board)
    slot = [line.split() for line in relocs.splitlines() if "dk_npu_irq_handler" in line]
    if npu is None:
        assert not slot
    else:
        assert [int(s[0], 16) for s in slot] == [(16 + npu["irq"]) * 4]
