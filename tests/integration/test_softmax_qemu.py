"""The int8 softmax on both QEMU boards against the host's integer reference, bit for bit.

The firmware's cortex_m softmax runs deploykit's dk_arm_softmax_s8
(firmware/kernels/cmsis_nn_softmax.c); the host's reference runs CMSIS-NN's own
arm_softmax_s8. The model has a softmax over rows of 37 (not a multiple of 4: CMSIS-NN's
vector paths leave a tail) whose logits span more than diff_min reaches, so that some
elements fall below it, and one over rows of 16 as the bundled transformer block has.
tests/integration/test_softmax_host.py compares the two functions over many more inputs.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per board on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain
from tests.strict_int8 import run_strict_int8

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

SOFTMAXES = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.wide = nn.Linear(24, 37)
            self.narrow = nn.Linear(24, 16)
            with torch.no_grad():
                self.wide.weight.mul_(10.0)  # logits over ~60: some below diff_min

        def forward(self, x):
            return self.wide(x).softmax(dim=-1), self.narrow(x).softmax(dim=-1)

    def model():
        return Net().eval()

    def example_inputs():
        return (torch.randn(8, 24, generator=torch.Generator().manual_seed(1)),)

    def calibration_inputs():
        g = torch.Generator().manual_seed(2)
        return [(torch.randn(8, 24, generator=g),) for _ in range(8)]
""")


@pytest.mark.parametrize("board", ["qemu-an547", "qemu-an505"])
def test_int8_softmax_runs_bit_exact(tmp_path_factory, board):
    path = tmp_path_factory.mktemp("softmax") / "softmaxes.py"
    path.write_text(SOFTMAXES)
    out = tmp_path_factory.getbasetemp() / "softmax" / board
    report, exported = run_strict_int8(board, str(path), out)
    assert len(report.verdict.outputs) == 2
    ops = exported["op_list"]
    assert "cortex_m::softmax.out" in ops
    assert not [o for o in ops if not o.startswith("cortex_m::")], ops  # nothing in float
