"""The memory planner on real `.pte` files from the export paths: the Method::load model with
hand-checked numbers for a small model, the plan's items and regions, the CMSIS-NN scratch,
the fit check refusing a board whose pools region is too small (naming the region, with a
suggestion), a plan sized from a measurement, and `deploykit plan --pte`.

Exports mlp_mnist (fp32) and tiny_cnn (int8, cortex_m) for real (a few seconds each). The
Ethos-U export path's plan is tested in test_corstone.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deploykit.memory.plan import Sizing, plan_memory, with_estimate_margin
from deploykit.readers.boards import load_board
from deploykit.util.errors import ExitCode, MemoryPlanError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mlp_fp32(tmp_path_factory):
    from deploykit import api

    out = tmp_path_factory.mktemp("mlp-fp32")
    return api.export("qemu-an505", "mlp_mnist", flow="portable_fp32", out=out)


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    from deploykit import api

    out = tmp_path_factory.mktemp("tiny-int8")
    return api.export("qemu-an547", "tiny_cnn", flow="cortex_m_int8", out=out)


def _program(export):
    from deploykit.program.inspect import inspect_pte

    return inspect_pte(export.pte_path)


def test_method_load_of_the_mlp_by_hand(mlp_fp32):
    """mlp_mnist, fp32, weight transposes folded at export: 18 values (12 tensors: three 1-D,
    nine 2-D; 6 ints), one chain of 5 kernel calls (addmm 7 args, relu 3, addmm 7, relu 3,
    addmm 7). Method::init's allocations on 32-bit Arm:

        values_      18 x EValue 16 B                               288
        input_set_   1 bool                                         289
        tensors      align 4 (3 B), 3 x (strides 4 + TensorImpl 32)
                     + 9 x (strides 8 + TensorImpl 32)    292 + 468 = 760
        chains_      1 x Chain 16 B                                 776
        chain        5 x OpFunction 4 B + 5 x Span 8 B              836
        arg lists    (7 + 3 + 7 + 3 + 7) x EValue* 4 B              944

    Temp at load: the largest call, addmm: 7 x TensorMeta 12 B = 84, plus its tensor
    arguments' dim orders 1 + 2 + 2 + 2 + 2 = 9: 93 B. The firmware's counting allocators
    measured exactly 944 and 93 on QEMU (docs/memory.md)."""
    p = _program(mlp_fp32)
    assert (p.num_values, p.num_instructions) == (18, 5)
    load = p.method_load
    assert load.method_bytes == 944
    assert load.breakdown == {"values": 289, "tensors": 471, "delegates": 0, "instructions": 184}
    assert load.temp_load_bytes == 93 and load.temp_kernel_bytes == 0
    assert load.cmsis_scratch == ()
    assert p.planned_buffers == (256,)  # [1,32] + [1,16] + [1,10] floats, reused by the planner


def test_plan_of_the_mlp(mlp_fp32):
    board = load_board("qemu-an505")
    p = _program(mlp_fp32)
    plan = plan_memory(board, p)
    # Estimates: modelled need + 1/16 + 64 B, 16-byte aligned.
    assert with_estimate_margin(944) == 1072 and with_estimate_margin(93) == 176
    assert (plan.method_pool, plan.temp_pool, plan.planned_buffers) == (1072, 176, (256,))
    items = {i.name: i for i in plan.items}
    assert items["model (.pte constant data)"].size == p.size
    assert items["model (.pte constant data)"].region == "code"
    assert items["method pool"].source == "estimate" and "944 B" in items["method pool"].detail
    assert items["stack"].size == 32 * 1024 and items["stack"].source == "board"
    assert {i.region for n, i in items.items() if n != "model (.pte constant data)"} == {"ram"}
    ram = next(r for r in plan.regions if r.region == "ram")
    assert ram.used == 256 + 1072 + 176 + 32 * 1024 + 16 * 1024
    assert ram.capacity == 4 * 1024 * 1024 and ram.headroom == ram.capacity - ram.used
    assert plan.fits and plan.stack_size is None and plan.heap_size is None
    j = json.loads(json.dumps(plan.to_json()))
    assert j["estimates"] == {"method_pool": 1072, "temp_pool": 176}
    assert j["pte"]["sha256"] == p.sha256 and j["fits"] is True
    assert {r["region"] for r in j["regions"]} == {"code", "ram"}
    text = plan.table()
    assert "method pool" in text and "headroom" in text and "estimate" in text


def test_cmsis_nn_scratch_is_reported_inside_the_planned_buffer(tiny_int8):
    p = _program(tiny_int8)
    uses = p.method_load.cmsis_scratch
    # two convolutions and the average pool take a memory-planned scratch tensor
    assert [u.op for u in uses] == ["cortex_m::quantized_conv2d", "cortex_m::quantized_conv2d",
                                    "cortex_m::quantized_avg_pool2d"]
    assert {u.memory_id for u in uses} == {1}
    assert max(u.nbytes for u in uses) <= p.planned_buffers[0]
    plan = plan_memory(load_board("qemu-an547"), p)
    item = plan.item("CMSIS-NN scratch")
    assert item.size == 0 and item.kind == "info" and item.region == "isram"
    assert "inside planned buffer 1" in item.detail and "not in the temp pool" in item.detail
    isram = next(r for r in plan.regions if r.region == "isram")
    assert isram.used == plan.method_pool + plan.temp_pool + sum(plan.planned_buffers)


def _board_copy(tmp_path: Path, name: str, **sizes: str) -> Path:
    """A copy of a board file with some regions resized (same name: the file's stem)."""
    data = yaml.safe_load((REPO / "boards" / f"{name}.yaml").read_text())
    for region in data["memory"]:
        if region["name"] in sizes:
            region["size"] = sizes[region["name"]]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_fit_check_refuses_a_tiny_pools_region_naming_it(mlp_fp32, tmp_path):
    board = load_board(_board_copy(tmp_path, "qemu-an547", isram="1K"))
    with pytest.raises(MemoryPlanError) as exc:
        plan_memory(board, _program(mlp_fp32))
    err = exc.value
    assert err.exit_code == ExitCode.MEMORY
    # pools: planned 256 + method 1,072 + temp 176 = 1,504 B in a 1,024 B region
    assert "region 'isram' needs 1,504 B but has 1,024 B (480 B over)" in err.cause
    assert "OVER" in err.cause and "method pool" in err.cause
    # a concrete suggestion: the ddr region holds pools and has room
    assert "move pools (1,504 B) to region 'ddr'" in err.hint
    assert "placement.pools: ddr" in err.hint and "deploykit build --fit" in err.hint
    assert err.plan.fits is False


def test_fit_check_names_the_stack_region_and_suggests_fit(mlp_fp32, tmp_path):
    board = load_board(_board_copy(tmp_path, "qemu-an547", dtcm="40K"))
    with pytest.raises(MemoryPlanError) as exc:
        plan_memory(board, _program(mlp_fp32))
    assert "region 'dtcm'" in exc.value.cause
    assert "stack (32,768 B, board)" in exc.value.hint and "--fit" in exc.value.hint
    assert "--flow cortex_m_int8" in exc.value.hint  # an fp32 model


def test_plan_from_a_measurement(mlp_fp32):
    board = load_board("qemu-an505")
    sizing = Sizing(method_pool=1008, temp_pool=112, stack=1696, heap=0, source="fit",
                    peaks={"method_pool": 944, "temp_pool": 93, "stack": 1432, "heap": 0})
    plan = plan_memory(board, _program(mlp_fp32), sizing=sizing)
    items = {i.name: i for i in plan.items}
    assert (plan.method_pool, plan.temp_pool) == (1008, 112)
    assert (plan.stack_size, plan.heap_size) == (1696, 0)
    assert items["method pool"].source == "fit"
    assert "peak 944 B + margin (estimate was 1,072 B)" in items["method pool"].detail
    assert "board file: 32,768 B" in items["stack"].detail
    assert plan.peaks["stack"] == 1432
    ram = next(r for r in plan.regions if r.region == "ram")
    assert ram.used == 256 + 1008 + 112 + 1696 + 0


def test_plan_command_on_a_pte(mlp_fp32, tmp_path, capsys):
    from deploykit.cli import main

    out = tmp_path / "out"
    assert main(["plan", "--board", "qemu-an505", "--pte", str(mlp_fp32.pte_path),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "memory plan of" in text and "method pool" in text
    saved = json.loads((out / "plan.json").read_text())
    assert saved["fits"] and saved["method_pool"] == 1072
    # too small: exit code 6, the table and the suggestion on stderr, plan.json says why
    small = _board_copy(tmp_path, "qemu-an547", isram="1K")
    assert main(["plan", "--board", str(small), "--pte", str(mlp_fp32.pte_path),
                 "--out", str(out)]) == int(ExitCode.MEMORY)
    err = capsys.readouterr().err
    assert "region 'isram'" in err and "placement.pools: ddr" in err
    assert json.loads((out / "plan.json").read_text())["fits"] is False
    # a model and a .pte at once is a usage error
    assert main(["plan", "--board", "qemu-an505", "--model", "mlp_mnist", "--pte",
                 str(mlp_fp32.pte_path)]) == int(ExitCode.CONFIG)
