"""Real Ethos-U exports (EthosUQuantizer -> TOSA -> Vela) and what inspect, plan and build make
of them.

- tiny_cnn for U55-128 and U85-256 in both memory modes of each (about 4 s each);
- the build of an NPU board stops after export and plan, naming the missing Ethos-U driver;
- the board files' memory maps: the Corstone-300 board-support self-test runs on QEMU's
  mps3-an547 (same map and UART), the Corstone-320 one links at its addresses;
- MobileNetV2+LRN for corstone-320 (U85-256): 55 s on an idle 2-core machine, 75 s with
  other builds running; marked `slow` (deselect with -m "not slow"). The plain MobileNetV2
  export costs as much again, so it runs only with DEPLOYKIT_TEST_MOBILENET_V2=1, which keeps
  the file near 2 minutes.

The Vela compiler and the TOSA reference model run here for real; the NPU and the FVP do not
(they are not on this machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import ethosu.vela  # noqa: F401
import executorch  # noqa: F401  (a hard dependency: a broken install fails here)
import pytest

from deploykit import api
from deploykit.flows.ethos_u_int8 import TOSA_REFERENCE_KIND
from deploykit.memory.plan import plan_memory
from deploykit.program.export import export
from deploykit.program.inspect import inspect_pte
from deploykit.program.models import load_model
from deploykit.readers.boards import load_board
from deploykit.readers.npu import npu_config, with_npu_overrides
from deploykit.util.errors import EnvironmentProblem
from tests.markers import (
    _ethos_u_sources_reason,
    requires_cmake,
    requires_qemu,
    requires_sources,
    requires_toolchain,
)

REPO = Path(__file__).resolve().parents[2]
QDQ = {"cortex_m::quantize_per_tensor.out", "cortex_m::dequantize_per_tensor.out"}

SMALL_CASES = [
    ("corstone-300", "Shared_Sram"),
    ("corstone-300", "Sram_Only"),
    ("corstone-320", "Shared_Sram"),
    ("corstone-320", "Dedicated_Sram_384KB"),
]


@pytest.fixture(scope="module")
def small_exports(tmp_path_factory):
    spec = load_model("tiny_cnn", REPO)
    results = {}
    for board_name, mode in SMALL_CASES:
        board = with_npu_overrides(load_board(board_name), memory_mode=mode)
        out = tmp_path_factory.mktemp(f"tiny-{board_name}-{mode}")
        results[(board_name, mode)] = (board, export(
            spec, "ethos_u_int8", out, cpu=board.cpu["core"],
            settings=npu_config(board).export_settings()))
    return results


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_small_model_exports_for_the_npu(small_exports, case):
    board, r = small_exports[case]
    npu = npu_config(board)
    assert set(r.op_list) == QDQ  # everything else runs on the NPU
    info = inspect_pte(r.pte_path)
    (d,) = info.delegates
    assert (d.backend, d.target, d.system_config, d.memory_mode) == (
        "EthosUBackend", npu.target, npu.system_config, npu.memory_mode)
    assert d.scratch_size > 0
    assert [s.kind for s in info.segments] == ["cpu", "delegate", "cpu"]
    report = json.loads(r.report_path.read_text())
    assert report["ethos_u"]["target"] == npu.target
    assert report["partition"]["delegates"][0]["vela"]["memory_mode"] == npu.memory_mode
    assert report["warnings"] == []
    # Inputs stay NCHW; the float I/O is quantized/dequantized by cortex_m ops on the CPU.
    assert r.input_dim_orders == [[0, 1, 2, 3]]
    assert r.input_quant[0] is not None and r.output_quant[0] is not None


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_tosa_reference_parity_with_the_quantized_model(small_exports, case):
    _, r = small_exports[case]
    report = json.loads(r.report_path.read_text())
    check = report["reference"]["tosa_reference_check"]
    assert check["ran"] and check["delegates"] == 1
    # the TOSA reference model (integer) and the PT2E model (float simulation of the
    # quantization) agree to rounding: at most one output step apart on this model
    assert check["max_diff_output_steps"] <= 1.0 + 1e-6
    assert r.reference_kind == TOSA_REFERENCE_KIND


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_plan_places_the_scratch_as_the_memory_mode_says(small_exports, case):
    board, r = small_exports[case]
    info = inspect_pte(r.pte_path)
    plan = plan_memory(board, info)
    regions = {i.name.split(" (")[0]: i.region for i in plan.items}
    mode = case[1]
    assert regions["Ethos-U scratch"] == ("ddr" if mode.startswith("Dedicated") else "sram")
    assert regions["model"] == ("sram" if mode == "Sram_Only" else "ddr")
    fast = [i for i in plan.items if i.name.startswith("Ethos-U fast scratch")]
    assert [i.size for i in fast] == ([384 * 1024] if mode.startswith("Dedicated") else [])


@requires_sources
@pytest.mark.skipif(_ethos_u_sources_reason() is None,
                    reason="the workspace has the Ethos-U driver and CMSIS_6: the NPU build goes "
                    "on (tests/integration/test_npu_firmware.py builds it)")
def test_npu_build_stops_after_export_and_plan_naming_the_driver(tmp_path):
    messages: list[str] = []
    with pytest.raises(EnvironmentProblem) as exc:
        api.build("corstone-320", "tiny_cnn", out=tmp_path, progress=messages.append)
    assert exc.value.cause.startswith("The firmware for the ethos-u85-256 NPU of corstone-320 "
                                      "needs ethos-u-core-driver, cmsis")
    assert f"The export and memory plan are done: {tmp_path / 'export'}" in exc.value.cause
    assert "deploykit setup --group ethos-u" in exc.value.hint
    assert "hal_ethos_u" in exc.value.hint and "--flow cortex_m_int8" in exc.value.hint
    assert "ethos-u-core-driver.git" in exc.value.hint and "26.02" in exc.value.hint
    assert (tmp_path / "export" / "model.pte").is_file()
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["fits"] and any(i["kind"] == "npu_scratch" for i in plan["items"])
    assert any("memory plan" in m for m in messages)


def test_export_cache_keys_on_the_mac_count(tmp_path):
    said: list[str] = []
    first = api.export("corstone-320", "tiny_cnn", out=tmp_path, progress=said.append)
    assert any(m.startswith("exporting tiny_cnn") for m in said), said
    pte = first.pte_path.stat()
    said.clear()
    again = api.export("corstone-320", "tiny_cnn", out=tmp_path, progress=said.append)
    # Taken from the cache: the export did not run (it says so, and the .pte is the same
    # file, not rewritten), so the same hash proves nothing by itself.
    assert said == [f"export of tiny_cnn is up to date ({tmp_path / 'export'})"], said
    after = again.pte_path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (pte.st_ino, pte.st_mtime_ns)
    assert again.pte_sha256 == first.pte_sha256
    said.clear()
    other = api.export("corstone-320", "tiny_cnn", out=tmp_path, npu_macs=512,
                       progress=said.append)
    assert any(m.startswith("exporting tiny_cnn") for m in said), said  # another key
    assert inspect_pte(other.pte_path).delegates[0].target == "ethos-u85-512"


# ---- the board files' memory maps, linked and (Corstone-300) run --------------------------


@requires_toolchain
@requires_cmake
@requires_qemu
def test_corstone_300_board_support_runs_on_qemu_mps3_an547(tmp_path):
    """QEMU's mps3-an547 has the Corstone-300 memory map and UART: the board-support
    self-test built from corstone-300.yaml runs there (the FVP runner swapped for QEMU)."""
    from deploykit.run.selftest import run_selftest

    board = load_board("corstone-300")
    qemu = dataclasses.replace(board, runner={"kind": "qemu", "machine": "mps3-an547",
                                              "cpu": "cortex-m55"})
    report = run_selftest(qemu, tmp_path, 60.0, lambda _m: None)
    assert report.passed, report.summary()


@requires_toolchain
@requires_cmake
def test_corstone_320_board_support_links_at_the_board_addresses(tmp_path):
    from elftools.elf.elffile import ELFFile

    from deploykit.build.render import render_board_files
    from deploykit.families import family_of

    board = load_board("corstone-320")
    render_board_files(board, tmp_path / "generated")
    fw = family_of(board).build_image(board, tmp_path / "generated", tmp_path / "fw", "selftest")
    with fw.elf.open("rb") as f:
        sections = {s.name: s["sh_addr"] for s in ELFFile(f).iter_sections()}
    assert sections[".vectors"] == board.region("brom").origin == 0x11000000  # INITSVTOR
    assert board.region("bram").origin <= sections[".text"] < board.region("bram").end
    assert sections[".stack"] == board.region("dtcm").origin


# ---- MobileNetV2 on corstone-320 (U85-256) ---------------------------------------------


def _export_mobilenet(name: str, out: Path):
    board = load_board("corstone-320")
    return export(load_model(name, REPO), "ethos_u_int8", out, cpu=board.cpu["core"],
                  settings=npu_config(board).export_settings())


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DEPLOYKIT_TEST_MOBILENET_V2"),
                    reason="a second MobileNetV2 export (~55-75 s) is opt-in to keep this file "
                    "near 2 minutes: set DEPLOYKIT_TEST_MOBILENET_V2=1 (mobilenet_v2_lrn, the "
                    "split case, always runs)")
def test_mobilenet_v2_is_one_npu_segment(tmp_path, capsys):
    r = _export_mobilenet("mobilenet_v2", tmp_path)
    info = inspect_pte(r.pte_path)
    assert [s.kind for s in info.segments] == ["cpu", "delegate", "cpu"]
    assert set(info.cpu_ops) == QDQ and info.cpu_fallback_ops == ()
    ops = info.delegates[0].ops
    assert ops["aten::convolution"] == 52 and ops["aten::linear"] == 1
    assert info.max_scratch > 1_000_000 and info.planned_total > 500_000
    plan = plan_memory(load_board("corstone-320"), info)
    assert plan.fits
    from deploykit.cli import main

    assert main(["inspect", "--json", str(r.pte_path)]) == 0
    j = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in j["segments"]] == ["cpu", "delegate", "cpu"]
    assert j["segments"][1]["scratch_size"] == info.max_scratch
    assert j["cpu_fallback_ops"] == []


@pytest.mark.slow
def test_mobilenet_v2_lrn_splits_in_two_with_lrn_on_the_cpu(mobilenet_v2_lrn_ethos_u):
    r = mobilenet_v2_lrn_ethos_u  # tests/integration/conftest.py
    info = inspect_pte(r.pte_path)
    kinds = [s.kind for s in info.segments]
    assert kinds == ["cpu", "delegate", "cpu", "delegate", "cpu"]
    middle = info.segments[2]
    assert "aten::avg_pool3d.out" in middle.ops  # the LRN remnant
    assert info.cpu_fallback_ops == ("aten::avg_pool3d.out",)
    assert [s.delegate for s in info.segments if s.kind == "delegate"] == [0, 1]
    assert all(d.scratch_size and d.ops for d in info.delegates)
    assert "aten::avg_pool3d" not in {op for d in info.delegates for op in d.ops}
    report = json.loads(r.report_path.read_text())
    assert report["reference"]["tosa_reference_check"]["delegates"] == 2
    # Each delegate's TOSA graph (what Vela compiled) is kept beside the .pte.
    tosa_files = [d["tosa_file"] for d in report["partition"]["delegates"]]
    assert tosa_files == ["delegate_0.tosa", "delegate_1.tosa"]
    assert all((r.pte_path.parent / f).read_bytes()[4:8] == b"TOSA" for f in tosa_files)
    assert any("split into 2 Ethos-U delegates" in w for w in report["warnings"])
    text = api.describe_program(info)
    assert "CPU fallback ops: aten::avg_pool3d.out" in text
