"""In-place planning at export (tools/deploykit/flows/in_place.py), without a device: which
layers of a residual chain write over their input on the M55 (MVE) and the M33 (DSP), the
scratch each gets (the kernel's own and a ring of band + top-padding rows), and the plan at
its lower bound. The device side is tests/integration/test_in_place_qemu.py (needs sources).
About 20 s on 2 cores.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from deploykit.flows import in_place
from deploykit.program.export import export
from deploykit.program.models import load_model
from deploykit.readers.cmsis_nn_kernels import kernel_definitions
from deploykit.readers.pte_reader import (
    IN_PLACE_CONVOLUTIONS,
    in_place_convolutions,
    in_place_definition,
    kernel_calls,
    load_program,
    method_plan,
    planned_buffers,
)
from tests.integration.test_in_place_qemu import (
    CHANNELS,
    HEIGHT,
    MAP_BYTES,
    SAME_SHAPE_LAYERS,
    WIDTH,
)

# c3b, c5, c31, pw; dw, dw_dilated; the residual add; the GELU table. Not c3 (x is read
# later, by the add) nor pw2 (after the add only two maps are alive, below the peak).
IN_PLACE_OPS = (["quantized_activation.out", "quantized_add.out"]
                + ["quantized_conv2d.out"] * 4 + ["quantized_depthwise_conv2d.out"] * 2)


def _scratch_sizes(pte) -> tuple[list[int], int]:
    """Bytes of the scratch argument of each convolution call, in order, and the planned
    bytes."""
    program = load_program(pte.read_bytes(), str(pte))
    plan = method_plan(program, "forward", str(pte))
    sizes = [math.prod(plan.values[args[-3]].val.sizes)  # (..., scratch, out, what it returns)
             for name, args in kernel_calls(plan) if name in IN_PLACE_CONVOLUTIONS]
    return sizes, sum(planned_buffers(plan))


@pytest.mark.parametrize("cpu", ["cortex-m55", "cortex-m33"])
def test_a_residual_chain_is_planned_in_place(tmp_path, cpu):
    model_file = tmp_path / "same_shape_layers.py"
    model_file.write_text(SAME_SHAPE_LAYERS)
    result = export(load_model(str(model_file), tmp_path), "cortex_m_int8", tmp_path / "out",
                    cpu=cpu)
    made = json.loads(result.report_path.read_text())["cortex_m_target"]["in_place"]
    assert sorted(entry["op"].split("::")[1] for entry in made) == IN_PLACE_OPS
    assert all(entry["saved"] == MAP_BYTES for entry in made), made
    row = WIDTH * CHANNELS
    for entry in made:
        if "conv2d" in entry["op"]:
            # A ring of whole rows: at least a band of one row and the top padding.
            assert entry["ring"] % row == 0 and entry["ring"] >= row, entry
            assert entry["scratch"] >= entry["ring"], entry
        else:
            assert entry["ring"] == entry["scratch"] == 0, entry
    scratches, planned = _scratch_sizes(result.pte_path)
    # Every in-place convolution's scratch is in the program at the size the report gives.
    reported = Counter(e["scratch"] for e in made if "conv2d" in e["op"])
    assert not reported - Counter(scratches), (reported, scratches)
    assert planned <= 2 * MAP_BYTES + max(e["scratch"] for e in made) + 64
    # The firmware build reads the same from the program: its bands are linked in.
    program = load_program(result.pte_path.read_bytes(), str(result.pte_path))
    assert in_place_convolutions(program) == 6
    assert in_place_definition([result.pte_path]) == {"DK_CMSIS_NN_IN_PLACE": "ON"}
    # The CMSIS-NN kernels the firmware links, as the wrappers would pick them: the 1x1 layer's
    # fast path and the generic convolution for the rest; the 3x3 depthwise layer's kernel of
    # the CPU's path, and the generic one for the dilated layer.
    mve = cpu == "cortex-m55"
    assert kernel_definitions([result.pte_path], mve=mve) == {
        "DK_CMSIS_NN_CONVOLUTION": "1x1_fast;generic",
        "DK_CMSIS_NN_DEPTHWISE": "opt;generic" if mve else "3x3;generic"}


SMALL_AFTER_LARGE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.large = nn.Conv2d(3, 16, 3, padding=1)
        self.small = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.large(x)), 4)
        y = torch.relu(self.small(y))
        return self.head(nn.functional.avg_pool2d(y, 4).flatten(1))

def model():
    torch.manual_seed(0)
    return Net().eval()

def example_inputs():
    return (torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
"""


def test_a_convolution_away_from_the_peak_stays_out_of_place(tmp_path):
    # `small` could write over its input, but the peak is at `large` (its 16x16 map): bands
    # there would cost instructions and save nothing.
    model_file = tmp_path / "small_after_large.py"
    model_file.write_text(SMALL_AFTER_LARGE)
    result = export(load_model(str(model_file), tmp_path), "cortex_m_int8", tmp_path / "out",
                    cpu="cortex-m55")
    assert json.loads(result.report_path.read_text())["cortex_m_target"]["in_place"] == []
    # ... so its firmware leaves the bands' code out.
    assert in_place_definition([result.pte_path]) == {"DK_CMSIS_NN_IN_PLACE": "OFF"}


def test_band_rows():
    # MVE: bands of at least BAND_PIXELS pixels; one row once a row has that many.
    assert in_place.BAND_PIXELS == 16
    assert in_place._band_rows("conv", True, 32, 32, 16, [16, 3, 3, 16]) == 1
    assert in_place._band_rows("conv", True, 25, 5, 64, [64, 1, 1, 64]) == 4
    # DS-CNN's depthwise layer (166 k instructions at 2.3 per MAC) affords 6 bands: 5 rows.
    assert in_place._band_rows("depthwise", True, 25, 5, 64, [1, 3, 3, 64]) == 5
    # DSP: a 1x1 64->64 convolution sums its 4 KiB filter again on every band, so DS-CNN's
    # 25x5 map runs in two bands, not seven.
    assert in_place._band_rows("conv", False, 25, 5, 64, [64, 1, 1, 64]) == 13
    # Never more rows than the map.
    assert in_place._band_rows("conv", False, HEIGHT, 1, 4, [4, 1, 1, 4]) == HEIGHT
