"""The int8 3x3 depthwise convolutions on both QEMU boards against the host's integer
reference, bit for bit.

On the M33 (qemu-an505: DSP, no MVE) the depthwise layers in its domain run deploykit's DSP
kernel (firmware/kernels/cmsis_nn_depthwise_3x3_dsp.c), on the M55 (qemu-an547) those in its
domain its MVE kernel (cmsis_nn_depthwise_3x3_mve.c), both from dk_depthwise_conv_wrapper_s8 in
cmsis_nn_in_place.c, in place or not; the layers outside them run CMSIS-NN's kernels; the
host's reference runs CMSIS-NN's own C code. The first model covers 4, 12 and 64 channels in the
domains (stride 1, padding 0, 1 and (1, 0); maps of 38 and 40 rows, which go in two strips of
rows through the DSP kernel's buffer and are too tall for the MVE kernel's; a 64-channel 40x7
layer whose input dies there, so the export writes it over its input: one call, in two strips,
on the M33, CMSIS-NN's kernel in bands on the M55), and layers that stay CMSIS-NN's: strides of
2, 13 channels (not a multiple of 4), a 5x5 and a dilated 3x3. The second covers the MVE
kernel's edges: 30 rows with padding (32, its buffer's columns), output rows of 1 and 3 pixels,
and a 64-channel layer written over its input in one call. DS-CNN's 25x5 maps run in
tests/integration/test_mlperf_tiny.py; test_depthwise_3x3_dsp_host.py compares the DSP kernel
with CMSIS-NN on thousands of random layers under qemu-arm.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board and model on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain
from tests.strict_int8 import run_strict_int8

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

DEPTHWISE_LAYERS = textwrap.dedent("""
    import torch
    from torch import nn

    def dw(c, k=3, **kwargs):
        return nn.Conv2d(c, c, k, groups=c, **kwargs)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.dw4_p0 = dw(4)
            self.dw4_s2_p0 = dw(4, stride=2)
            self.dw4_s2_p1 = dw(4, stride=2, padding=1)
            self.dw4_p10 = dw(4, padding=(1, 0))
            self.pw12 = nn.Conv2d(4, 12, 1)
            self.dw12_p1 = dw(12, padding=1)
            self.pw13 = nn.Conv2d(4, 13, 1)
            self.dw13_p1 = dw(13, padding=1)
            self.dw13_5x5 = dw(13, 5, padding=2)
            self.dw13_dilated = dw(13, padding=2, dilation=2)
            self.pw64 = nn.Conv2d(4, 64, 1)
            self.dw64_p1 = dw(64, padding=1)
            self.dw64_s2_p0 = dw(64, stride=2)

        def forward(self, x):                             # 4 x 40 x 7
            d = self.dw4_p0(x)                            # 4 x 38 x 5: two strips
            b = self.dw4_s2_p0(x)                         # 4 x 19 x 3: CMSIS-NN (stride 2)
            a = torch.relu(self.dw4_s2_p1(x))             # 4 x 20 x 4: CMSIS-NN (stride 2)
            c = self.dw4_p10(a)                           # 4 x 20 x 2: padding (1, 0)
            e = torch.relu(self.pw12(a))                  # 12 x 20 x 4
            e = torch.relu(self.dw12_p1(e))
            y = torch.relu(self.pw13(a))                  # 13 x 20 x 4
            y1 = torch.relu(self.dw13_p1(y))              # CMSIS-NN: 13 channels
            y = torch.relu(self.dw13_5x5(y1))             # CMSIS-NN: 5x5
            y = self.dw13_dilated(y)                      # CMSIS-NN: dilation 2
            z = torch.relu(self.pw64(x))                  # 64 x 40 x 7: the largest map
            z = torch.relu(self.dw64_p1(z))               # its input dies: written over it
            w = self.dw64_s2_p0(z)                        # 64 x 19 x 3: CMSIS-NN (stride 2)
            return d, b, c, e, y1, y, w

    def model():
        return Net().eval()

    def example_inputs():
        return (torch.randn(1, 4, 40, 7, generator=torch.Generator().manual_seed(1)),)

    def calibration_inputs():
        g = torch.Generator().manual_seed(2)
        return [(torch.randn(1, 4, 40, 7, generator=g),) for _ in range(8)]
""")

# The MVE kernel's edges (all in the DSP kernel's domain too).
DEPTHWISE_EDGES = textwrap.dedent("""
    import torch
    from torch import nn

    def dw(c, k=3, **kwargs):
        return nn.Conv2d(c, c, k, groups=c, **kwargs)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.dw4_p1 = dw(4, padding=1)
            self.dw4_p10 = dw(4, padding=(1, 0))
            self.pw12 = nn.Conv2d(4, 12, 1)
            self.dw12_p0 = dw(12)
            self.pw64 = nn.Conv2d(4, 64, 1)
            self.dw64_p1 = dw(64, padding=1)
            self.pw4 = nn.Conv2d(64, 4, 1)

        def forward(self, x):                             # 4 x 30 x 3
            a = self.dw4_p1(x)                            # 4 x 30 x 3: 32 padded rows
            b = self.dw4_p10(x)                           # 4 x 30 x 1: rows of 1 pixel
            e = torch.relu(self.pw12(x))                  # 12 x 30 x 3
            e = self.dw12_p0(e)                           # 12 x 28 x 1: padding 0
            z = torch.relu(self.pw64(x))                  # 64 x 30 x 3: the largest map
            z = torch.relu(self.dw64_p1(z))               # its input dies: written over it
            return a, b, e, self.pw4(z)

    def model():
        return Net().eval()

    def example_inputs():
        return (torch.randn(1, 4, 30, 3, generator=torch.Generator().manual_seed(4)),)

    def calibration_inputs():
        g = torch.Generator().manual_seed(5)
        return [(torch.randn(1, 4, 30, 3, generator=g),) for _ in range(8)]
""")

DEPTHWISE = "cortex_m::quantized_depthwise_conv2d.out"


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_int8_depthwise_3x3_runs_bit_exact(tmp_path_factory, board):
    path = tmp_path_factory.mktemp("depthwise") / "depthwise_layers.py"
    path.write_text(DEPTHWISE_LAYERS)
    out = tmp_path_factory.getbasetemp() / "depthwise" / board
    report, exported = run_strict_int8(board, str(path), out)
    assert len(report.verdict.outputs) == 7
    ops = exported["op_list"]
    assert DEPTHWISE in ops
    assert not [o for o in ops if not o.startswith("cortex_m::")], ops  # nothing in float
    in_place = [entry["op"] for entry in exported["cortex_m_target"]["in_place"]]
    assert DEPTHWISE in in_place, in_place  # dw64_p1, over its input
    # deploykit's DSP kernel (its dk_dw3_run) is in the M33's image, its MVE kernel (its
    # dk_dwm_channel) in the M55's, each with CMSIS-NN's for the other layers.
    from elftools.elf.elffile import ELFFile

    with open(out / "firmware" / "dk_runner.elf", "rb") as f:
        names = {s.name.split(".")[0]
                 for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    assert ("dk_dw3_run" in names) == (board == "qemu-an505")
    assert ("dk_dwm_channel" in names) == (board == "qemu-an547")


def _symbols(elf: str) -> set[str]:
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        return {s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_int8_depthwise_3x3_edges_run_bit_exact(tmp_path_factory, board):
    """All four layers in deploykit's kernel's domain: no CMSIS-NN depthwise kernel linked."""
    path = tmp_path_factory.mktemp("depthwise_edges") / "depthwise_edges.py"
    path.write_text(DEPTHWISE_EDGES)
    out = tmp_path_factory.getbasetemp() / "depthwise_edges" / board
    report, exported = run_strict_int8(board, str(path), out)
    assert len(report.verdict.outputs) == 4
    in_place = [entry["op"] for entry in exported["cortex_m_target"]["in_place"]]
    assert DEPTHWISE in in_place, in_place  # dw64_p1, over its input
    names = _symbols(str(out / "firmware" / "dk_runner.elf"))
    assert ("dk_dwm_channel" in names) == (board == "qemu-an547")
    assert not {n for n in names if n.startswith("arm_depthwise_conv")}, names
