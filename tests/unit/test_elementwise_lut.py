"""Elementwise float islands of the cortex_m flow as int8 table lookups
(flows/elementwise_lut.py), on programs lowered exactly as the flow lowers them: each table is
quantize(f(dequantize(q))) for all 256 int8 inputs, written here with the model's own torch
function and PT2E's quantize and dequantize; the program computes the same outputs on the host
before and after; and what is not a function of one per-tensor int8 tensor is left alone."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from deploykit import api
from deploykit.flows.cortex_m_int8 import (
    _cortex_m_edge_compile_config,
    _cortex_m_passes,
    _target_config,
)
from deploykit.flows.elementwise_lut import elementwise_lookup_tables
from deploykit.program import pte_interpreter
from deploykit.program.costs import program_costs
from deploykit.readers.pte_reader import load_program, method_plan, operator_names

WIDTH = 16
QDQ = torch.ops.quantized_decomposed


class Between(nn.Module):
    """Linear -> f -> Linear: f's input and output are int8 (the linears' quantized I/O)."""

    def __init__(self, f, residual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.f, self.residual = f, residual

    def forward(self, x):
        y = self.first(x)
        return self.second(self.f(y + x if self.residual else y))


def _own(y):
    return y * torch.sigmoid(1.702 * y)  # a model's own GELU approximation


FUNCTIONS = {
    "gelu": (F.gelu, False),
    "gelu tanh": (lambda y: F.gelu(y, approximate="tanh"), False),
    "exp of a scaled input": (lambda y: torch.exp(0.5 * y), False),
    "erf": (torch.erf, False),
    "elu": (F.elu, False),
    "softplus": (F.softplus, False),
    "a scale by a constant": (lambda y: y * (1.0 / math.sqrt(8)), False),
    "hardswish after an add (folded qparams)": (F.hardswish, True),
}


def _inputs(seed: int, n: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, WIDTH, generator=g) * 2 for _ in range(n)]


def _lowered(module: nn.Module):
    """The module through the cortex_m flow's steps up to its Cortex-M passes (M55)."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    example = tuple(_inputs(1))
    graph = torch.export.export(module.eval(), example).module(check_guards=False)
    prepared = prepare_pt2e(graph, CortexMQuantizer())
    for x in _inputs(2, 8):
        prepared(x)
    converted = convert_pt2e(prepared)
    edge = to_edge_transform_and_lower(torch.export.export(converted, example),
                                       compile_config=_cortex_m_edge_compile_config())
    lowered, failure = _cortex_m_passes(edge.exported_program(), _target_config("cortex-m55"))
    assert failure is None, failure
    return lowered


def _qparams(lowered) -> tuple[tuple[float, int], tuple[float, int]]:
    """(scale, zero point) at the input and the output of the one island (or folded op)."""
    for node in lowered.graph.nodes:
        if node.op != "call_function":
            continue
        if "dequantize_per_tensor" in str(node.target) and node.args[0].op == "call_function":
            out = next(n for n in node.users)
            while "quantize_per_tensor" not in str(out.target):
                out = next(iter(out.users))
            return (node.args[1], node.args[2]), (out.args[1], out.args[2])
        if node.meta.get("input_qparams") and "aten" in str(node.target):
            qin, qout = node.meta["input_qparams"][0], node.meta["output_qparams"][0]
            return (qin.scale, qin.zp), (qout.scale, qout.zp)
    raise AssertionError("no island in the lowered graph")


def _tables(lowered) -> list[torch.Tensor]:
    state = {**lowered.state_dict, **lowered.constants}
    return [state[n.args[1].target] for n in lowered.graph.nodes
            if "quantized_activation" in str(n.target)]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_island_becomes_its_table_and_the_program_computes_the_same(name):
    f, residual = FUNCTIONS[name]
    lowered = _lowered(Between(f, residual))
    (s_in, zp_in), (s_out, zp_out) = _qparams(lowered)
    before = lowered.module()  # a copy of the graph with the float island
    assert not _tables(lowered)

    replaced = elementwise_lookup_tables(lowered, lambda node: "here")
    assert len(replaced) == 1
    # No float operator and no dequantize between the linears remain.
    calls = [str(n.target) for n in lowered.graph.nodes if n.op == "call_function"]
    assert not [c for c in calls if "aten." in c], calls
    assert sum("dequantize_per_tensor" in c for c in calls) == 1  # the program's output
    (table,) = _tables(lowered)

    every_int8 = torch.arange(-128, 128, dtype=torch.int8)
    x = QDQ.dequantize_per_tensor(every_int8, s_in, zp_in, -128, 127, torch.int8)
    expected = QDQ.quantize_per_tensor(f(x), s_out, zp_out, -128, 127, torch.int8)
    assert table.dtype == torch.int8 and table.shape == (256,)
    assert torch.equal(table, expected)

    if not residual:  # a folded operator had no host semantics before: the table is checked
        after = lowered.module()
        for x in _inputs(3, 16):
            assert torch.equal(before(x), after(x))


def test_a_requantization_becomes_its_table():
    """A softmax's fixed output qparams (1/256, -128) read by a linear that observed its own
    range: a dequantize straight into a quantize, one table."""
    lowered = _lowered(Between(lambda y: torch.softmax(y, dim=-1)))
    (s_in, zp_in), (s_out, zp_out) = _qparams(lowered)
    assert (s_in, zp_in) == (1.0 / 256, -128) and (s_out, zp_out) != (s_in, zp_in)
    before = lowered.module()

    replaced = elementwise_lookup_tables(lowered, lambda node: "here")
    assert [t.ops for t in replaced] == [("requantize",)]
    (table,) = _tables(lowered)
    every_int8 = torch.arange(-128, 128, dtype=torch.int8)
    x = QDQ.dequantize_per_tensor(every_int8, s_in, zp_in, -128, 127, torch.int8)
    assert torch.equal(table, QDQ.quantize_per_tensor(x, s_out, zp_out, -128, 127, torch.int8))
    after = lowered.module()
    for x in _inputs(3, 16):
        assert torch.equal(before(x), after(x))


def test_a_float_value_used_outside_the_island_is_left_alone():
    class Escapes(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.second = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            g = F.gelu(self.first(x))
            # The float GELU output also feeds a float layer norm: not a function of int8.
            return self.second(g) + F.layer_norm(g, (WIDTH,))

    lowered = _lowered(Escapes())
    assert elementwise_lookup_tables(lowered, lambda node: "here") == []
    assert any("gelu" in str(n.target) for n in lowered.graph.nodes)


def test_a_quantize_that_is_not_full_range_int8_is_left_alone():
    lowered = _lowered(Between(F.gelu))
    quantize = next(n for n in lowered.graph.nodes if "quantize_per_tensor" in str(n.target)
                    and "dequantize" not in str(n.target)
                    and "gelu" in str(n.args[0].target))
    args = list(quantize.args)
    args[4] = 126  # quant_max: no longer int8's full range
    quantize.args = tuple(args)
    assert elementwise_lookup_tables(lowered, lambda node: "here") == []


def test_exported_program_has_no_float_island_and_the_host_runs_it_bit_exact(tmp_path):
    model = tmp_path / "activations.py"
    model.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        import torch.nn.functional as F

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

            def forward(self, x):
                x = F.gelu(self.a(x))
                x = torch.tanh(torch.exp(0.3 * self.b(x)))
                return self.c(x)

        def model():
            return Net().eval()

        def example_inputs():
            return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)
    """))
    exported = api.export("qemu-an547", str(model), "cortex_m_int8", out=tmp_path / "out",
                          strict=True, project=False)
    ops = exported.op_list
    assert "cortex_m::quantized_activation.out" in ops
    assert not [o for o in ops if o.startswith("aten::")], ops
    pte = exported.pte_path.read_bytes()
    plan = method_plan(load_program(pte, "t"), "forward", "t")
    costs = program_costs(plan, operator_names(plan))
    assert costs.islands == () and costs.fallback_ops == ()
    # The host's run of the .pte (the interpreter every device run is compared against)
    # reproduces the export's reference, the cortex_m integer reference, bit for bit.
    host = pte_interpreter.run_program(pte, exported.input_sets[0])
    assert len(host) == 1
    assert np.array_equal(host[0], exported.host_outputs[0])
    report = json.loads(exported.report_path.read_text())
    assert report["mixed_precision"]["lookup_tables"] == [
        "gelu at activations.py:13 in forward: x = F.gelu(self.a(x))",
        "mul -> exp at activations.py:14 in forward: x = torch.tanh(torch.exp(0.3 * self.b(x)))",
    ]
