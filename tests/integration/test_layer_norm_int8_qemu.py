"""LayerNorm in int8 (deploykit::quantized_layer_norm, firmware/kernels/op_quantized_layer_norm.cpp)
on both QEMU boards: linears and two LayerNorms over 16 tokens (an odd width of 37 with a
trained-looking weight and bias, and a width of 64 without them) built with `--strict` (no
float island left), run, and compared with the host's integer reference: bit for bit on the
Cortex-M55 and the Cortex-M33.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute each on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain
from tests.strict_int8 import run_strict_int8

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

NORMS = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.c = nn.Linear(24, 37), nn.Linear(37, 64), nn.Linear(64, 8)
            self.odd = nn.LayerNorm(37)
            self.plain = nn.LayerNorm(64, elementwise_affine=False)
            with torch.no_grad():  # a trained LayerNorm's weight and bias, not 1 and 0
                self.odd.weight.uniform_(0.5, 1.5)
                self.odd.bias.uniform_(-0.3, 0.3)

        def forward(self, x):
            x = self.odd(self.a(x))
            return self.c(self.plain(self.b(x)))

    def model():
        return Net().eval()

    def example_inputs():
        return (torch.randn(1, 16, 24, generator=torch.Generator().manual_seed(1)),)

    def calibration_inputs():
        g = torch.Generator().manual_seed(2)
        return [(torch.randn(1, 16, 24, generator=g),) for _ in range(8)]
""")


@pytest.mark.timeout(900)  # a cold runtime build for the board first
@pytest.mark.parametrize("board", ["qemu-an547", "qemu-an505"])
def test_int8_layer_norms_run_bit_exact_without_float_islands(tmp_path_factory, board):
    path = tmp_path_factory.mktemp("layer-norm") / "norms.py"
    path.write_text(NORMS)
    out = tmp_path_factory.getbasetemp() / "layer-norm-int8" / board
    report, exported = run_strict_int8(board, str(path), out)
    ops = exported["op_list"]
    assert "deploykit::quantized_layer_norm.out" in ops
    assert not [o for o in ops if not o.startswith(("cortex_m::", "deploykit::"))], ops
    assert [n.split(" in ")[0] for n in exported["mixed_precision"]["int8_layer_norms"]] == [
        "layer_norm at norms.py:17", "layer_norm at norms.py:18"]
    assert "LayerNorm in int8: 2 (norms.py:17, norms.py:18)" in report.summary()
