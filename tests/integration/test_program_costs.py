"""MACs, the activation lower bound, fallbacks and float islands, read from real exports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from deploykit import api
from deploykit.errors import ConfigError


def test_int8_autoencoder_costs(tmp_path):
    """The smallest MLPerf Tiny model stands for the four in CI (each export is ~30 s)."""
    from torch.utils.flop_counter import FlopCounterMode

    from deploykit.boards import repo_root
    from deploykit.models import load_model

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


def test_conv1d_is_a_float_island_and_strict_refuses_it(tmp_path):
    model = tmp_path / "kws1d.py"
    model.write_text(CONV1D)
    with pytest.raises(ConfigError) as err:
        api.export("qemu-an505", str(model), "cortex_m_int8", tmp_path / "out", strict=True)
    assert "float island" in str(err.value) and "aten::convolution.out" in str(err.value)
    assert "Conv2d" in err.value.hint  # the way out is named
    # Without --strict the same export stands, and inspect reports the island with its cost.
    info = api.inspect(Path(tmp_path / "out" / "export" / "model.pte"))
    float_islands = [i for i in info.islands if i.is_float]
    assert len(float_islands) == 1
    island = float_islands[0]
    assert island.ops[0].startswith("cortex_m::dequantize_per_tensor")
    assert island.ops[-1].startswith("cortex_m::quantize_per_tensor")
    assert island.macs == 8 * 14 * 4 * 3  # output elements x kernel x input channels
    assert "aten::convolution.out" in info.cpu_fallback_ops
