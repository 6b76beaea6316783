"""The int8 3x3 depthwise convolutions on both QEMU boards against the host's integer
reference, bit for bit.

On the M33 (qemu-an505: DSP, no MVE) the depthwise layers in its domain run deploykit's own
kernel (firmware/kernels/cmsis_nn_depthwise_3x3_dsp.c, from dk_depthwise_conv_wrapper_s8 in
cmsis_nn_in_place.c), in place or not; on the M55 (qemu-an547), and for the layers outside it,
CMSIS-NN's kernels; the host's reference runs CMSIS-NN's own C code. The model covers 4, 12 and
64 channels in the domain (stride 1, padding 0, 1 and (1, 0); maps of 38 and 40 rows, which
go in two strips of rows through the kernel's buffer; a 64-channel 40x7 layer whose input dies
there, so the export writes it over its input: one call, in two strips), and layers that stay
CMSIS-NN's: strides of 2, 13 channels (not a multiple of 4), a 5x5 and a dilated 3x3. DS-CNN's
25x5 maps run in tests/integration/test_mlperf_tiny.py; test_depthwise_3x3_dsp_host.py compares
the kernel with CMSIS-NN on thousands of random layers under qemu-arm.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board on 2 cores with the runtime in the cache.
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
    # deploykit's kernel (its dk_dw3_run) is in the M33's image, with CMSIS-NN's for the other
    # layers; not in the M55's.
    from elftools.elf.elffile import ELFFile

    with open(out / "firmware" / "dk_runner.elf", "rb") as f:
        names = {s.name.split(".")[0]
                 for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    assert ("dk_dw3_run" in names) == (board == "qemu-an505")
