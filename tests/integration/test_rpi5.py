"""The Raspberry Pi family (linux_aarch64: rpi5, rpi4) without the upstream sources: the two
XNNPACK flows export for real (partitioner, quantizer, the host's XNNPACK runtime as the
reference), `inspect` shows the XNNPACK segments and what is left on the CPU, and the
generated sources of the runner cross-compile with g++-aarch64-linux-gnu under -Wall -Werror.
The builds and runs under qemu-aarch64 are in test_rpi5_run.py (they need the sources)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit import api
from deploykit.build.render import ModelSources, render_board_files, render_model_files
from deploykit.program.export import load_export
from deploykit.readers.boards import load_board, repo_root
from deploykit.util.errors import ConfigError

requires_aarch64_gcc = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="aarch64-linux-gnu-gcc not installed (apt-get install g++-aarch64-linux-gnu)",
)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rpi5")
    out = {}
    for flow in ("xnnpack_fp32", "xnnpack_int8"):
        out[flow] = root / flow
        api.export("rpi5", "tiny_cnn", flow=flow, out=out[flow])
    return out


@pytest.mark.parametrize("flow", ["xnnpack_fp32", "xnnpack_int8"])
def test_export_delegates_to_xnnpack(exports, flow):
    result = load_export(exports[flow] / "export")
    info = api.inspect(result.pte_path)
    delegates = [s for s in info.segments if s.kind == "delegate"]
    assert delegates and all(s.backend == "XnnpackBackend" for s in delegates)
    inside = {op.split(".")[0] for s in delegates for op in s.ops}
    assert {"aten::convolution", "aten::linear"} <= inside  # the partition report's ops
    # tiny_cnn is all XNNPACK: nothing left to the portable kernels
    assert info.cpu_fallback_ops == ()
    assert result.op_list == []
    if flow == "xnnpack_int8":
        assert any(op.startswith("quantized_decomposed::") for s in delegates for op in s.ops)
        assert result.tolerance["atol"] > 0  # output steps of the static quantization


def test_inspect_shows_cpu_operators_left_outside_xnnpack(tmp_path):
    """opt_small keeps its layer norms and mask arithmetic on the CPU."""
    pytest.importorskip(
        "transformers", reason="transformers not installed (pip install 'deploykit[bench]')"
    )
    result = api.export("rpi5", "opt_small", flow="xnnpack_fp32", out=tmp_path)
    info = api.inspect(result.pte_path)
    kinds = [s.kind for s in info.segments]
    assert "delegate" in kinds and "cpu" in kinds
    assert "aten::native_layer_norm.out" in info.cpu_ops
    text = subprocess.run(
        # this interpreter: PATH's python3 may be the distribution's, without deploykit
        [sys.executable, "-m", "deploykit", "inspect", str(result.pte_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(repo_root() / "tools")},
    ).stdout
    assert "XnnpackBackend (delegate 0)" in text and "aten::native_layer_norm.out" in text


def test_xnnpack_flows_refuse_a_cortex_m_board():
    from deploykit.flows import get_flow
    from deploykit.flows.base import ExportTarget

    with pytest.raises(ConfigError, match="does not support the xnnpack_fp32 flow"):
        api.export("qemu-an547", "tiny_cnn", flow="xnnpack_fp32")
    for flow in ("xnnpack_fp32", "xnnpack_int8"):
        with pytest.raises(ConfigError, match="not a Cortex-A CPU"):
            get_flow(flow).validate(ExportTarget("cortex-m55"))
        assert get_flow(flow).applies_to(load_board("qemu-an547")) is not None
        assert get_flow(flow).applies_to(load_board("rpi5")) is None


def test_board_files_carry_the_pi_cpu_flags():
    assert load_board("rpi5").cpu_flags == ["-march=armv8.2-a+dotprod+fp16", "-mtune=cortex-a76"]
    assert load_board("rpi4").cpu_flags == ["-march=armv8-a", "-mtune=cortex-a72"]


@requires_aarch64_gcc
@pytest.mark.parametrize("board", ["rpi5", "rpi4"])
def test_generated_sources_cross_compile(exports, tmp_path, board):
    """The rendered board and model files, the protocol encoder and the embedded .pte compile
    for aarch64 Linux with the board's flags and -Wall -Wextra -Werror."""
    b = load_board(board)
    result = load_export(exports["xnnpack_fp32"] / "export")
    gen = tmp_path / "generated"
    render_board_files(b, gen)
    render_model_files(
        ModelSources(
            pte=result.pte_path.read_bytes(),
            input_sets=result.input_sets,
            expected_outputs=result.reference_sets[0],
            plan=api.plan(board, pte=result.pte_path, out=tmp_path),
            et_commit="test",
            build_info="test",
        ),
        gen,
    )
    firmware = repo_root() / "firmware"
    for src in (gen / "model_pte.c", gen / "model_io.c", firmware / "protocol/dk_protocol.c"):
        obj = tmp_path / (src.stem + ".o")
        subprocess.run(
            [
                "aarch64-linux-gnu-gcc",
                *b.cpu_flags,
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-c",
                str(src),
                "-o",
                str(obj),
                f"-I{gen}",
                f"-I{firmware / 'protocol'}",
                f"-I{firmware / 'boards'}",
                f"-Wa,-I{gen}",
            ],
            check=True,
        )
        header = subprocess.run(
            ["aarch64-linux-gnu-readelf", "-h", str(obj)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "AArch64" in header
