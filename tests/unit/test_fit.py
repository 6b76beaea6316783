"""`deploykit build --fit` without a target: margins, the measurement store (fit.json) and its
key, the measurement loop's retry on a pool the device names, the run checks on a memory
record, and the rendering of fitted pool, stack and heap sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from deploykit.families import get_family
from deploykit.memory import fit as fitting
from deploykit.memory.plan import MemoryPlan, Sizing
from deploykit.pipeline.target import resolve_target
from deploykit.program.inspect import ProgramInfo
from deploykit.readers.boards import load_board
from deploykit.util.errors import MemoryPlanError

PEAKS = {"method_pool": 1752, "temp_pool": 165, "planned_pool": 816, "stack": 1432, "heap": 0}


def _memory(peaks: dict[str, int], capacity: dict[str, int] | None = None):
    capacity = capacity or {k: 65536 for k in peaks}
    return {k: (v, capacity[k]) for k, v in peaks.items()}


def _program(sha: str = "ab" * 32) -> ProgramInfo:
    return ProgramInfo(path=Path("m.pte"), size=100, method="forward", operators=(),
                       delegates=(), planned_buffers=(816,), inputs=(), outputs=(),
                       num_values=10, num_instructions=2, constant_bytes=0, sha256=sha)


def test_margins():
    # pools: peak + peak/16, 16-byte aligned; nothing for an unused pool
    assert fitting.fitted_pool(1752) == 1872 and fitting.fitted_pool(165) == 176
    assert fitting.fitted_pool(0) == 0
    # stack: peak + max(256, peak/8), 16-byte aligned
    assert fitting.fitted_stack(1432) == 1696 and fitting.fitted_stack(4000) == 4512
    assert fitting.fitted_heap(0) == 0 and fitting.fitted_heap(1468) == fitting.fitted_stack(1468)
    # every fitted size is within the run check's 25%, above 1 KiB
    for peak in (1024, 2000, 3000, 10000, 100000):
        assert fitting.fitted_pool(peak) <= 1.25 * peak
        assert fitting.fitted_stack(peak) <= 1.25 * peak + 16


def test_record_from_a_run_and_its_sizing():
    board = load_board("qemu-an505")
    rec = fitting.record_from_run("k1", {"x": 1}, board, "cortex_m_int8", _memory(PEAKS),
                                  {"et_runtime": "abcd", "inputs_sha256": "1234"})
    assert rec.fitted == {"method_pool": 1872, "temp_pool": 176, "stack": 1696, "heap": 0}
    assert rec.measured_with["method_pool"] == 65536 and rec.et_runtime == "abcd"
    assert rec.need == 1752 + 165 + 816 + 1432
    s = rec.sizing()
    assert (s.method_pool, s.temp_pool, s.stack, s.heap, s.source) == (1872, 176, 1696, 0,
                                                                        "fit")
    with pytest.raises(MemoryPlanError, match="no stack"):
        fitting.record_from_run("k", {}, board, "f",
                                {k: v for k, v in _memory(PEAKS).items() if k != "stack"}, {})


def test_store_round_trip_and_keys(tmp_path):
    board = load_board("qemu-an505")
    options = fitting.fit_options(_program(), resolve_target(board), {"DK_ET_LOGGING": "OFF"})
    key = fitting.fit_key(options)
    # the key moves with the .pte, the build options and the CPU flags
    target = resolve_target(board)
    assert fitting.fit_key(fitting.fit_options(_program("cd" * 32), target, {})) != key
    assert fitting.fit_key(fitting.fit_options(_program(), target,
                                               {"DK_ET_LOGGING": "ON"})) != key
    other = dataclasses.replace(board, cpu={**board.cpu, "gcc_flags": ["-mcpu=cortex-m33"]})
    assert fitting.fit_key(fitting.fit_options(_program(), resolve_target(other),
                                               {"DK_ET_LOGGING": "OFF"})) != key
    assert options["firmware_sources"] == fitting.firmware_sources_hash(get_family("mps"))
    mps, rp2350 = get_family("mps"), get_family("rp2350")
    assert fitting.firmware_sources_hash(rp2350) != fitting.firmware_sources_hash(mps)
    assert fitting.load_fit(tmp_path, key) is None
    rec = fitting.record_from_run(key, options, board, "f", _memory(PEAKS), None)
    path = fitting.save_fit(tmp_path, rec)
    assert path == tmp_path / "fit.json"
    assert fitting.load_fit(tmp_path, key) == rec
    assert fitting.load_fit(tmp_path, "other") is None
    assert fitting.stale_fits(tmp_path, _program().sha256, "other") == [rec]
    assert fitting.stale_fits(tmp_path, _program().sha256, key) == []
    # several entries, newest kept
    for i in range(10):
        fitting.save_fit(tmp_path, dataclasses.replace(rec, key=f"k{i}"))
    entries = json.loads(path.read_text())["entries"]
    assert list(entries) == [f"k{i}" for i in range(2, 10)]
    path.write_text("not json")
    assert fitting.load_fit(tmp_path, "k9") is None


def test_measure_doubles_the_pool_the_device_names():
    board = load_board("qemu-an505")
    seen: list[Sizing] = []

    def build_and_run(sizing: Sizing) -> fitting.MeasureAttempt:
        seen.append(sizing)
        if sizing.temp_pool < 1000:
            return fitting.MeasureAttempt(_memory(PEAKS), None, "temp_pool too small",
                                          "temp_pool")
        return fitting.MeasureAttempt(_memory(PEAKS), {"et_runtime": "r"})

    start = Sizing(method_pool=4096, temp_pool=512, source="given")
    rec = fitting.measure(board, _program(), "f", "k", {}, start, build_and_run, lambda m: None)
    assert [s.temp_pool for s in seen] == [512, 1024]
    assert rec.fitted["method_pool"] == 1872

    def failing(sizing: Sizing) -> fitting.MeasureAttempt:
        return fitting.MeasureAttempt({}, None, "The device faulted")

    with pytest.raises(MemoryPlanError, match="measurement run failed: The device faulted"):
        fitting.measure(board, _program(), "f", "k", {}, start, failing, lambda m: None)


def test_measurement_pools_are_generous_but_fit_the_region():
    board = load_board("qemu-an505")
    s = fitting.measurement_sizing(board, _program(), headroom=4 * 1024 * 1024)
    assert s.method_pool >= 64 * 1024 and s.temp_pool >= 64 * 1024 and s.source == "given"
    # little room: the estimates plus at most half the headroom between them
    from deploykit.memory.plan import estimate_pools

    method, temp, _, _ = estimate_pools(_program())
    small = fitting.measurement_sizing(board, _program(), headroom=8 * 1024)
    assert small.method_pool >= method and small.temp_pool >= temp
    assert small.method_pool + small.temp_pool <= method + temp + 4 * 1024 + 32


def test_run_checks():
    fitted = {"method_pool": (1752, 1872), "temp_pool": (165, 176), "planned_pool": (816, 816),
              "stack": (1432, 1696), "heap": (0, 0)}
    assert fitting.check_peaks(fitted) == ([], [])
    failures, warnings = fitting.check_peaks({**fitted, "method_pool": (2000, 1872)})
    assert failures == ["method_pool peak 2,000 B exceeds its 1,872 B"]
    _, warnings = fitting.check_peaks({**fitted, "stack": (2316, 32768), "heap": (0, 16384)})
    assert len(warnings) == 2
    assert warnings[0].startswith("stack is 32,768 B, its peak 2,316 B (14.1x)")
    assert "heap is 16,384 B, its peak 0 B (unused)" in warnings[1]
    # alignment-sized slack is not worth a warning
    assert fitting.check_peaks({"temp_pool": (0, 16)}) == ([], [])


# ---- rendering -----------------------------------------------------------------------------


def test_render_of_pool_sizes(tmp_path):
    import numpy as np

    from deploykit.build.render import ModelSources, render_model_files

    plan = MemoryPlan("qemu-an505", (), (), method_pool=1872, temp_pool=176,
                      planned_buffers=(816,))
    x = np.zeros((1, 4), dtype=np.float32)
    render_model_files(ModelSources(b"pte", [[x]], [x], plan, "0" * 40, "b"), tmp_path)
    text = (tmp_path / "model_config.h").read_text()
    assert "#define DK_METHOD_POOL_SIZE 1872u" in text
    assert "#define DK_TEMP_POOL_SIZE 176u" in text
    assert "#define DK_PLANNED_BUFFER_SIZES { 816u }" in text


def test_render_of_a_fitted_stack_and_heap(tmp_path):
    from deploykit.build.render import render_board_files
    from deploykit.pipeline.chains import _sized_board, _stack_heap_source

    board = load_board("qemu-an505")
    plain = render_board_files(board, tmp_path / "plain")
    plan = MemoryPlan("qemu-an505", (), (), 1872, 176, (816,), stack_size=1696, heap_size=0,
                      peaks={"stack": 1432, "heap": 0})
    sized = _sized_board(board, plan)
    assert (sized.stack_size, sized.heap_size) == (1696, 0)
    assert (board.stack_size, board.heap_size) == (32768, 16384)  # the board is unchanged
    source = _stack_heap_source(board, plan)
    assert "stack peak 1,432 B" in source
    fitted = render_board_files(sized, tmp_path / "fit", source)
    cfg = (tmp_path / "fit" / "board_config.h").read_text()
    assert "#define DK_STACK_SIZE 0x000006A0u" in cfg and "#define DK_HEAP_SIZE 0x00000000u" in cfg
    assert "deploykit build --fit" in cfg
    ld = (tmp_path / "fit" / "memory.ld").read_text()
    assert "__dk_stack_size = 0x000006A0;" in ld and "__dk_heap_size = 0x00000000;" in ld
    # board.cmake has no stack or heap: identical, so the firmware build is not reconfigured
    assert ((tmp_path / "plain" / "board.cmake").read_text()
            == (tmp_path / "fit" / "board.cmake").read_text())
    assert plain.input_hash != fitted.input_hash
    # without a fit, the board file's sizes and a note that says so
    assert _sized_board(board, MemoryPlan("b", (), (), 1, 1, ())) is board
    assert "from the board file" in (tmp_path / "plain" / "board_config.h").read_text()
