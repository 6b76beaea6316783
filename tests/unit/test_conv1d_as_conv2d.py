"""The Conv1d -> Conv2d-of-height-1 rewrite of the cortex_m flow (flows/conv1d_as_conv2d.py),
on float graphs: the rewritten graph computes what the model computes, its convolutions are
2-D with their own 4-D weight parameters, and what it cannot take it leaves, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from deploykit.flows.conv1d_as_conv2d import (
    Conv1dRewrite,
    conv1d_as_conv2d,
    describe,
    one_by_n_refuses,
)

HERE = Path(__file__)
ATEN = torch.ops.aten


def _rewrite(module: nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, Conv1dRewrite]:
    graph_module = torch.export.export(module.eval(), (x,)).module(check_guards=False)
    return graph_module, conv1d_as_conv2d(graph_module, HERE)


def _targets(graph_module: torch.fx.GraphModule) -> list:
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


class Single(nn.Module):
    def __init__(self, conv: nn.Conv1d, activation: nn.Module | None = None):
        super().__init__()
        self.conv = conv
        self.activation = activation or nn.Identity()

    def forward(self, x):
        return self.activation(self.conv(x))


VARIANTS = {
    "plain": (nn.Conv1d(4, 8, 3), 16),
    "stride 2, padding 1": (nn.Conv1d(4, 8, 5, stride=2, padding=1), 17),
    "dilation 3": (nn.Conv1d(4, 6, 3, dilation=3, padding=3), 20),
    "groups 2, no bias": (nn.Conv1d(4, 8, 3, groups=2, bias=False), 12),
    "depthwise": (nn.Conv1d(8, 8, 3, groups=8, padding=1), 10),
    "depthwise, multiplier 2": (nn.Conv1d(4, 8, 3, groups=4), 10),
    "padding same": (nn.Conv1d(4, 8, 5, padding="same", dilation=2), 16),
    "padding valid": (nn.Conv1d(4, 8, 3, padding="valid"), 9),
    "kernel 1, stride 3": (nn.Conv1d(4, 8, 1, stride=3), 11),
    "reflect padding": (nn.Conv1d(4, 8, 3, padding=1, padding_mode="reflect"), 16),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rewritten_graph_equals_the_model(name):
    torch.manual_seed(0)
    conv, length = VARIANTS[name]
    module = Single(conv, nn.ReLU())
    x = torch.randn(2, conv.in_channels, length)
    graph_module, result = _rewrite(module, x)
    assert len(result.rewritten) == 1 and result.left == ()
    targets = _targets(graph_module)
    assert ATEN.conv1d.default not in targets and ATEN.conv1d.padding not in targets
    conv2d = next(n for n in graph_module.graph.nodes if n.target == ATEN.conv2d.default)
    _, weight, _, stride, padding, dilation, groups = conv2d.args
    assert weight.op == "get_attr"  # a parameter of its own, which PT2E quantizes
    w2 = graph_module.get_parameter(weight.target)
    assert w2.shape == (conv.out_channels, conv.in_channels // conv.groups, 1, conv.kernel_size[0])
    assert torch.equal(w2[:, :, 0, :], conv.weight.detach())
    assert stride == [1, conv.stride[0]] and dilation == [1, conv.dilation[0]]
    assert groups == conv.groups and padding[0] == 0
    # The convolution reads a channels-last tensor (what the Cortex-M quantizer accepts), and
    # the ReLU after it is moved before the copy out, where it fuses.
    assert conv2d.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert next(iter(conv2d.users)).target == ATEN.relu.default
    # The 1-D weight is gone: it would be exported (and stored) for nothing.
    assert not any(p.dim() == 3 for p in graph_module.parameters())
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), module(x), rtol=1e-5, atol=1e-5)


def test_an_unbatched_input():
    torch.manual_seed(0)
    module = Single(nn.Conv1d(3, 5, 3, padding=1))
    x = torch.randn(3, 12)  # nn.Conv1d takes (C, L) as a batch of one
    graph_module, result = _rewrite(module, x)
    assert len(result.rewritten) == 1
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), module(x), rtol=1e-5, atol=1e-5)


def test_a_chain_has_no_copies_between_its_convolutions():
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Conv1d(10, 16, 3, padding=1),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Conv1d(16, 16, 3, groups=16, padding=2, dilation=2),
        nn.ReLU6(),
        nn.Conv1d(16, 24, 1, stride=2),
    ).eval()
    module[1].running_mean.uniform_(-1, 1)
    module[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 10, 49)
    graph_module, result = _rewrite(module, x)
    assert result.rewritten == ("module 0", "module 3", "module 5")
    targets = _targets(graph_module)
    assert targets.count(ATEN.conv2d.default) == 3
    # One copy into channels-last at the start and one out at the end: the BatchNorm and
    # the activations stay in 4-D, between the convolutions.
    assert targets.count(ATEN.clone.default) == 2
    copy_out = len(targets) - 1 - targets[::-1].index(ATEN.clone.default)
    assert targets.index(ATEN.batch_norm.default) < copy_out
    assert targets.index(ATEN.hardtanh.default) < copy_out  # the ReLU6
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), module(x), rtol=1e-5, atol=1e-5)


class Functional(nn.Module):
    """F.conv1d with a parameter weight (rewritten), with a computed weight and with an
    uneven 'same' padding (both left as they are)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, 3))
        self.even = nn.Parameter(torch.randn(6, 4, 4))

    def forward(self, x):
        a = nn.functional.conv1d(x, self.weight, stride=2)
        b = nn.functional.conv1d(x, self.weight * 0.5, stride=2)
        c = nn.functional.conv1d(x, self.even, padding="same")
        return a + b, c


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_what_it_cannot_take_stays_and_is_named():
    torch.manual_seed(0)
    module = Functional()
    x = torch.randn(1, 4, 15)
    graph_module, result = _rewrite(module, x)
    assert len(result.rewritten) == 1 and result.rewritten[0].startswith(f"{HERE.name}:")
    assert len(result.left) == 2
    assert "weight is computed" in result.left[0] and "padding='same'" in result.left[1]
    assert _targets(graph_module).count(ATEN.conv2d.default) == 1
    with torch.no_grad():
        for got, want in zip(graph_module(x), module(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    lines = describe(result.report())
    assert lines[0] == f"Conv1d lowered as Conv2d of height 1: 1 layer ({result.rewritten[0]})"
    assert lines[1].startswith("Conv1d left in float: ")


def test_a_model_without_conv1d_is_untouched():
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    graph_module, result = _rewrite(module, torch.randn(1, 3, 8, 8))
    assert result == Conv1dRewrite((), ()) and result.report() == {}
    assert ATEN.clone.default not in _targets(graph_module)


def test_a_padding_cmsis_nn_1xn_refuses_runs_as_a_column():
    # Issue #32: Conv1d(40, 32, k5, s2, p2) over 50 samples uses 3 of its 4 padded samples;
    # arm_convolve_1_x_n_s8 (MVE) returns ARM_CMSIS_NN_FAILURE for that, so the layer becomes
    # a Conv2d of width 1 (the same NHWC bytes), which the general convolution takes.
    assert one_by_n_refuses(50, 40, 5, 2, 2, 1, 1)
    assert not one_by_n_refuses(49, 40, 5, 2, 2, 1, 1)  # every padded sample used
    assert not one_by_n_refuses(50, 40, 5, 1, 2, 1, 1)  # stride 1: always symmetric
    assert not one_by_n_refuses(50, 40, 5, 2, 2, 2, 1)  # dilated: not the 1xN kernel
    assert not one_by_n_refuses(50, 32, 3, 1, 2, 1, 32)  # depthwise: not the 1xN kernel
    assert not one_by_n_refuses(50, 3, 5, 2, 2, 1, 1)  # stride x channels not a multiple of 4
    torch.manual_seed(0)
    conv = nn.Conv1d(40, 32, 5, stride=2, padding=2)
    module = Single(conv, nn.ReLU())
    x = torch.randn(1, 40, 50)
    graph_module, result = _rewrite(module, x)
    assert len(result.rewritten) == 1 and result.rewritten[0].endswith("(as a column)")
    conv2d = next(n for n in graph_module.graph.nodes if n.target == ATEN.conv2d.default)
    _, weight, _, stride, padding, dilation, _ = conv2d.args
    assert graph_module.get_parameter(weight.target).shape == (32, 40, 5, 1)
    assert stride == [2, 1] and padding == [2, 0] and dilation == [1, 1]
    assert conv2d.args[0].meta["val"].shape == (1, 40, 50, 1)
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), module(x), rtol=1e-5, atol=1e-5)


def test_a_chain_across_orientations():
    # A column layer feeding a row layer (and back) goes through the 3-D signal between them.
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Conv1d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv1d(8, 8, 5, stride=2, padding=2),
        nn.Conv1d(8, 8, 3, padding=1),
    )
    x = torch.randn(1, 8, 50)
    graph_module, result = _rewrite(module, x)
    assert [r.endswith("(as a column)") for r in result.rewritten] == [False, True, False]
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), module(x), rtol=1e-5, atol=1e-5)
