"""The four MLPerf Tiny models: int8 parity on both QEMU boards, Ethos-U export and inspect.

The QEMU runs need the ExecuTorch sources (`deploykit setup`): CI has none, so they skip
there with the reason (they take about 40 s each). The Ethos-U export needs only the Python
stack (Vela); one stands in CI.
"""

from __future__ import annotations

import pytest

from deploykit import api
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

MODELS = ["ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder"]
MACS = {
    "ds_cnn": 2_656_768,
    "mobilenet_v1_025": 7_489_664,
    "resnet8": 12_501_632,
    "deep_autoencoder": 264_192,
}


@requires_toolchain
@requires_cmake
@requires_qemu
@requires_sources
@pytest.mark.slow
@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
@pytest.mark.parametrize("model", MODELS)
def test_int8_parity_on_qemu(tmp_path_factory, board, model):
    out = tmp_path_factory.getbasetemp() / "mlperf" / board / model
    report = api.run(board, model, flow="cortex_m_int8", out=out, profile="speed")
    assert report.passed, report.summary()
    for o in report.verdict.outputs:
        assert o.max_abs_error <= o.tolerance.atol and o.top1_agrees is not False
    assert report.instructions_estimate and report.instructions_estimate > MACS[model] / 16
    info = api.inspect(out / "export" / "model.pte")
    assert info.macs == MACS[model]
    assert info.cpu_fallback_ops == () and info.islands == ()
    # The goal for the activation plan (flows/memory_planning.py).
    assert info.planned_total <= 1.05 * info.costs.activation_lower_bound


def test_ethos_u_export_and_inspect(tmp_path):
    """ds_cnn on the U55 stands for the eight Ethos-U exports (30-60 s each), which
    `deploykit matrix --flows ethos_u_int8` makes."""
    model = "ds_cnn"
    result = api.export("corstone-300", model, "ethos_u_int8", tmp_path)
    info = api.inspect(result.pte_path)
    assert len(info.delegates) == 1 and info.delegates[0].backend == "EthosUBackend"
    assert info.cpu_fallback_ops == ()  # only the quantize/dequantize at the model's edges
    estimate = info.delegates[0].vela_estimate
    assert estimate is not None and estimate.total_cycles > 0
    # Vela counts the MACs itself (pooling included): within 1% of the graph's count.
    assert info.macs == pytest.approx(MACS[model], rel=0.01)
    assert info.max_scratch > 0
