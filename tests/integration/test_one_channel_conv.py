"""A convolution over one input channel is exported as a plain CMSIS-NN convolution
(flows/one_channel_conv.py), with the same integer results as the depthwise form it replaces."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from deploykit import api
from deploykit.flows import cortex_m_int8
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

# A 1-channel stem (as ds_cnn's first layer) and a real depthwise layer, which must stay one.
STEM = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(1, 16, (5, 3), stride=2, padding=1)
            self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.fc = nn.Linear(16 * 9 * 4, 6)

        def forward(self, x):
            x = torch.relu(self.depthwise(torch.relu(self.stem(x))))
            return self.fc(torch.flatten(x, 1))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        t = torch.arange(19 * 8, dtype=torch.float32).reshape(1, 1, 19, 8)
        return (torch.sin(t / 7) + torch.cos(t / 3),)
""")


def _export(tmp_path, name: str, board: str = "qemu-an505"):
    model = tmp_path / "stem.py"
    model.write_text(STEM)
    result = api.export(board, str(model), "cortex_m_int8", tmp_path / name)
    report = json.loads(result.report_path.read_text())
    return result, report


def test_the_one_channel_stem_is_a_convolution_with_the_same_integers(tmp_path, monkeypatch):
    result, report = _export(tmp_path, "rewritten")
    assert report["cortex_m_target"]["one_channel_depthwise_as_conv"] == 1
    assert result.kernel_calls["cortex_m::quantized_conv2d.out"] == 1
    assert result.kernel_calls["cortex_m::quantized_depthwise_conv2d.out"] == 1  # the real one

    # The same export without the rewrite: the stem is a depthwise convolution with a channel
    # multiplier of 16. The cortex_m ops' integer reference (CMSIS-NN's arithmetic) gives
    # identical outputs for both programs.
    monkeypatch.setattr(cortex_m_int8, "one_channel_depthwise_as_conv", lambda ep, cpu: 0)
    plain, plain_report = _export(tmp_path, "depthwise")
    assert plain.kernel_calls["cortex_m::quantized_depthwise_conv2d.out"] == 2
    assert "cortex_m::quantized_conv2d.out" not in plain.kernel_calls
    assert result.reference_kind == plain.reference_kind == "cortex_m-integer-reference"
    for ours, theirs in zip(result.host_outputs, plain.host_outputs, strict=True):
        np.testing.assert_array_equal(ours, theirs)


@requires_toolchain
@requires_cmake
@requires_qemu
@requires_sources
@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_the_rewritten_stem_runs_bit_exact(tmp_path, board):
    model = tmp_path / "stem.py"
    model.write_text(STEM)
    report = api.run(board, str(model), flow="cortex_m_int8", out=tmp_path / "out")
    assert report.passed, report.summary()
    assert all(o.max_abs_error == 0 for o in report.verdict.outputs)
