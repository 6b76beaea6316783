"""A Conv1d model in int8 on both QEMU boards: lowered as a Conv2d of height 1, built with
`--strict` (no float island), run, and compared with the host's integer reference.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from deploykit import api
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

# A 1-D keyword-spotting front end: 10 MFCCs over 49 frames, a Conv1d with BatchNorm and ReLU,
# a dilated depthwise Conv1d, a strided pointwise Conv1d, and a classifier over the flattened
# features (a flatten, not a mean over time: that has no cortex_m kernel).
KWS1D = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(10, 16, 3, padding=1)
            self.bn = nn.BatchNorm1d(16)
            self.dw = nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=16)
            self.pw = nn.Conv1d(16, 8, 1, stride=2)
            self.fc = nn.Linear(8 * 25, 12)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = torch.relu(self.dw(x))
            return self.fc(torch.flatten(torch.relu(self.pw(x)), 1))

    def model():
        torch.manual_seed(0)
        net = Net().eval()
        net.bn.running_mean.uniform_(-0.1, 0.1)
        net.bn.running_var.uniform_(0.5, 1.5)
        return net

    def example_inputs():
        t = torch.arange(49, dtype=torch.float32)
        return (torch.stack([torch.sin(t / (3 + k)) * (1 - k / 12) for k in range(10)])[None],)
""")


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_conv1d_model_runs_in_cmsis_nn_and_matches_the_host(tmp_path_factory, board):
    model = tmp_path_factory.mktemp("conv1d") / "kws1d.py"
    model.write_text(KWS1D)
    out = tmp_path_factory.getbasetemp() / "conv1d" / board
    report = api.run(board, str(model), flow="cortex_m_int8", out=out, timeout=300, strict=True)
    assert report.passed, report.summary()
    assert report.verdict is not None
    for o in report.verdict.outputs:
        assert o.max_abs_error <= o.tolerance.atol
    exported = json.loads((out / "export" / "export.json").read_text())
    ops = exported["op_list"]
    assert "cortex_m::quantized_conv2d.out" in ops
    assert "cortex_m::quantized_depthwise_conv2d.out" in ops
    assert not [o for o in ops if o.startswith("aten::")]  # nothing computes in float
    assert exported["mixed_precision"]["conv1d_as_conv2d"] == [
        "kws1d.py:15",
        "kws1d.py:16",
        "kws1d.py:17",
    ]
    assert "Conv1d lowered as Conv2d of height 1: 3 layers" in report.summary()
