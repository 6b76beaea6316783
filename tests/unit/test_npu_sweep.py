"""`deploykit npu-sweep` without Vela: its points, the Pareto front, the choice, its outputs,
Vela's per-layer report as read, and bad settings at the command line. The sweep with Vela
running is tests/integration/test_npu_estimates.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit.flows.vela import parse_per_layer, parse_summary
from deploykit.pipeline.npu_sweep import (
    SweepPoint,
    SweepResult,
    SweepRow,
    build_command,
    chart,
    choose,
    mark_pareto,
    markdown,
    sweep_points,
    table,
    write_outputs,
)
from deploykit.readers.boards import load_board
from deploykit.util.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# Vela 5.1's --verbose-performance CSV (a small TOSA graph, ethos-u85-256), as it writes it.
PER_LAYER_CSV = """\
Original Operator,NNG Operator,Target,Staging Usage,Peak% (Staging),Op Cycles,Network% (cycles),\
NPU,SRAM AC,DRAM AC,OnFlash AC,OffFlash AC,MAC Count,Network% (MAC),Util% (MAC),Name
Transpose,Transpose,NPU,1216,59.375,758,26.67,758,56,0,0,0,192,0.21,0.09894459102902374,\
tosa_transpose_default
Conv2D,Conv2D,NPU,2048,100.0,808,28.43,808,64,449,0,0,73728,82.66,35.64356435643565,\
tosa_rescale_default_1
Conv2D,Conv2D,NPU,32,1.5625,390,13.72,388,1,390,0,0,160,0.17,0.16025641025641027,\
tosa_reshape_default
Reshape,Reshape,CPU,0,0,0,0,0,0,0,0,0,0,0,NaN,cpu_op
"""


def test_vela_per_layer_report_is_read_with_the_bound_of_each_operator():
    layers = parse_per_layer(PER_LAYER_CSV, {"tosa_rescale_default_1": "conv1 (Conv2d)"})
    assert [(x["op"], x["cycles"], x["bound"]) for x in layers] == [
        ("Transpose", 758, "compute"), ("Conv2D", 808, "compute"), ("Conv2D", 390, "DRAM")]
    conv = layers[1]
    assert conv["model_line"] == "conv1 (Conv2d)" and layers[0]["model_line"] is None
    assert conv["macs"] == 73728 and conv["mac_utilisation"] == pytest.approx(0.3564, abs=1e-4)
    assert (conv["npu_cycles"], conv["sram_cycles"], conv["dram_cycles"]) == (808, 64, 449)


def test_vela_summary_labels_are_read_first_line_first():
    text = ("Total SRAM bandwidth\nTotal   SRAM bandwidth                           0.25 MB/batch\n"
            "Total   SRAM bandwidth            per input      0.99 MB/inference\n"
            "Total cycles                                     1234 cycles/batch\n"
            "Accelerator clock                                1000 MHz\n"
            "Total   Off-chip Flash bandwidth                 0.03 MB/batch\n")
    assert parse_summary(text) == {"sram_mb": 0.25, "total_cycles": 1234, "clock_mhz": 1000,
                                   "off_chip_flash_mb": 0.03}


def test_the_board_files_list_their_system_configs_and_the_seeds_default():
    u85 = load_board("corstone-320").npu
    assert (u85.target, u85.system_config, u85.memory_mode) == (
        "ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Shared_Sram")
    assert u85.system_configs[0] == "Ethos_U85_SYS_DRAM_Mid" and len(u85.system_configs) == 3
    u55 = load_board("corstone-300").npu
    assert u55.system_configs[0] == u55.system_config == "Ethos_U55_High_End_Embedded"


def test_the_points_are_the_family_macs_times_the_boards_modes_and_configs():
    npu = load_board("corstone-320").npu
    points = sweep_points(npu)
    assert len(points) == 5 * len(npu.memory_modes) * len(npu.system_configs)
    assert {p.macs for p in points} == {128, 256, 512, 1024, 2048}
    narrowed = sweep_points(npu, [512, 128], ["Sram_Only"], ["Ethos_U85_SYS_DRAM_Mid"])
    assert [p.name for p in narrowed] == ["ethos-u85-512 Sram_Only Ethos_U85_SYS_DRAM_Mid",
                                          "ethos-u85-128 Sram_Only Ethos_U85_SYS_DRAM_Mid"]
    u55 = load_board("corstone-300").npu
    with pytest.raises(ConfigError, match="--macs 512 is not a MAC configuration of the "
                       "ethos-u55"):
        sweep_points(u55, [512])
    with pytest.raises(ConfigError, match="Dedicated_Sram_384KB is not one of the board's"):
        sweep_points(u55, memory_modes=["Dedicated_Sram_384KB"])
    with pytest.raises(ConfigError, match="Ethos_U85_SYS_DRAM_Mid is not one of the board's "
                       "system configurations"):
        sweep_points(u55, system_configs=["Ethos_U85_SYS_DRAM_Mid"])


def _row(macs: int, mode: str, latency: float | None, sram: int | None,
         result: str = "fits", config: str = "Ethos_U85_SYS_DRAM_Mid") -> SweepRow:
    return SweepRow(f"ethos-u85-{macs}", macs, mode, config, result=result,
                    reason="" if result == "fits" else "region 'sram' needs more",
                    cycles=None if latency is None else int(latency * 1e6),
                    clock_mhz=1000.0, latency_ms=latency, mac_utilisation=0.2, sram_mb=0.3,
                    dram_mb=0.1, arena=sram, fast_scratch=0, sram_needed=sram,
                    sram_region="sram", sram_capacity=4 << 20, vela_seconds=0.5)


def sweep_rows() -> list[SweepRow]:
    return [_row(128, "Shared_Sram", 0.090, 20_000), _row(128, "Sram_Only", 0.060, 50_000),
            _row(256, "Shared_Sram", 0.050, 22_000), _row(256, "Sram_Only", 0.040, 49_000),
            _row(512, "Shared_Sram", 0.035, 30_000),
            _row(2048, "Sram_Only", 0.010, 9_000_000, result="does not fit")]


def test_the_pareto_front_is_of_the_fitting_points():
    rows = sweep_rows()
    mark_pareto(rows)
    front = {(r.macs, r.memory_mode) for r in rows if r.pareto}
    # The Sram_Only points are beaten by 512 Shared_Sram (faster, less SRAM); the point that
    # does not fit is on no front, however fast.
    assert front == {(128, "Shared_Sram"), (256, "Shared_Sram"), (512, "Shared_Sram")}


def test_the_choice_is_the_fastest_fit_or_the_least_sram_meeting_the_target():
    rows = sweep_rows()
    default = SweepPoint("ethos-u85", 256, "Shared_Sram", "Ethos_U85_SYS_DRAM_Mid")
    best, why = choose(rows, None, default)
    assert (best.macs, best.memory_mode) == (512, "Shared_Sram")
    assert why == "the fastest point that fits"
    best, why = choose(rows, 0.055, default)
    assert (best.macs, best.memory_mode) == (256, "Shared_Sram") and "least SRAM" in why
    best, why = choose(rows, 0.001, default)
    assert best is None and "no fitting point meets 0.001 ms" in why
    best, why = choose([r for r in rows if r.result != "fits"], None, default)
    assert best is None and why.startswith("no point fits the board's memory: ")
    assert "region 'sram' needs more" in why


def test_the_build_command_names_only_what_differs_from_the_board():
    board = load_board("corstone-320")
    assert build_command(board, "ds_cnn", _row(256, "Shared_Sram", 0.05, 1)) == (
        "deploykit build --board corstone-320 --model ds_cnn")
    assert build_command(board, "ds_cnn", _row(512, "Sram_Only", 0.05, 1)) == (
        "deploykit build --board corstone-320 --model ds_cnn --npu-macs 512 "
        "--npu-memory-mode Sram_Only")
    other = build_command(board, "ds_cnn", _row(256, "Shared_Sram", 0.05, 1,
                                                config="Ethos_U85_SYS_DRAM_High"))
    assert "npu.vela.system_config: Ethos_U85_SYS_DRAM_High" in other


def sweep_result() -> SweepResult:
    rows = sweep_rows()
    mark_pareto(rows)
    default = SweepPoint("ethos-u85", 256, "Shared_Sram", "Ethos_U85_SYS_DRAM_Mid")
    chosen, why = choose(rows, 0.055, default)
    chosen.chosen = True
    board = load_board("corstone-320")
    return SweepResult("corstone-320", "ds_cnn", rows, chosen, why,
                       build_command(board, "ds_cnn", chosen), 0.055, Path("export"))


def sweep_chart():
    return chart(sweep_result())


def test_the_table_markdown_json_and_chart_carry_every_point(tmp_path):
    result = sweep_result()
    text = table(result)
    assert text.count("ethos-u85-") >= 6 and "* chosen" in text
    assert "ethos-u85-2048 Sram_Only Ethos_U85_SYS_DRAM_Mid: does not fit: region 'sram'" in text
    assert text.splitlines()[-1] == (
        "build it: deploykit build --board corstone-320 --model ds_cnn")
    md = markdown(result)
    assert md.count("\n| ethos-u85-") == 6 and "Vela's estimates" in md
    paths = write_outputs(result, tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert [r["pareto"] for r in saved["rows"]] == [r.pareto for r in result.rows]
    assert saved["chosen"]["macs"] == 256 and saved["latency_target_ms"] == 0.055
    latency, sram = sweep_chart().panels
    # The region size is drawn: the point that does not fit reaches past it.
    assert latency.goal == 0.055 and sram.goal == 4 << 20
    assert sum(g.bars[0].marked for g in latency.groups) == 3
    missing = [g.bars[0] for g in latency.groups if g.bars[0].value is None]
    assert missing == []  # the point that does not fit still has its latency
    assert "region sram: 4,096.0 KiB" in sram.title
    before = paths["svg"].read_bytes()
    write_outputs(result, tmp_path)
    assert paths["svg"].read_bytes() == before  # reproducible


def test_bad_settings_at_the_command_line_are_errors_without_a_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tools"))
    run = subprocess.run(
        [sys.executable, "-m", "deploykit", "--no-project", "npu-sweep", "--board",
         "corstone-320", "--model", "ds_cnn", "--macs", "96", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=env)
    assert run.returncode == 3, run.stderr
    assert "--macs 96 is not a MAC configuration of the ethos-u85" in run.stderr
    assert "Traceback" not in run.stderr
