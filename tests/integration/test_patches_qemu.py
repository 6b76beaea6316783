"""Patches in int8 on both QEMU boards: a small image model whose first stage runs in tiles
gives, on the device, the outputs of the program without patches, bit for bit, and the
planned activations shrink, whether the tiles recompute their overlap (a stage with a
residual add, a grid of several rows) or carry it from tile to tile (a row over a chain).

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from deploykit import api
from deploykit.program.export import load_export
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

def _model_file(layers: str, size: int) -> str:
    """A model file: the conv-BN-ReLU6 helper, `layers` (a Net with a `features` stage),
    seeded BatchNorm statistics, and a size x size input with its calibration set."""
    return textwrap.dedent("""
        import torch
        from torch import nn

        def cbr(cin, cout, k, s, groups=1):
            return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU6())
        """) + textwrap.dedent(layers) + textwrap.dedent(f"""
        def model():
            torch.manual_seed(0)
            net = Net().eval()
            for m in net.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
            return net

        def example_inputs():
            g = torch.Generator().manual_seed(1)
            return (torch.rand(1, 3, {size}, {size}, generator=g),)

        def calibration_inputs():
            g = torch.Generator().manual_seed(2)
            return [example_inputs(),
                    *((torch.rand(1, 3, {size}, {size}, generator=g),) for _ in range(3))]
        """)


# The first layers of a MobileNet at 96x96: a strided stem, a depthwise-separable block with
# a max pooling, an inverted-residual block (a residual add inside the stage), then a global
# pool and a classifier (where tiling stops).
SMALL_CNN = _model_file("""
    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(cbr(c, 2 * c, 1, 1), cbr(2 * c, 2 * c, 3, 1, 2 * c),
                                      nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.body(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                cbr(3, 8, 3, 2), cbr(8, 8, 3, 1, 8), cbr(8, 16, 1, 1),
                nn.MaxPool2d(3, 2, 1), Residual(16), cbr(16, 32, 3, 2))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.features(x)), 1))
    """, 96)

# A chain (MobileNetV1's first layers at 128x128, large enough for the M55's depthwise scratch
# to be within the estimate's margin: a strided stem, depthwise-separable blocks, one
# strided): a single row of tiles carries its overlap from tile to tile (slices of the kept
# columns joined to each tile's own, padding only at the map's borders), recomputing only
# the few border columns.
CHAIN_CNN = _model_file("""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                cbr(3, 8, 3, 2), cbr(8, 8, 3, 1, 8), cbr(8, 16, 1, 1), cbr(16, 16, 3, 2, 16),
                cbr(16, 32, 1, 1), cbr(32, 32, 3, 1, 32), cbr(32, 32, 1, 1))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.features(x)), 1))
    """, 128)
MODELS = {"small_cnn": SMALL_CNN, "chain_cnn": CHAIN_CNN}


@pytest.mark.parametrize("model_name, grid, overlap", [
    ("small_cnn", "2x2", "recomputed"), ("chain_cnn", "1x4", "carried")])
@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_tiles_give_the_unpatched_programs_outputs_bit_for_bit(tmp_path_factory, board,
                                                                model_name, grid, overlap):
    model = tmp_path_factory.mktemp("patches") / f"{model_name}.py"
    model.write_text(MODELS[model_name])
    base = tmp_path_factory.getbasetemp() / "patches" / board / model_name
    untiled = api.export(board, str(model), flow="cortex_m_int8", out=base / "off",
                         profile="speed", project=False)
    report = api.run(board, str(model), flow="cortex_m_int8", out=base / "tiles",
                     profile="speed", patches=grid, timeout=300, project=False)
    assert report.passed, report.summary()
    assert report.verdict is not None
    # The device's outputs equal the host's integer reference of the tiled program...
    assert all(o.max_abs_error == 0.0 for o in report.verdict.outputs), report.summary()
    # ... which equals the program without patches, bit for bit, on the same int8 input.
    tiled = np.load(base / "tiles" / "export" / "reference.npz")
    plain = np.load(untiled.report_path.parent / "reference.npz")
    assert np.array_equal(tiled["input_0"], plain["input_0"])
    assert np.array_equal(tiled["output_0"], plain["output_0"])
    exported = json.loads((base / "tiles" / "export" / "export.json").read_text())
    patches = exported["patches"]
    assert patches["grid"] == grid
    assert patches["overlap"].startswith(overlap)
    if overlap == "carried":
        assert patches["tiled_stage_macs"] <= 1.02 * patches["stage_macs"]
    assert exported["planned_buffers"][-1] < untiled.planned_buffers[-1]
    # The estimate the grid was chosen by is near the plan (the CMSIS-NN scratch buffers,
    # planned too, are not in it).
    assert abs(exported["planned_buffers"][-1] - patches["estimated_peak"]) <= \
        0.1 * patches["estimated_peak"]
    assert f"patches: {grid} tiles" in api.describe_export(load_export(base / "tiles" /
                                                                       "export"))
