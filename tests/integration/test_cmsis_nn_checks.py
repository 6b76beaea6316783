"""CMSIS-NN's argument checks at export (flows/cmsis_nn_checks.py, issue #32): a convolution
the board CPU's kernel would refuse never reaches the device. A Conv2d of height 1 whose
output leaves part of the right padding unread is refused by arm_convolve_1_x_n_s8 on MVE
(the Cortex-M55 of qemu-an547) and taken by the M33's kernels (qemu-an505).

Export only (no firmware); needs the ExecuTorch sources for the runtime's kernel list.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from deploykit import api
from deploykit.util.errors import ExportError
from tests.markers import requires_sources

pytestmark = [requires_sources]

H1CONV = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, (1, 5), stride=(1, 2), padding=(0, 2))
            self.fc = nn.Linear(8 * 25, 4)

        def forward(self, x):
            return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        t = torch.arange(50, dtype=torch.float32)
        return (torch.stack([torch.sin(t / (2 + c)) for c in range(8)])[None, :, None, :],)
""")

REFUSAL = (
    "arm_convolve_1_x_n_s8 (MVE) returns ARM_CMSIS_NN_FAILURE: padding 2 each side, but the "
    "25 outputs of stride 2 over 50 inputs use 3 padded columns in all"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("checks") / "h1conv.py"
    path.write_text(H1CONV)
    return path


def _mixed(out):
    return json.loads((out / "export" / "export.json").read_text())["mixed_precision"]


def test_a_refused_convolution_stays_float_with_the_reason(model, tmp_path):
    api.export("qemu-an547", str(model), flow="cortex_m_int8", out=tmp_path)
    mixed = _mixed(tmp_path)
    assert mixed["kept_in_float"] == [
        "conv2d at h1conv.py:12 in forward: return self.fc(torch.flatten(torch.relu("
        f"self.conv(x)), 1)) ({REFUSAL})"
    ]
    assert [e["op"] for e in mixed["float_mac_ops"]] == ["aten::convolution"]


def test_strict_refuses_it(model, tmp_path):
    with pytest.raises(ExportError, match="CMSIS-NN argument checks.*ARM_CMSIS_NN_FAILURE"):
        api.export("qemu-an547", str(model), flow="cortex_m_int8", out=tmp_path, strict=True)


def test_the_m33_kernel_takes_it(model, tmp_path):
    api.export("qemu-an505", str(model), flow="cortex_m_int8", out=tmp_path, strict=True)
    assert _mixed(tmp_path)["kept_in_float"] == []
