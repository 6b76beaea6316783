"""int8 beyond CNNs (issue #20), host side: real cortex_m_int8 exports of the GRU keyword
model (over 8 of its 49 frames) and the pre-norm transformer block, the operator-coverage
gate on them, the mixed-precision fallback's choice of float operators, --strict, and the
coverage error's text. The fallback is shown on a real upstream failure: the transformer
exported with ExecuTorch's own Cortex-M pass list, without deploykit's early batch matmul.
Five int8 exports (that one quantized twice) and one fp32."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deploykit.flows import cortex_m_int8
from deploykit.flows.base import NOTES_NAME, ExportOptions
from deploykit.program.export import ExportResult, export
from deploykit.program.models import load_model
from deploykit.readers.op_coverage import kernel_tables
from deploykit.util.errors import ExportError

REPO = Path(__file__).resolve().parents[2]


def _line_of(model: str, code: str) -> int:
    lines = (REPO / "models" / f"{model}.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if code in text)


GRU_FRAMES = 8  # the bundled model's GRU over 8 of its 49 frames: the same layers, faster


@pytest.fixture(scope="module")
def gru(tmp_path_factory) -> ExportResult:
    spec = load_model("gru_kws", REPO)
    spec = dataclasses.replace(
        spec,
        example_inputs=tuple(t[:, :GRU_FRAMES] for t in spec.example_inputs),
        calibration_inputs=[
            tuple(t[:, :GRU_FRAMES] for t in sample) for sample in spec.calibration_inputs
        ],
    )
    return export(spec, "cortex_m_int8", tmp_path_factory.mktemp("gru"), cpu="cortex-m55")


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> ExportResult:
    return export(
        load_model("transformer_block", REPO),
        "cortex_m_int8",
        tmp_path_factory.mktemp("transformer"),
        cpu="cortex-m55",
    )


def _upstream_passes_only() -> list[type]:
    """ExecuTorch's own Cortex-M pass list, without deploykit's early batch matmul
    (flows/early_batch_matmul.py): its ReplaceScalarWithTensorArgPass fails on attention's
    second bmm, a real upstream failure for the fallback to handle."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    return list(CortexMPassManager.pass_list)


@pytest.fixture(scope="module")
def upstream_transformer(tmp_path_factory) -> ExportResult:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cortex_m_int8, "cortex_m_pass_list", _upstream_passes_only)
        return export(
            load_model("transformer_block", REPO),
            "cortex_m_int8",
            tmp_path_factory.mktemp("upstream_transformer"),
            cpu="cortex-m55",
        )


def _all_covered(ops: list[str]) -> list[str]:
    tables = kernel_tables()
    return [o for o in ops if tables.library(o) is None]


def test_gru_has_no_float_linear_left(gru):
    """The quantizer leaves the GRU (one aten.gru op when it annotates) float; its gate
    projections used to reach the runtime as aten::linear.out, which has no kernel, and are
    addmm now. The classifier is a CMSIS-NN linear."""
    assert "aten::linear.out" not in gru.op_list
    assert "aten::addmm.out" in gru.op_list
    assert "cortex_m::quantized_linear.out" in gru.op_list
    assert _all_covered(gru.op_list) == []


def test_gru_report_lists_the_float_matmuls_with_their_line(gru):
    mixed = json.loads(gru.report_path.read_text())["mixed_precision"]
    line = _line_of("gru_kws", "self.gru(x)")
    assert mixed["kept_in_float"] == []  # nothing failed: the quantizer left the GRU float
    assert {e["op"] for e in mixed["float_mac_ops"]} == {"aten::addmm"}
    assert {e["source"] for e in mixed["float_mac_ops"]} == {
        f"gru_kws.py:{line} in forward: out, _ = self.gru(x)"
    }
    # GRU_FRAMES steps x (10 + 24) inputs x 72 gate outputs in float, the 24 x 12 classifier
    # in int8.
    assert mixed["float_macs"] == GRU_FRAMES * (10 + 24) * 72
    assert mixed["int8_macs"] == 24 * 12
    share = 100 * mixed["float_macs"] / (mixed["float_macs"] + mixed["int8_macs"])
    assert any(
        w.startswith(f"Mixed precision: {share:.1f}% of the MACs run in float")
        for w in gru.warnings
    ), gru.warnings


def test_transformer_attention_is_int8(transformer):
    """Both of attention's matmuls are CMSIS-NN batch matmuls (the second lowered early,
    flows/early_batch_matmul.py), the projections and the MLP CMSIS-NN linears, the softmax
    int8: nothing with multiply-accumulates stays float, and nothing failed upstream."""
    mixed = json.loads(transformer.report_path.read_text())["mixed_precision"]
    assert mixed["kept_in_float"] == []
    assert mixed["float_mac_ops"] == [] and mixed["float_macs"] == 0
    assert "upstream_failure" not in mixed
    # qkv 16x32x96, proj 16x32x32, MLP 2 x 16x32x128, q@k^T and softmax@v 4x16x16x8 each
    assert mixed["int8_macs"] == 16 * 32 * (96 + 32 + 2 * 128) + 2 * 4 * 16 * 16 * 8
    assert "aten::bmm.out" not in transformer.op_list
    for op in (
        "cortex_m::quantized_linear.out",
        "cortex_m::quantized_batch_matmul.out",
        "cortex_m::softmax.out",
    ):
        assert op in transformer.op_list
    assert _all_covered(transformer.op_list) == []
    # The GELU, the scores' scale and the softmax output's requantization for the matmul are
    # int8 table lookups (flows/elementwise_lut.py), the layer norms deploykit's int8 operator
    # (flows/layer_norm_int8.py): no float operator is left.
    line = _line_of("transformer_block", "scores.softmax(dim=-1) @ v")
    scale = _line_of("transformer_block", "scores = (q @ k.transpose(-2, -1))")
    gelu = _line_of("transformer_block", "x = x + self.attn(self.norm1(x))") + 1
    assert [t.split(" in ")[0] for t in mixed["lookup_tables"]] == [
        f"mul at transformer_block.py:{scale}",
        f"requantize at transformer_block.py:{line}",
        f"gelu at transformer_block.py:{gelu}",
    ]
    assert "cortex_m::quantized_activation.out" in transformer.op_list
    assert len(mixed["int8_layer_norms"]) == 2
    assert "deploykit::quantized_layer_norm.out" in transformer.op_list
    assert mixed["other_float_ops"] == []


def test_upstream_failure_keeps_only_the_failing_bmm_in_float(upstream_transformer):
    """With ExecuTorch's own pass list, ReplaceScalarWithTensorArgPass fails on attention's
    second bmm in v1.4.1; only that operator stays float; the rest is int8."""
    mixed = json.loads(upstream_transformer.report_path.read_text())["mixed_precision"]
    line = _line_of("transformer_block", "scores.softmax(dim=-1) @ v")
    assert mixed["kept_in_float"] == [
        f"bmm at transformer_block.py:{line} in forward: y = scores.softmax(dim=-1) @ v"
    ]
    assert [(e["op"], e["count"], e["macs"]) for e in mixed["float_mac_ops"]] == [
        ("aten::bmm", 1, 4 * 16 * 16 * 8)
    ]
    assert mixed["int8_macs"] == 16 * 32 * (96 + 32 + 2 * 128) + 4 * 16 * 16 * 8
    assert "aten::bmm.out" in upstream_transformer.op_list
    assert "cortex_m::quantized_batch_matmul.out" in upstream_transformer.op_list
    assert _all_covered(upstream_transformer.op_list) == []
    failure = mixed["upstream_failure"]
    assert failure["step"] == "ReplaceScalarWithTensorArgPass"
    assert failure["op"] == "aten::bmm"


def test_upstream_failure_is_logged_once_with_a_reproduction(upstream_transformer):
    notes = (upstream_transformer.pte_path.parent / NOTES_NAME).read_text()
    assert notes.count("pass:      ReplaceScalarWithTensorArgPass") == 1
    assert "expected scalar type torch.int8 but found torch.int32" in notes
    assert "CortexMPassManager(edge.exported_program()" in notes
    assert "transformer_block.py" in notes


def test_strict_refuses_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(cortex_m_int8, "cortex_m_pass_list", _upstream_passes_only)
    spec = load_model("transformer_block", REPO)
    with pytest.raises(ExportError) as e:
        export(
            spec, "cortex_m_int8", tmp_path, cpu="cortex-m55", options=ExportOptions(strict=True)
        )
    text = str(e.value)
    assert "ReplaceScalarWithTensorArgPass" in text and "--strict forbids" in text
    assert "transformer_block.py:" in text
    assert not (tmp_path / "model.pte").exists()


SORTER = textwrap.dedent('''\
    """Sorts its input: no kernel of ExecuTorch v1.4.1's portable library sorts."""
    import torch


    class Sorter(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x, dim=-1)[0] * 2.0


    def model():
        return Sorter().eval()


    def example_inputs():
        return (torch.linspace(1.0, -1.0, 8).reshape(1, 8),)
    ''')


def test_uncovered_operator_stops_the_export_with_its_own_exit_code(tmp_path):
    model = tmp_path / "sorter.py"
    model.write_text(SORTER)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tools")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploykit",
            "export",
            "--board",
            "qemu-an547",
            "--model",
            str(model),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert run.returncode == 15, run.stderr
    err = run.stderr
    assert "Traceback" not in err
    assert (
        "deploykit: error: The portable_fp32 export of 'sorter' has operator(s) with no "
        "kernel in the runtime build: aten::sort.values." in err
    )
    assert "from: sorter.py:7 in forward: return torch.sort(x, dim=-1)[0] * 2.0" in err
    assert "why: no kernel library of the runtime build implements it" in err
    assert "fix: Rewrite that line" in err
    assert not (out / "export" / "model.pte").exists()
    assert not (out / "export" / "export.json").exists()
