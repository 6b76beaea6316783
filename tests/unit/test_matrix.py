"""The matrix's filter, its outputs (table, Markdown, JSON, SVG) and its CLI errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from deploykit.cli import main
from deploykit.pipeline.matrix import (
    MatrixRow,
    chart,
    combinations,
    markdown,
    svg,
    table,
    to_json,
)
from deploykit.util.errors import ConfigError, ExitCode


def test_combinations_keep_each_boards_allowed_flows():
    combos = combinations(
        ["qemu-an505", "corstone-320"], ["ds_cnn"], ["cortex_m_int8", "ethos_u_int8"], ["speed"]
    )
    flows = {(c.board, c.flow) for c in combos}
    assert ("qemu-an505", "ethos_u_int8") not in flows  # no NPU on the MPS2 board
    assert ("corstone-320", "ethos_u_int8") in flows
    assert ("qemu-an505", "cortex_m_int8") in flows


def test_combinations_empty_filter_is_a_config_error():
    with pytest.raises(ConfigError, match="no combination"):
        combinations(["qemu-an505"], ["ds_cnn"], ["ethos_u_int8"], ["speed"])


def test_patch_settings_are_a_dimension_where_the_flow_can_tile():
    combos = combinations(["corstone-320"], ["mobilenet_v1_025"],
                          ["cortex_m_int8", "ethos_u_int8"], ["speed"], ["off", "auto"])
    got = {(c.flow, c.patches) for c in combos}
    # Vela plans the NPU's memory itself: the Ethos-U flow has no tiles, so no `auto` row.
    assert got == {("cortex_m_int8", "off"), ("cortex_m_int8", "auto"), ("ethos_u_int8", "off")}
    assert {c.name for c in combos if c.flow == "cortex_m_int8"} == {
        "corstone-320/mobilenet_v1_025/cortex_m_int8/speed/patches=off",
        "corstone-320/mobilenet_v1_025/cortex_m_int8/speed/patches=auto"}
    with pytest.raises(ConfigError, match="no combination"):
        combinations(["corstone-320"], ["ds_cnn"], ["ethos_u_int8"], ["speed"], ["1x4"])


def _rows() -> list[MatrixRow]:
    ok = MatrixRow(
        "qemu-an547",
        "ds_cnn",
        "cortex_m_int8",
        "speed",
        result="PASS",
        flash=83_240,
        ram_linked=82_000,
        ram_need=34_000,
        instructions=1_777_265.0,
        macs=2_656_768,
        activation_planned=20_464,
        activation_lower_bound=20_464,
    )
    too_big = MatrixRow(
        "pico2-uart",
        "mobilenet_v2",
        "cortex_m_int8",
        "speed",
        result="MEMORY",
        reason="region RAM overflows by 1,234 B\nmore",
    )
    island = MatrixRow(
        "qemu-an505",
        "kws1d",
        "cortex_m_int8",
        "speed",
        result="PASS",
        instructions=900.0,
        macs=300,
        fallback_ops=["aten::convolution.out"],
        float_islands=["float island at instructions 1-3: ..."],
    )
    return [ok, too_big, island]


def _tiled_rows() -> list[MatrixRow]:
    def row(patches: str, tiles: str, planned: int, instructions: float) -> MatrixRow:
        return MatrixRow("qemu-an547", "mobilenet_v1_025", "cortex_m_int8", "speed", patches,
                         result="PASS", instructions=instructions, macs=7_489_664,
                         activation_planned=planned, activation_lower_bound=18_432,
                         tiles=tiles)

    return [row("off", "off", 55_296, 6_293_236.0),
            row("auto", "1x6 up to relu_7, carried", 23_232, 6_662_679.0)]


def test_rows_with_and_without_tiles_side_by_side():
    rows = _tiled_rows()
    text = table(rows)
    header, off, tiled = text.splitlines()
    assert "patches" in header.split()
    assert "1x6 up to relu_7, carried" in tiled and "3.00" in off  # 55,296 / 18,432
    assert "1.26" in tiled  # 23,232 / 18,432: the planned activations against the bound
    per_mac, _ram = chart(rows).panels
    assert [b.series for g in per_mac.groups for b in g.bars] == ["patches off",
                                                                  "patches auto"]
    assert to_json(rows)["rows"][1]["tiles"] == "1x6 up to relu_7, carried"


def test_outputs_carry_every_row_and_the_reasons():
    rows = _rows()
    text = table(rows)
    assert "0.67" in text  # 1,777,265 / 2,656,768 instructions per MAC
    assert "pico2-uart/mobilenet_v2/cortex_m_int8/speed: MEMORY: region RAM overflows" in text
    assert "aten::convolution.out" in text
    md = markdown(rows)
    assert md.count("\n| ") == len(rows)  # one line per row after the header and rule
    assert "float island at instructions 1-3" in md
    data = to_json(rows)
    assert [r["result"] for r in data["rows"]] == ["PASS", "MEMORY", "PASS"]
    assert data["rows"][0]["instructions_per_mac"] == pytest.approx(1_777_265 / 2_656_768)
    assert data["rows"][1]["instructions_per_mac"] is None
    json.dumps(data)  # serialisable as is
    ET.fromstring(svg(rows))  # well-formed
    per_mac, ram = chart(rows).panels
    drawn = [b for g in per_mac.groups for b in g.bars if b.value is not None]
    assert len(drawn) == 2  # the rows that ran; the MEMORY row has no instructions
    (too_big,) = next(g for g in ram.groups if g.label == "mobilenet_v2").bars
    assert too_big.value is None and too_big.text.endswith(": MEMORY")


def _cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_cli_rejects_bad_jobs_and_unknown_model(capsys, tmp_path):
    code, err = _cli(
        [
            "matrix",
            "--boards",
            "qemu-an505",
            "--models",
            "ds_cnn",
            "-j",
            "0",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == ExitCode.CONFIG and "-j 0" in err
    code, err = _cli(
        ["matrix", "--boards", "qemu-an505", "--models", "no_such_model", "--out", str(tmp_path)],
        capsys,
    )
    assert code == ExitCode.CONFIG and "no_such_model" in err
    assert not (tmp_path / "matrix.json").exists()  # nothing written for a refused filter
    code, err = _cli(["matrix", "--boards", "qemu-an505", "--models", "ds_cnn", "--patches",
                      "off", "0x3", "--out", str(tmp_path)], capsys)
    assert code == ExitCode.CONFIG and "0x3" in err
    assert not (tmp_path / "matrix.json").exists()


def test_profile_command_takes_the_common_options(capsys, tmp_path):
    """`deploykit profile` passes every common option (--strict among them) to the API: it
    ends in a clear error (missing sources, or the unknown model), not a TypeError."""
    code, err = _cli(
        ["profile", "--board", "qemu-an505", "--model", "no_such_model", "--out", str(tmp_path)],
        capsys,
    )
    assert code in (ExitCode.CONFIG, ExitCode.ENVIRONMENT) and "deploykit: error:" in err
