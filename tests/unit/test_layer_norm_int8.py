"""LayerNorm in int8 (flows/deploykit_ops.py, flows/layer_norm_int8.py): the host's
deploykit::quantized_layer_norm is torch's float LayerNorm of the dequantized input, quantized,
within one output step over random widths, rows and qparams; the cortex_m flow's pass replaces
the dequantize -> native_layer_norm -> quantize island with it (the bundled transformer block's
two LayerNorms), leaves what it cannot take exactly alone, and the exported program runs on the
host's interpreter as the export's reference. CI-runnable: no sources, toolchain or QEMU."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401 (registers quantized_decomposed)
from torch import nn

from deploykit import api
from deploykit.flows.deploykit_ops import MAX_LAYER_NORM_WIDTH
from deploykit.flows.layer_norm_int8 import REPORT_KEY, int8_layer_norms
from deploykit.program import pte_interpreter
from deploykit.program.costs import program_costs
from deploykit.readers.pte_reader import load_program, method_plan, operator_names
from deploykit.readers.trace import kernel_of
from tests.unit.test_elementwise_lut import _lowered

QDQ = torch.ops.quantized_decomposed
LAYER_NORM = torch.ops.deploykit.quantized_layer_norm


def _float_reference(x, s_in, zp_in, weight, bias, eps, s_out, zp_out):
    """torch's LayerNorm of the dequantized input, quantized as PT2E quantizes."""
    xf = QDQ.dequantize_per_tensor(x, s_in, zp_in, -128, 127, torch.int8)
    y = F.layer_norm(xf, (x.shape[-1],), weight, bias, eps)
    return QDQ.quantize_per_tensor(y, s_out, zp_out, -128, 127, torch.int8)


def test_host_operator_is_float_layer_norm_within_one_step():
    g = torch.Generator().manual_seed(0)
    worst = 0
    for width in (1, 2, 3, 7, 16, 32, 37, 64, 129, 768):
        for _ in range(12):
            shape = (int(torch.randint(1, 4, (1,), generator=g)),
                     int(torch.randint(1, 9, (1,), generator=g)), width)
            x = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
            s_in = float(torch.rand(1, generator=g)) * 0.2 + 1e-3
            s_out = float(torch.rand(1, generator=g)) * 0.05 + 2e-3
            zp_in, zp_out = (int(v) for v in torch.randint(-128, 128, (2,), generator=g))
            weight = torch.randn(width, generator=g)
            bias = torch.randn(width, generator=g) * 0.5
            eps = 10.0 ** -int(torch.randint(3, 7, (1,), generator=g))
            out = LAYER_NORM(x, zp_in, s_in, weight, bias, eps, s_out, zp_out)
            assert out.dtype == torch.int8 and out.shape == x.shape
            expected = _float_reference(x, s_in, zp_in, weight, bias, eps, s_out, zp_out)
            worst = max(worst, int((out.int() - expected.int()).abs().max()))
    assert worst <= 1


def test_host_operator_refuses_what_the_kernel_refuses():
    x = torch.zeros(2, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="int8 input and float32 weight and bias"):
        LAYER_NORM(x.float(), 0, 0.1, torch.ones(8), torch.zeros(8), 1e-5, 0.1, 0)
    with pytest.raises(ValueError, match="weight and bias of its length"):
        LAYER_NORM(x, 0, 0.1, torch.ones(7), torch.zeros(8), 1e-5, 0.1, 0)
    wide = torch.zeros(1, MAX_LAYER_NORM_WIDTH + 1, dtype=torch.int8)
    ones = torch.ones(MAX_LAYER_NORM_WIDTH + 1)
    with pytest.raises(ValueError, match="last dimension of 1 to 16384"):
        LAYER_NORM(wide, 0, 0.1, ones, ones * 0, 1e-5, 0.1, 0)


class Normed(nn.Module):
    """Linear -> LayerNorm -> Linear: the LayerNorm's input and output are int8."""

    def __init__(self, norm: nn.Module, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.norm, self.second = nn.Linear(16, width), norm, nn.Linear(width, 8)

    def forward(self, x):
        return self.second(self.norm(self.first(x)))


def _calls(lowered) -> list[str]:
    return [str(n.target) for n in lowered.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("norm", [nn.LayerNorm(16), nn.LayerNorm(16, elementwise_affine=False),
                                  nn.LayerNorm(16, bias=False)],
                         ids=["affine", "no weight and bias", "no bias"])
def test_island_becomes_the_int8_operator_and_computes_within_one_step(norm):
    lowered = _lowered(Normed(norm))
    before = lowered.module()  # a copy with the float island
    assert any("native_layer_norm" in c for c in _calls(lowered))

    replaced = int8_layer_norms(lowered, lambda node: "here")
    assert [r.describe() for r in replaced] == ["layer_norm at here"]
    calls = _calls(lowered)
    assert not [c for c in calls if "aten." in c or "getitem" in c], calls
    assert sum("quantized_layer_norm" in c for c in calls) == 1
    assert sum("dequantize_per_tensor" in c for c in calls) == 1  # the program's output
    after = lowered.module()
    g = torch.Generator().manual_seed(3)
    for _ in range(8):
        x = torch.randn(4, 16, generator=g) * 2
        # The second linear sees at most one step of difference per LayerNorm output.
        assert torch.allclose(before(x), after(x), atol=0.25)


def test_a_layer_norm_over_two_dimensions_is_left_alone():
    class TwoDims(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.second(F.layer_norm(self.first(x), (4, 16)))

    lowered = _lowered(TwoDims())
    assert int8_layer_norms(lowered, lambda node: "here") == []
    assert any("native_layer_norm" in c for c in _calls(lowered))


def test_a_normalized_value_used_in_float_is_left_alone():
    class Escapes(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.norm, self.second = nn.Linear(16, 16), nn.LayerNorm(16), \
                nn.Linear(16, 8)

        def forward(self, x):
            y = self.norm(self.first(x))
            # The float LayerNorm output also feeds a float sort: not a function of int8.
            return self.second(y), torch.sort(y, dim=-1)[0]

    lowered = _lowered(Escapes())
    assert int8_layer_norms(lowered, lambda node: "here") == []


def test_transformer_block_export_has_no_layer_norm_island(tmp_path):
    exported = api.export("qemu-an547", "transformer_block", "cortex_m_int8",
                          out=tmp_path / "out", project=False)
    ops = exported.op_list
    assert "deploykit::quantized_layer_norm.out" in ops
    assert "aten::native_layer_norm.out" not in ops
    report = json.loads(exported.report_path.read_text())
    assert report["mixed_precision"][REPORT_KEY] == [
        "layer_norm at transformer_block.py:55 in forward: x = x + self.attn(self.norm1(x))",
        "layer_norm at transformer_block.py:56 in forward: return x + self.mlp(self.norm2(x))",
    ]
    plan = method_plan(load_program(exported.pte_path.read_bytes(), "t"), "forward", "t")
    islands = program_costs(plan, operator_names(plan)).islands
    assert not [i for i in islands if any("layer_norm" in op for op in i.ops)], islands
    # The LayerNorm is an int8 operator, on deploykit's own kernel in the profile's kernel
    # column; with attention's second matmul in int8 too, the block has no float island.
    assert kernel_of("deploykit::quantized_layer_norm.out") == "deploykit"
    assert [i.describe() for i in islands if i.is_float] == []


def test_exported_program_is_strictly_int8_and_the_host_runs_it_as_the_reference(tmp_path):
    model = tmp_path / "normed.py"
    model.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.a, self.b = nn.Linear(16, 37), nn.Linear(37, 8)
                self.norm = nn.LayerNorm(37)

            def forward(self, x):
                return self.b(self.norm(self.a(x)))

        def model():
            return Net().eval()

        def example_inputs():
            return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)
    """))
    exported = api.export("qemu-an547", str(model), "cortex_m_int8", out=tmp_path / "out",
                          strict=True, project=False)
    assert not [o for o in exported.op_list
                if not o.startswith(("cortex_m::", "deploykit::"))], exported.op_list
    pte = exported.pte_path.read_bytes()
    plan = method_plan(load_program(pte, "t"), "forward", "t")
    costs = program_costs(plan, operator_names(plan))
    assert costs.islands == () and costs.fallback_ops == ()
    # The host's run of the .pte (what a device run of an imported program is compared with)
    # is the export's reference, the integer reference, bit for bit.
    host = pte_interpreter.run_program(pte, exported.input_sets[0])
    assert np.array_equal(host[0], exported.host_outputs[0])
