"""deploykit's slice, cat and dim-order copy kernels (firmware/kernels/op_memory_order_copy.cpp)
on the device: channels-last int8 maps cut along columns, rows with a step, and channels,
joined along columns and channels, give the host's outputs bit for bit on both QEMU boards;
the program really asks for those copies on channels-last tensors; and the same graph in
float (contiguous tensors, the portable kernels' layout) matches too.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. About a minute per case on 2 cores with the runtime in the cache.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from deploykit import api
from deploykit.readers.pte_reader import load_program, method_plan
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

# Two branches joined along channels (an Inception block), the columns rolled (a cut and a
# join along the width), every second row (a slice with a step), the channels split and
# swapped, then a convolution that reads the result.
CUTS_AND_JOINS = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(3, 8, 1)
            self.c = nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
            y = torch.cat([y[:, :, :, 5:], y[:, :, :, :5]], dim=3)
            y = y[:, :, 1::2, :]
            y = torch.cat([y[:, 8:], y[:, :8]], dim=1)
            return self.c(y)

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        g = torch.Generator().manual_seed(1)
        return (torch.rand(1, 3, 16, 12, generator=g),)
""")

# The same in float with the output's rows and columns swapped (a permute, which the int8
# flow lowers to ExecuTorch's cortex_m::transpose instead).
PERMUTED = CUTS_AND_JOINS.replace("return self.c(y)", "return self.c(y).permute(0, 1, 3, 2)")
assert PERMUTED != CUTS_AND_JOINS

CHANNELS_LAST = (0, 2, 3, 1)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("copies") / "cuts_and_joins.py"
    path.write_text(CUTS_AND_JOINS)
    return path


def _copies(pte) -> list[tuple[str, tuple[int, ...]]]:
    """(operator, output dim order) of each slice and cat instruction of the program."""
    program = load_program(pte.read_bytes(), str(pte))
    plan = method_plan(program, "forward", str(pte))
    found = []
    for instruction in plan.chains[0].instructions:
        args = instruction.instr_args
        if not hasattr(args, "op_index"):
            continue
        name = plan.operators[args.op_index].name
        if name in ("aten::slice_copy", "aten::cat"):
            out = plan.values[args.args[-1]].val
            found.append((name, tuple(out.dim_order)))
    return found


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_int8_channels_last_cuts_and_joins_match_the_host(tmp_path, model_file, board):
    report = api.run(board, str(model_file), flow="cortex_m_int8", out=tmp_path,
                     timeout=300, project=False)
    assert report.passed, report.summary()
    assert report.verdict is not None
    assert all(o.max_abs_error == 0.0 for o in report.verdict.outputs), report.summary()
    copies = _copies(tmp_path / "export" / "model.pte")
    # 3 joins and 5 slices, all on channels-last maps: the layout the portable kernels get
    # wrong, with no layout copy around them.
    assert sorted(name for name, _ in copies) == ["aten::cat"] * 3 + ["aten::slice_copy"] * 5
    assert all(order == CHANNELS_LAST for _, order in copies), copies


def test_float_contiguous_cuts_joins_and_a_permute_match_the_host(tmp_path):
    model_file = tmp_path / "cuts_joins_permute.py"
    model_file.write_text(PERMUTED)
    report = api.run("qemu-an505", str(model_file), flow="portable_fp32", out=tmp_path / "out",
                     timeout=300, project=False)
    assert report.passed, report.summary()
    copies = _copies(tmp_path / "out" / "export" / "model.pte")
    assert len(copies) == 8
    assert all(order == (0, 1, 2, 3) for _, order in copies), copies
    exported = json.loads((tmp_path / "out" / "export" / "export.json").read_text())
    assert "aten::permute_copy.out" in exported["op_list"], exported["op_list"]
