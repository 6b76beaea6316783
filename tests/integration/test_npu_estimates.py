"""Vela's per-operator estimates of real Ethos-U exports, and `deploykit npu-sweep` over them.

Vela runs here for real (as in CI); no workspace, NPU or FVP is needed. ds_cnn is exported once
for corstone-320 (about a minute on two cores) and every test of it reuses that export, the
sweep through the export cache of its output directory. MobileNetV2 is one more export of
about a minute: marked `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import ethosu.vela  # noqa: F401  (a hard dependency: a broken install fails here)
import pytest

from deploykit import api
from deploykit.program.inspect import ProgramInfo, inspect_pte
from deploykit.util.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BOUNDS = {"compute", "SRAM", "DRAM", "on-chip flash", "off-chip flash"}


@pytest.fixture(scope="module")
def ds_cnn_out(tmp_path_factory) -> Path:
    """The output directory of ds_cnn exported for corstone-320 (its default NPU settings)."""
    out = tmp_path_factory.mktemp("ds_cnn-corstone-320")
    api.export("corstone-320", "ds_cnn", out=out, project=False)
    return out


@pytest.fixture(scope="module")
def ds_cnn_info(ds_cnn_out) -> ProgramInfo:
    return inspect_pte(ds_cnn_out / "export" / "model.pte")


def _check_layers_add_up(info: ProgramInfo, model_file: str | None) -> None:
    npu = [d for d in info.delegates if d.vela is not None]
    assert npu
    for d in npu:
        estimate = d.vela_estimate
        assert estimate is not None and estimate.layers, f"delegate {d.index}: no layers"
        # Vela's per-operator cycles add up to its whole-delegate estimate (within 5%).
        assert abs(estimate.layer_cycles - estimate.total_cycles) <= 0.05 * estimate.total_cycles
        assert sum(layer.macs for layer in estimate.layers) <= estimate.macs
        assert {layer.bound for layer in estimate.layers} <= BOUNDS
        assert all(0.0 <= layer.mac_utilisation <= 1.0 for layer in estimate.layers)
        # Where each operator comes from: the module and the model file's line, no other file.
        origins = [layer.model_origin for layer in estimate.layers if layer.model_origin]
        assert origins, f"delegate {d.index}: no operator knows its model origin"
        assert not [o for o in origins if str(REPO) in o or str(Path.home()) in o]
        if model_file is not None:
            assert any(f"{model_file}:" in o for o in origins)


def test_ds_cnn_per_layer_cycles_add_up_to_the_delegate_estimate(ds_cnn_info):
    _check_layers_add_up(ds_cnn_info, "ds_cnn.py")
    (d,) = ds_cnn_info.delegates
    ops = [layer.op for layer in d.vela_estimate.layers]
    assert ops.count("Conv2D") >= 4 and ops.count("DepthwiseConv2D") >= 4


def test_inspect_shows_the_top_npu_operators_and_json_has_all(ds_cnn_info):
    text = api.describe_program(ds_cnn_info)
    (d,) = ds_cnn_info.delegates
    n = len(d.vela_estimate.layers)
    assert f"top 5 of {n} NPU operators (Vela estimate; --json has all):" in text
    top = d.vela_estimate.top_layers(1)[0]
    assert f"{top.op} {top.name}: " in text and "-bound" in text
    segment = next(s for s in api.program_json(ds_cnn_info)["segments"]
                   if s["kind"] == "delegate")
    layers = segment["npu_estimate"]["layers"]
    assert len(layers) == n
    assert {"op", "name", "model_origin", "cycles", "macs", "mac_utilisation",
            "bound"} <= set(layers[0])


def test_sweep_over_a_few_points_reproduces_the_export_and_marks_the_front(ds_cnn_out,
                                                                          ds_cnn_info):
    # Two workers: the points compile in worker processes, and come back in point order.
    result = api.npu_sweep("corstone-320", "ds_cnn", macs=[128, 256],
                           memory_modes=["Shared_Sram", "Sram_Only"],
                           system_configs=["Ethos_U85_SYS_DRAM_Mid"], jobs=2, out=ds_cnn_out,
                           project=False)
    rows = result.rows
    assert [(r.macs, r.memory_mode) for r in rows] == [
        (128, "Shared_Sram"), (128, "Sram_Only"), (256, "Shared_Sram"), (256, "Sram_Only")]
    assert all(r.result == "fits" and r.cycles and r.latency_ms for r in rows)
    # The board's own point is what the export's Vela compile said, cycle for cycle.
    (d,) = ds_cnn_info.delegates
    own = next(r for r in rows if (r.macs, r.memory_mode) == (256, "Shared_Sram"))
    assert own.cycles == d.vela_estimate.total_cycles
    assert own.arena == d.scratch_size
    assert own.latency_ms == pytest.approx(own.cycles / (own.clock_mhz * 1e3))
    # Sram_Only puts the model in the SRAM too: it needs more SRAM than Shared_Sram.
    for macs in (128, 256):
        by_mode = {r.memory_mode: r for r in rows if r.macs == macs}
        assert by_mode["Sram_Only"].sram_needed > by_mode["Shared_Sram"].sram_needed
    front = [r for r in rows if r.pareto]
    assert front and result.chosen in front
    assert result.chosen is min(rows, key=lambda r: (r.latency_ms, r.sram_needed))
    assert result.build_command.startswith("deploykit build --board corstone-320 --model ds_cnn")
    assert all(r.vela_seconds is not None and r.vela_seconds < 30 for r in rows)
    saved = json.loads(result.files["json"].read_text())
    assert len(saved["rows"]) == 4 and saved["source"] == "Vela estimate"
    assert saved["build_command"] == result.build_command
    assert "| ethos-u85-128 | Shared_Sram |" in result.files["markdown"].read_text()
    assert result.files["svg"].read_text().startswith("<?xml")


def test_a_sweep_in_which_nothing_fits_says_why_in_each_row(ds_cnn_out, tmp_path):
    # corstone-320 with a 16 KiB SRAM behind the NPU: the scratch alone (about 22 KiB) is
    # too big for it in Shared_Sram, and so is the model in Sram_Only.
    text = (REPO / "boards" / "corstone-320.yaml").read_text()
    small = text.replace("{name: sram, origin: 0x31000000, size: 4M,",
                         "{name: sram, origin: 0x31000000, size: 16K,")
    assert small != text
    board = tmp_path / "corstone-320-small.yaml"
    board.write_text(small.replace("name: corstone-320\n", "name: corstone-320-small\n"))
    result = api.npu_sweep(str(board), "ds_cnn", macs=[256],
                           system_configs=["Ethos_U85_SYS_DRAM_Mid"],
                           memory_modes=["Shared_Sram", "Sram_Only"], out=ds_cnn_out,
                           project=False)
    assert [r.result for r in result.rows] == ["does not fit", "does not fit"]
    assert all("region 'sram'" in r.reason for r in result.rows)
    assert result.chosen is None and result.build_command is None
    assert result.why_chosen.startswith("no point fits the board's memory")
    assert not any(r.pareto for r in result.rows)


def test_bad_sweep_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="--macs 96 is not a MAC configuration of the "
                       "ethos-u85") as e:
        api.npu_sweep("corstone-320", "ds_cnn", macs=[96], project=False)
    assert "128, 256, 512, 1024, 2048" in e.value.hint
    with pytest.raises(ConfigError, match="Dedicated_Sram_384KB is not one of the board's "
                       "memory modes") as e:
        api.npu_sweep("corstone-300", "ds_cnn", memory_modes=["Dedicated_Sram_384KB"],
                      project=False)
    assert "Shared_Sram, Sram_Only" in e.value.hint
    with pytest.raises(ConfigError, match="Ethos_U85_SYS_Flash_Low is not one of the board's "
                       "system configurations"):
        api.npu_sweep("corstone-320", "ds_cnn", system_configs=["Ethos_U85_SYS_Flash_Low"],
                      project=False)
    with pytest.raises(ConfigError, match="-j 0"):
        api.npu_sweep("corstone-320", "ds_cnn", jobs=0, project=False)


def test_corstone_300_sweeps_its_u55_with_the_weights_read_from_flash(tmp_path):
    # Its system configurations put flash behind AXI1: Shared_Sram reads the weights there.
    result = api.npu_sweep("corstone-300", "ds_cnn", macs=[128], out=tmp_path, project=False)
    assert [(r.memory_mode, r.system_config) for r in result.rows] == [
        ("Shared_Sram", "Ethos_U55_High_End_Embedded"), ("Shared_Sram", "Ethos_U55_Deep_Embedded"),
        ("Sram_Only", "Ethos_U55_High_End_Embedded"), ("Sram_Only", "Ethos_U55_Deep_Embedded")]
    assert all(r.result == "fits" for r in result.rows)
    shared = [r for r in result.rows if r.memory_mode == "Shared_Sram"]
    assert all(r.flash_mb > 0 and r.dram_mb == 0 for r in shared)
    # The 200 MHz Deep_Embedded system is slower than the 500 MHz High_End one.
    assert shared[1].clock_mhz == 200 and shared[0].clock_mhz == 500
    assert shared[1].latency_ms > shared[0].latency_ms
    _check_layers_add_up(inspect_pte(tmp_path / "export" / "model.pte"), "ds_cnn.py")


@pytest.fixture(scope="module")
def mobilenet_v2_info(tmp_path_factory) -> ProgramInfo:
    out = tmp_path_factory.mktemp("mobilenet_v2-corstone-320")
    return inspect_pte(api.export("corstone-320", "mobilenet_v2", out=out,
                                  project=False).pte_path)


@pytest.mark.slow
def test_mobilenet_v2_per_layer_cycles_add_up_to_the_delegate_estimate(mobilenet_v2_info):
    _check_layers_add_up(mobilenet_v2_info, "mobilenet_v2.py")
    (d,) = [d for d in mobilenet_v2_info.delegates if d.vela is not None]
    assert len(d.vela_estimate.layers) >= 50  # 52 convolutions, some fused by Vela


@pytest.mark.slow
def test_each_delegate_of_a_split_model_has_its_own_layers(mobilenet_v2_lrn_ethos_u):
    # tests/integration/conftest.py: two NPU delegates with the LRN remnant between them.
    _check_layers_add_up(inspect_pte(mobilenet_v2_lrn_ethos_u.pte_path), None)
