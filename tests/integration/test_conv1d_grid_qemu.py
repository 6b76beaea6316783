"""Every Conv1d shape the rewrite lowers runs in CMSIS-NN and matches the host bit for bit, on
both QEMU boards (issue #32: a shape CMSIS-NN's 1xN kernel refuses failed `execute()`).

The grid: kernel 1/3/5, stride 1/2, padding 0/same, dilation 1/2, with and without a
BatchNorm after it, for a plain convolution (8 -> 8 channels, groups 1), a depthwise one
(groups 8) and one over a single input channel (1 -> 8, the one-channel rewrite's
convolution). Each of the three is one model holding its 48 layers side by side, every layer
reading the input and giving an output of its own, so that one export and one build cover 48
cases (a build is about a minute, a QEMU run about a second). Built with `--strict`: no layer
may stay in float.

Needs the ExecuTorch sources (`deploykit setup`); skips without them.
"""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest

from deploykit import api
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

LENGTH = 20  # even: with stride 2 and padding 2 the right padding is left partly unread

# (kernel, stride, padding, dilation, batch norm); "same" with stride 2 is an explicit
# dilation * (kernel - 1) / 2 (PyTorch takes padding="same" with stride 1 only).
GRID = list(itertools.product((1, 3, 5), (1, 2), ("0", "same"), (1, 2), (False, True)))

KINDS = {
    "plain": (8, 8, 1),  # in channels, out channels, groups
    "depthwise": (8, 8, 8),
    "one_channel": (1, 8, 1),
}


def _padding(kernel: int, stride: int, padding: str, dilation: int) -> str:
    if padding == "0":
        return "0"
    return '"same"' if stride == 1 else str(dilation * (kernel - 1) // 2)


def grid_model(kind: str) -> str:
    cin, cout, groups = KINDS[kind]
    layers = "\n".join(
        f"            layer(nn.Conv1d({cin}, {cout}, {k}, stride={s}, "
        f"padding={_padding(k, s, p, d)}, dilation={d}, groups={groups}), {bn}),"
        for k, s, p, d, bn in GRID
    )
    return textwrap.dedent("""
        import torch
        from torch import nn

        def layer(conv, bn):
            return nn.Sequential(conv, nn.BatchNorm1d(conv.out_channels)) if bn else conv

        class Grid(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([
        {layers}
                ])

            def forward(self, x):
                return tuple(layer(x) for layer in self.layers)

        def model():
            torch.manual_seed(0)
            net = Grid().eval()
            for m in net.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
            return net

        def example_inputs():
            t = torch.arange({length}, dtype=torch.float32)
            return (torch.stack([torch.sin(t / (2 + c)) for c in range({cin})])[None],)
    """).format(layers=layers, length=LENGTH, cin=cin)


# The one-channel grid found a failure of its own (#32): execute() failed with InvalidArgument
# at instruction 1, the dim-order clone before the convolution (the execute_error record
# named it). flows/one_channel_conv.drop_one_channel_layout_clones removes that clone.
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_conv1d_grid_runs_in_cmsis_nn_bit_exact(tmp_path_factory, board, kind):
    model = tmp_path_factory.mktemp("grid") / f"conv1d_{kind}.py"
    model.write_text(grid_model(kind))
    out = tmp_path_factory.getbasetemp() / "conv1d_grid" / f"{board}-{kind}"
    report = api.run(board, str(model), flow="cortex_m_int8", out=out, timeout=300, strict=True)
    assert report.passed, report.summary()
    assert report.verdict is not None and len(report.verdict.outputs) == len(GRID)
    for o in report.verdict.outputs:
        assert o.max_abs_error == 0, report.summary()  # bit-exact, not within a tolerance
    exported = json.loads((out / "export" / "export.json").read_text())
    assert len(exported["mixed_precision"]["conv1d_as_conv2d"]) == len(GRID)
    assert not [o for o in exported["op_list"] if o.startswith("aten::")]
    if kind == "one_channel":  # the clones of the layers' one-channel input are gone
        assert exported["cortex_m_target"]["one_channel_layout_clones_removed"] >= 1
