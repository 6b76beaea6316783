"""Real exports of the bundled models through both flows (about 15 s in all on 2 cores)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import executorch  # noqa: F401  (a hard dependency: a broken install fails here)
import numpy as np
import pytest
import torch

from deploykit.program.export import (
    ERROR_LOG_NAME,
    ExportResult,
    export,
    memory_order_bytes,
    parse_ops_yaml,
)
from deploykit.program.models import load_model
from deploykit.readers.pte_reader import read_pte_info
from deploykit.util.errors import ConfigError, ExitCode, ExportError

REPO = Path(__file__).resolve().parents[2]

EXPECTED_OPS = {
    ("mlp_mnist", "portable_fp32"): {"aten::addmm.out", "aten::relu.out"},
    ("tiny_cnn", "portable_fp32"): {"aten::convolution.out", "aten::relu.out",
                                    "aten::max_pool2d_with_indices.out", "aten::mean.out",
                                    "aten::addmm.out"},
    ("mlp_mnist", "cortex_m_int8"): {"cortex_m::quantize_per_tensor.out",
                                     "cortex_m::quantized_linear.out",
                                     "cortex_m::dequantize_per_tensor.out"},
    ("tiny_cnn", "cortex_m_int8"): {"cortex_m::quantize_per_tensor.out",
                                    "cortex_m::quantized_conv2d.out",
                                    "cortex_m::quantized_max_pool2d.out",
                                    "cortex_m::quantized_avg_pool2d.out",
                                    "cortex_m::quantized_linear.out",
                                    "cortex_m::dequantize_per_tensor.out"},
}
CASES = sorted(EXPECTED_OPS)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[tuple[str, str], ExportResult]:
    results = {}
    for name, flow in CASES:
        spec = load_model(name, REPO)
        out = tmp_path_factory.mktemp(f"{name}-{flow}")
        results[(name, flow)] = export(spec, flow, out, cpu="cortex-m55")
    return results


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_files_and_report(exports, case):
    r = exports[case]
    name, flow = case
    for p in (r.pte_path, r.report_path, r.reference_path, r.ops_yaml_path):
        assert p.is_file() and p.stat().st_size > 0, p
    assert not (r.pte_path.parent / ERROR_LOG_NAME).exists()
    # no temp files left behind by the atomic writes
    assert not [p for p in r.pte_path.parent.iterdir() if p.name.startswith(".")]

    info = read_pte_info(r.pte_path)  # parses as an ExecuTorch program
    assert info.num_delegates == 0
    assert r.pte_size == r.pte_path.stat().st_size
    assert set(info.operators) == set(r.op_list)

    report = json.loads(r.report_path.read_text())
    assert report["flow"] == flow and report["model"] == name
    assert report["op_list"] == r.op_list
    assert report["pte"]["size"] == r.pte_size
    assert report["reference"]["kind"] == r.reference_kind
    assert report["export_seconds"] > 0 and report["timings"]
    assert report["versions"]["executorch"].startswith("1.4.1")
    assert [o["shape"] for o in report["outputs"]] == [[1, 10]]
    assert report["warnings"] == []

    assert parse_ops_yaml(r.ops_yaml_path) == r.op_list
    assert "dk-oplist" not in r.ops_yaml_path.read_text()  # no temp path: reproducible

    with np.load(r.reference_path) as npz:
        expected_files = ["eager_output_0", "input_0", "output_0"]
        if flow == "cortex_m_int8":  # the PT2E simulation, kept beside the integer reference
            expected_files.append("pt2e_output_0")
        assert sorted(npz.files) == expected_files
        np.testing.assert_array_equal(npz["input_0"], r.inputs[0])
        np.testing.assert_array_equal(npz["output_0"], r.host_outputs[0])
    assert r.inputs[0].dtype == np.float32 and r.host_outputs[0].dtype == np.float32


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_op_list(exports, case):
    r = exports[case]
    assert set(r.op_list) == EXPECTED_OPS[case]
    if case[1] == "portable_fp32":
        assert all(o.startswith("aten::") for o in r.op_list)
        # constant_prop_pass folded the Linear weight transposes
        assert "aten::permute_copy.out" not in r.kernel_calls
    else:
        assert all(o.startswith("cortex_m::") for o in r.op_list)


def test_fp32_reference_is_pybindings_and_matches_eager(exports):
    from executorch.runtime import Runtime

    for name in ("mlp_mnist", "tiny_cnn"):
        r = exports[(name, "portable_fp32")]
        assert r.reference_kind == "executorch-pybindings"
        # re-running the written .pte reproduces the reference exactly
        method = Runtime.get().load_program(r.pte_path.read_bytes()).load_method("forward")
        out = method.execute([torch.from_numpy(a) for a in r.inputs])
        np.testing.assert_array_equal(out[0].numpy(), r.host_outputs[0])
        assert r.eager_max_abs_diff <= 1e-5
        np.testing.assert_allclose(r.host_outputs[0], r.eager_outputs[0], atol=1e-5, rtol=0)
        assert r.input_dim_orders == [list(range(r.inputs[0].ndim))]
        assert r.output_quant == [None]


def test_int8_reference_close_to_eager(exports):
    for name in ("mlp_mnist", "tiny_cnn"):
        r = exports[(name, "cortex_m_int8")]
        # The integer reference of the cortex_m ops, bit-exact with PT2E on these small models.
        assert r.reference_kind == "cortex_m-integer-reference"
        assert r.report_path.exists()
        ref, eager = r.host_outputs[0], r.eager_outputs[0]
        out_range = float(eager.max() - eager.min())
        # quantization error: within 3% of the output range and 3 output steps
        assert r.eager_max_abs_diff <= 0.03 * out_range
        q = r.output_quant[0]
        assert q is not None and q.dtype == "int8" and q.qmin == -128 and q.qmax == 127
        assert r.eager_max_abs_diff <= 3 * q.scale
        # outputs are dequantized int8: on the output grid
        steps = ref / q.scale + q.zero_point
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
        assert r.input_quant[0] is not None
        # the cortex_m ops' integer reference code agrees bit for bit with PT2E
        check = json.loads(r.report_path.read_text())["reference"]["cortex_m_dialect_check"]
        assert check["ran"] and check["bit_exact"], check
        assert r.tolerance_source == "model"


def test_int8_conv_input_is_channels_last(exports):
    r = exports[("tiny_cnn", "cortex_m_int8")]
    assert r.input_dim_orders == [[0, 2, 3, 1]]
    report = json.loads(r.report_path.read_text())
    assert report["inputs"][0]["dim_order"] == [0, 2, 3, 1]
    assert report["inputs"][0]["shape"] == [1, 3, 8, 8]
    x = r.inputs[0]
    raw = np.frombuffer(memory_order_bytes(x, r.input_dim_orders[0]), dtype=np.float32)
    np.testing.assert_array_equal(raw, x.transpose(0, 2, 3, 1).ravel())
    # the fp32 export of the same model takes plain NCHW
    assert exports[("tiny_cnn", "portable_fp32")].input_dim_orders == [[0, 1, 2, 3]]


def test_int8_target_cpu_changes_the_program(tmp_path, exports):
    """M33 (DSP) needs linear biases where M55 (MVE) takes precomputed kernel sums."""
    spec = load_model("mlp_mnist", REPO)
    r33 = export(spec, "cortex_m_int8", tmp_path, cpu="cortex-m33")
    r55 = exports[("mlp_mnist", "cortex_m_int8")]
    assert r33.op_list == r55.op_list
    assert r33.pte_sha256 != r55.pte_sha256
    report = json.loads(r33.report_path.read_text())
    assert report["cortex_m_target"] == {"cpu": "cortex-m33", "cmsis_nn_backend": "DSP",
                                         "one_channel_depthwise_as_conv": 0,
                                         "one_channel_layout_clones_removed": 0,
                                         "in_place": []}
    np.testing.assert_array_equal(r33.host_outputs[0], r55.host_outputs[0])


def test_failed_export_leaves_no_pte(tmp_path):
    model_file = tmp_path / "dynamic.py"
    model_file.write_text(textwrap.dedent("""
        import torch

        class Branchy(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:  # data-dependent Python control flow: not exportable
                    return x * 2
                return x - 1

        def model():
            return Branchy()

        def example_inputs():
            return (torch.linspace(-1, 2, 8).reshape(1, 8),)
    """))
    spec = load_model(str(model_file), REPO)
    out = tmp_path / "out"
    out.mkdir()
    for stale in ("model.pte", "export.json", "ops.yaml", "reference.npz"):
        (out / stale).write_bytes(b"stale")
    with pytest.raises(ExportError) as e:
        export(spec, "portable_fp32", out)
    assert "torch.export" in str(e.value)
    assert e.value.exit_code == ExitCode.EXPORT
    assert e.value.log_path and Path(e.value.log_path).is_file()
    assert sorted(p.name for p in out.iterdir()) == [ERROR_LOG_NAME]


def test_bad_flow_and_cpu(tmp_path):
    spec = load_model("mlp_mnist", REPO)
    with pytest.raises(ConfigError, match="Unknown flow"):
        export(spec, "int4", tmp_path)
    with pytest.raises(ConfigError, match="not a Cortex-M CPU"):
        export(spec, "cortex_m_int8", tmp_path, cpu="cortex-a53")
    with pytest.raises(ConfigError, match="not supported by the ExecuTorch Cortex-M backend"):
        export(spec, "cortex_m_int8", tmp_path, cpu="cortex-m99")
    assert list(tmp_path.iterdir()) == []


def test_load_export_round_trips(tmp_path):
    from deploykit.program.export import load_export

    r = export(load_model("mlp_mnist", REPO), "portable_fp32", tmp_path)
    again = load_export(tmp_path)
    assert again is not None
    assert again.op_list == r.op_list and again.tolerance == r.tolerance
    for a, b in zip(again.host_outputs, r.host_outputs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert again.input_dim_orders == r.input_dim_orders
    (tmp_path / "export.json").unlink()
    assert load_export(tmp_path) is None
