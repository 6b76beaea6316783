"""Per-operator profiling and numerical debugging for real: profiling firmware built against
the ExecuTorch sources and run on QEMU (needs the sources: DEPLOYKIT_WORKSPACE; the first run
builds the runtime with its EventTracer hooks, a few minutes)."""

from __future__ import annotations

import json

import pytest

from deploykit import api
from deploykit.pipeline.target import resolve_target
from deploykit.profiling.stage import debug_intermediates
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]


def _shares(report) -> dict[str, float]:
    p = report.profile
    return {r.operator: r.ticks / p.total_ticks for r in p.rows}


def test_mlp_int8_profile_on_an505(tmp_path):
    report = api.profile("qemu-an505", "mlp_mnist", "cortex_m_int8", out=tmp_path)
    p = report.profile
    assert p.unit == "instructions"  # SysTick under QEMU -icount
    shares = _shares(report)
    # The input quantize and the CMSIS-NN matmuls, adding up to execute() within 2%.
    assert shares["cortex_m::quantized_linear.out"] > 0.7
    assert 0.05 < shares["cortex_m::quantize_per_tensor.out"] < 0.3
    assert 0.98 <= p.operator_ticks / p.total_ticks <= 1.0
    # The tracer's cost is taken out: the profiling run's execute() without the tracer is the
    # plain firmware's, within 1%.
    assert p.runner_ticks == pytest.approx(report.plain_ticks, rel=0.01)
    assert report.ram is not None and 0 < report.ram.total <= 2048
    written = json.loads(report.files["profile.json"].read_text())
    assert written["operators"][0]["operator"] == "cortex_m::quantized_linear.out"
    assert report.files["etdump"].stat().st_size > 0
    assert report.files["etrecord"].is_file()
    chart = report.files["chart"].read_text()  # each text group's comment names its text
    assert all(f"<!-- {r.operator} -->" in chart for r in p.rows)


CUMSUM_ISLAND = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        # No int8 kernel for a running sum (and, not elementwise, no table either): a float
        # island.
        return self.b(torch.cumsum(self.a(x), dim=-1))


def model():
    torch.manual_seed(0)
    return Net().eval()


def example_inputs():
    return (torch.linspace(-1, 1, 16).reshape(1, 16),)
"""


def test_a_float_island_gets_its_share_of_execute(tmp_path):
    model = tmp_path / "cumsum_island.py"
    model.write_text(CUMSUM_ISLAND)
    report = api.profile("qemu-an505", str(model), "cortex_m_int8", out=tmp_path / "out")
    (island,) = report.islands
    assert island.is_float and "aten::cumsum.out" in island.description
    # Its time is that of its three instructions: the dequantize, cumsum and the quantize.
    p = report.profile
    times = {i.operator: i.ticks for i in p.instructions if i.operator == "aten::cumsum.out"}
    assert times["aten::cumsum.out"] < island.ticks < p.total_ticks
    names = [i.operator for i in p.instructions if i.ticks > 0]
    assert names.count("cortex_m::quantized_linear.out") == 2
    assert "of execute()" in report.text() and island.description in report.text()
    written = json.loads(report.files["profile.json"].read_text())
    assert written["islands"][0]["float"] is True
    assert written["islands"][0]["share"] == pytest.approx(island.ticks / p.total_ticks)
    assert "<pattern" in report.files["chart"].read_text()  # the island's bar is hatched


def test_tiny_cnn_fp32_profile_on_an547(tmp_path):
    report = api.profile("qemu-an547", "tiny_cnn", "portable_fp32", out=tmp_path)
    p = report.profile
    assert p.rows[0].operator == "aten::convolution.out" and p.rows[0].kernel == "portable"
    assert _shares(report)["aten::convolution.out"] > 0.9
    assert 0.98 <= p.operator_ticks / p.total_ticks <= 1.0
    assert p.runner_ticks == pytest.approx(report.plain_ticks, rel=0.01)


def test_debug_intermediates_names_the_operator_with_a_changed_scale(tmp_path):
    from tests.perturb import perturb_requantize_scale

    target = resolve_target("qemu-an505", flow="cortex_m_int8")
    clean = debug_intermediates(target, "mlp_mnist", tmp_path, None, 120.0, lambda _m: None)
    assert clean.intermediates.first_divergence is None
    assert len(clean.intermediates.rows) == 5
    # The device runs the same program with the second linear layer's output scale changed by
    # 20% after quantization; the host runs the export's.
    pte = (tmp_path / "export" / "model.pte").read_bytes()
    broken = debug_intermediates(
        target,
        "mlp_mnist",
        tmp_path,
        None,
        120.0,
        lambda _m: None,
        device_pte=perturb_requantize_scale(pte, 2, 0.8),
    )
    first = broken.intermediates.first_divergence
    assert first is not None
    assert (first.instruction, first.operator) == (2, "cortex_m::quantized_linear.out")
    assert [r.passed for r in broken.intermediates.rows[:2]] == [True, True]


def test_debug_intermediates_of_a_mobilenet_v3_block_on_an547(tmp_path):
    """A MobileNetV3 bottleneck in int8: CMSIS-NN scratch buffers the host must read as planned
    memory, and a squeeze-excite gate broadcast over the feature map in the program's
    channels-last layout (tests/unit/test_host_interpreter.py). Every operator agrees."""
    target = resolve_target("qemu-an547", flow="cortex_m_int8")
    report = debug_intermediates(target, "mobilenet_v3_block", tmp_path, None, 120.0,
                                 lambda _m: None)
    rows = report.intermediates.rows
    assert report.intermediates.first_divergence is None
    assert len(rows) == 14 and all(r.max_abs == 0 for r in rows)  # CMSIS-NN bit for bit
    assert [r.operator for r in rows].count("cortex_m::quantized_mul.out") == 3
