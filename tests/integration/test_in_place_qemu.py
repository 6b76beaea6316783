"""Layers written over their input (tools/deploykit/flows/in_place.py, run in bands by
firmware/kernels/cmsis_nn_in_place.c) give the host's outputs bit for bit on both QEMU boards:
3x3, 5x5 (two rows of top padding: on the M55 its bands are one row, so rows wait longer than
a band), 3x1 and 1x1 convolutions, 3x3 depthwise with dilation 1 and 2, a residual add and a
table lookup, on a map whose height is not a multiple of the M33's bands; and the activations
are planned at two maps (the residual's and the chain's) and the largest scratch, where each
layer beside its input would need three.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from deploykit import api
from deploykit.readers.pte_reader import load_program, method_plan, planned_buffers
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

CHANNELS, HEIGHT, WIDTH = 32, 13, 24
MAP_BYTES = CHANNELS * HEIGHT * WIDTH  # one int8 feature map

SAME_SHAPE_LAYERS = textwrap.dedent(f"""
    import torch
    from torch import nn

    C = {CHANNELS}

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, C, 3, padding=1)
            self.c3 = nn.Conv2d(C, C, 3, padding=1)
            self.c3b = nn.Conv2d(C, C, 3, padding=1)
            self.c5 = nn.Conv2d(C, C, 5, padding=2)
            self.c31 = nn.Conv2d(C, C, (3, 1), padding=(1, 0))
            self.dw = nn.Conv2d(C, C, 3, padding=1, groups=C)
            self.dw_dilated = nn.Conv2d(C, C, 3, padding=2, dilation=2, groups=C)
            self.pw = nn.Conv2d(C, C, 1)
            self.pw2 = nn.Conv2d(C, C, 1)
            self.head = nn.Linear(C, 10)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            y = torch.relu(self.c3(x))  # not in place: x lives on for the residual add
            y = torch.relu(self.c3b(y))
            y = torch.relu(self.c5(y))
            y = torch.relu(self.c31(y))
            y = torch.relu(self.dw(y))
            y = torch.relu(self.dw_dilated(y))
            y = self.pw(y)
            y = self.pw2(torch.nn.functional.gelu(y + x))
            y = nn.functional.avg_pool2d(y, ({HEIGHT}, {WIDTH}))  # int8, no float map
            return self.head(y.flatten(1))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        g = torch.Generator().manual_seed(1)
        return (torch.rand(1, 3, {HEIGHT}, {WIDTH}, generator=g),)
""")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("in_place") / "same_shape_layers.py"
    path.write_text(SAME_SHAPE_LAYERS)
    return path


def _planned_bytes(pte) -> int:
    program = load_program(pte.read_bytes(), str(pte))
    return sum(planned_buffers(method_plan(program, "forward", str(pte))))


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_layers_written_over_their_input_match_the_host(tmp_path, model_file, board):
    report = api.run(board, str(model_file), flow="cortex_m_int8", out=tmp_path,
                     timeout=300, project=False)
    assert report.passed, report.summary()
    assert report.verdict is not None
    assert all(o.max_abs_error == 0.0 for o in report.verdict.outputs), report.summary()
    exported = json.loads((tmp_path / "export" / "export.json").read_text())
    made = exported["cortex_m_target"]["in_place"]
    ops = sorted(entry["op"].split("::")[1] for entry in made)
    # c3b, c5, c31, pw; dw, dw_dilated; the residual add; the GELU table. Not c3 (x is read
    # later, by the add) nor pw2 (after the add only two maps are alive, below the peak).
    assert ops == (["quantized_activation.out", "quantized_add.out"]
                   + ["quantized_conv2d.out"] * 4 + ["quantized_depthwise_conv2d.out"] * 2), ops
    assert all(entry["ring"] > 0 for entry in made if "conv2d" in entry["op"]), made
    # The peak is the residual's map, the chain's one map (the layer's input and output) and
    # the largest scratch with its ring: planned exactly at that, where each layer beside its
    # input would need a third map.
    peak = 2 * MAP_BYTES + max(entry["scratch"] for entry in made)
    assert _planned_bytes(tmp_path / "export" / "model.pte") <= peak + 64
