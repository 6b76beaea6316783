"""Elementwise functions in int8 through 256-entry tables (flows/elementwise_lut.py) on
qemu-an547: a model of GELU, sigmoid, tanh, exp, a hardswish after an add and a model's own
function between linears, and the bundled MobileNetV3 block (hardswish, hardsigmoid), built
with `--strict` (no float island left), run, and compared with the host's integer reference:
bit for bit.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute each on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain
from tests.strict_int8 import run_strict_int8

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

ACTIVATIONS = textwrap.dedent("""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.ModuleList(nn.Linear(24, 24) for _ in range(7))

        def forward(self, x):
            x = F.gelu(self.fc[0](x))
            x = torch.sigmoid(self.fc[1](x))
            x = torch.tanh(self.fc[2](x))
            x = torch.exp(0.5 * self.fc[3](x))
            x = F.hardswish(self.fc[4](x) + x)
            y = self.fc[5](x)
            return self.fc[6](y * torch.sigmoid(1.702 * y))

    def model():
        return Net().eval()

    def example_inputs():
        return (torch.randn(8, 24, generator=torch.Generator().manual_seed(1)),)

    def calibration_inputs():
        g = torch.Generator().manual_seed(2)
        return [(torch.randn(8, 24, generator=g),) for _ in range(8)]
""")


@pytest.mark.parametrize("model", ["activations", "mobilenet_v3_block"])
def test_elementwise_int8_model_runs_bit_exact_without_float_islands(tmp_path_factory, model):
    out = tmp_path_factory.getbasetemp() / "elementwise-lut" / model
    if model == "activations":
        path = tmp_path_factory.mktemp("lut") / "activations.py"
        path.write_text(ACTIVATIONS)
        model = str(path)
    report, exported = run_strict_int8("qemu-an547", model, out)
    ops = exported["op_list"]
    assert not [o for o in ops if not o.startswith("cortex_m::")], ops  # nothing in float
    if model.endswith("activations.py"):
        assert "cortex_m::quantized_activation.out" in ops
        assert [t.split(" at ")[0] for t in exported["mixed_precision"]["lookup_tables"]] == [
            "gelu", "mul -> exp", "mul", "hardswish"]
        assert "elementwise functions as int8 tables: 4 (gelu at activations.py:13, " \
            in report.summary()
