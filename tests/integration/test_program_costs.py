"""MACs, the activation lower bound, fallbacks and float islands, read from real exports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from deploykit import api
from deploykit.util.errors import ConfigError


def test_int8_autoencoder_costs(tmp_path):
    """The smallest MLPerf Tiny model stands for the four in CI (each export is ~30 s)."""
    from torch.utils.flop_counter import FlopCounterMode

    from deploykit.program.models import load_model
    from deploykit.readers.boards import repo_root

    result = api.export("qemu-an505", "deep_autoencoder", "cortex_m_int8", tmp_path)
    info = api.inspect(result.pte_path)
    spec = load_model("deep_autoencoder", repo_root())
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        spec.module(*spec.example_inputs)
    assert info.macs == counter.get_total_flops() // 2 == 264_192
    # CMSIS-NN kernels are the flow's target, not CPU fallbacks.
    assert "cortex_m::quantized_linear.out" in info.cpu_ops
    assert info.cpu_fallback_ops == () and info.islands == ()
    bound = info.costs.activation_lower_bound
    assert 0 < bound <= info.planned_total
    text = api.describe_program(info)
    assert "MACs per inference: 264,192" in text and "lower bound" in text


CONV1D = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 8, 3)
            self.fc = nn.Linear(8 * 14, 5)

        def forward(self, x):
            return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        return (torch.sin(torch.arange(64, dtype=torch.float32) / 5).reshape(1, 4, 16),)
""")


def test_conv1d_runs_as_a_cmsis_nn_conv2d_and_strict_takes_it(tmp_path):
    model = tmp_path / "kws1d.py"
    model.write_text(CONV1D)
    result = api.export("qemu-an505", str(model), "cortex_m_int8", tmp_path / "out", strict=True)
    assert "cortex_m::quantized_conv2d.out" in result.op_list
    assert "aten::convolution.out" not in result.op_list
    assert "aten::clamp.out" not in result.op_list  # the ReLU is fused into the convolution
    assert "Conv1d lowered as Conv2d of height 1: 1 layer (kws1d.py:12)" in (
        api.describe_export(result)
    )
    info = api.inspect(result.pte_path)
    assert not [i for i in info.islands if i.is_float]
    # What remains outside the CMSIS-NN kernels: the NCL <-> NHWC copies around it, int8.
    assert info.cpu_fallback_ops == ("dim_order_ops::_clone_dim_order.out",)
    assert [i.is_layout_copy for i in info.islands] == [True, True]
    assert info.macs == 8 * 14 * 4 * 3 + 8 * 14 * 5  # the convolution's MACs, now int8


ISLAND = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 8, 3)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=2))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        return (torch.sin(torch.arange(64, dtype=torch.float32) / 5).reshape(1, 4, 16),)
""")


def test_a_mean_over_time_is_a_float_island_and_strict_refuses_it(tmp_path):
    """The cortex_m flow has no kernel for a mean over the last axis of a 3-D tensor: it
    runs as the portable float aten::mean between a dequantize and a quantize."""
    model = tmp_path / "kws1d_mean.py"
    model.write_text(ISLAND)
    with pytest.raises(ConfigError) as err:
        api.export("qemu-an505", str(model), "cortex_m_int8", tmp_path / "out", strict=True)
    assert "float island" in str(err.value) and "aten::mean.out" in str(err.value)
    assert "layout copy" not in str(err.value)  # those keep the program int8
    assert "leave out --strict" in err.value.hint
    # Without --strict the same export stands, and inspect reports the island.
    info = api.inspect(Path(tmp_path / "out" / "export" / "model.pte"))
    float_islands = [i for i in info.islands if i.is_float]
    assert len(float_islands) == 1
    island = float_islands[0]
    assert island.ops == (
        "cortex_m::dequantize_per_tensor.out",
        "aten::mean.out",
        "cortex_m::quantize_per_tensor.out",
    )
    assert island.macs == 0
    assert "aten::mean.out" in info.cpu_fallback_ops
    assert "cortex_m::quantized_conv2d.out" in info.operators
