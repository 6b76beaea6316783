"""LayerNorm float islands as one int8 operator (the cortex_m flow).

ExecuTorch's Cortex-M backend has no int8 LayerNorm: after its passes, each ``nn.LayerNorm`` of
an int8 model is left as a float island,

    int8 -> cortex_m::dequantize_per_tensor -> aten::native_layer_norm (float) -> [0]
         -> cortex_m::quantize_per_tensor -> int8

which runs the portable float kernel (17.5k instructions for 16 rows of 32 on a Cortex-M55).
Each such island becomes ``deploykit::quantized_layer_norm`` (flows/deploykit_ops.py): the
int8 input, its qparams, the LayerNorm's weight and bias and eps, the output qparams; int8 out.
Its arithmetic is exact integer sums and a fixed sequence of float32 operations, so the host
reference and deploykit's kernel (firmware/kernels/op_quantized_layer_norm.cpp) give the same
bytes, within one output step of torch's float LayerNorm on the dequantized input.

Only what the operator computes exactly is taken: a per-tensor int8 dequantize of an int8
tensor whose last dimension is innermost in memory; a LayerNorm over that last dimension alone
(at most ``MAX_LAYER_NORM_WIDTH`` values) whose weight and bias are float32 constants or
absent and whose mean and rstd outputs are unused; and a normalized value that reaches nothing
but per-tensor int8 quantizes (one operator per quantize). Anything else (a LayerNorm over two
dimensions, a float value that is also an output or feeds a float operator, a per-channel
quantize) is left as it is.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from deploykit.flows.deploykit_ops import MAX_LAYER_NORM_WIDTH, quantized_layer_norm_op
from deploykit.flows.elementwise_lut import is_int8_qdq

REPORT_KEY = "int8_layer_norms"


@dataclass(frozen=True)
class Int8LayerNorm:
    """One LayerNorm island replaced by deploykit::quantized_layer_norm: its model line."""

    source: str

    def describe(self) -> str:
        return f"layer_norm at {self.source}"


def describe(report: dict[str, Any]) -> list[str]:
    """One line for the export and run reports, from export.json's ``mixed_precision``: the
    LayerNorms that run in int8, with their model lines (file:line)."""
    norms = report.get(REPORT_KEY) or []
    if not norms:
        return []
    shown = [n.split(" at ", 1)[1].split(" in ")[0] for n in norms]
    return [f"LayerNorm in int8: {len(norms)} ({', '.join(shown)})"]


def _constant(ep: Any, node: Any) -> Any | None:
    """The tensor of a parameter, buffer or lifted constant placeholder of `ep`, else None."""
    from torch._export.utils import get_buffer, get_lifted_tensor_constant, get_param

    if getattr(node, "op", None) != "placeholder":
        return None
    for read in (get_param, get_buffer, get_lifted_tensor_constant):
        value = read(ep, node)
        if value is not None:
            return value
    return None


def _affine(ep: Any, node: Any, width: int) -> bool:
    """A LayerNorm weight or bias the operator takes: absent, or a float32 constant of the
    normalized width."""
    import torch

    if node is None:
        return True
    value = _constant(ep, node)
    return (value is not None and value.dtype == torch.float32
            and tuple(value.shape) == (width,))


def _is_layer_norm(node: Any) -> bool:
    if getattr(node, "op", None) != "call_function":
        return False
    schema = getattr(getattr(node.target, "_op", node.target), "_schema", None)
    return schema is not None and schema.name == "aten::native_layer_norm" \
        and schema.overload_name == ""


def _island(ep: Any, layer_norm: Any) -> tuple[Any, list[Any]] | None:
    """(the int8 tensor the island reads, the quantizes that end it) when `layer_norm` is an
    island the operator computes exactly, else None."""
    import torch

    dequantize = layer_norm.args[0]
    if not is_int8_qdq(dequantize, "dequantize"):
        return None
    source = dequantize.args[0]
    val = getattr(source, "meta", {}).get("val")
    if val is None or val.dtype != torch.int8 or val.dim() == 0 or not val.is_contiguous():
        return None
    width = val.shape[-1]
    args = list(layer_norm.args) + [None] * (5 - len(layer_norm.args))
    _, normalized_shape, weight, bias, eps = args[:5]
    if layer_norm.kwargs or list(normalized_shape) != [width] \
            or not 0 < width <= MAX_LAYER_NORM_WIDTH or not isinstance(eps, float) \
            or not (_affine(ep, weight, width) and _affine(ep, bias, width)):
        return None
    normalized = list(layer_norm.users)
    if len(normalized) != 1 or normalized[0].target is not operator.getitem \
            or normalized[0].args[1] != 0:
        return None  # the mean or rstd is used too: not an int8 function
    quantizes = list(normalized[0].users)
    if not quantizes or not all(is_int8_qdq(q, "quantize") for q in quantizes):
        return None
    return source, quantizes


def int8_layer_norms(ep: Any, source_of: Any) -> list[Int8LayerNorm]:
    """Replace each LayerNorm float island of `ep` (a lowered cortex_m edge program, changed in
    place) that the int8 operator computes exactly with deploykit::quantized_layer_norm.
    `source_of(node)` names a node's model line. Returns what was replaced."""
    import torch
    from executorch.backends.transforms.utils import create_constant_placeholder
    from torch.export.graph_signature import InputKind

    graph = ep.graph_module.graph
    replaced: list[Int8LayerNorm] = []
    for layer_norm in [n for n in graph.nodes if _is_layer_norm(n)]:
        found = _island(ep, layer_norm)
        if found is None:
            continue
        source, quantizes = found
        dequantize, _, weight, bias, eps = (list(layer_norm.args) + [None] * 5)[:5]
        width = source.meta["val"].shape[-1]
        first_placeholder = next(n for n in graph.nodes if n.op == "placeholder")
        affine = []
        for node, name, fill in ((weight, "weight", torch.ones), (bias, "bias", torch.zeros)):
            if node is None:
                with graph.inserting_before(first_placeholder):
                    # Constant placeholders come before the user inputs.
                    node = create_constant_placeholder(
                        ep, graph, f"{layer_norm.name}_{name}", InputKind.PARAMETER,
                        fill(width, dtype=torch.float32))
            affine.append(node)
        for quantize in quantizes:
            with graph.inserting_before(quantize):
                norm = graph.call_function(quantized_layer_norm_op(), (
                    source, dequantize.args[2], dequantize.args[1], *affine, eps,
                    quantize.args[1], quantize.args[2]))
            norm.meta = {k: v for k, v in quantize.meta.items()
                         if k not in ("input_qparams", "output_qparams")}
            # The model line of the LayerNorm, for the profile and the reports.
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if key in layer_norm.meta:
                    norm.meta[key] = layer_norm.meta[key]
            quantize.replace_all_uses_with(norm)
            graph.erase_node(quantize)
        replaced.append(Int8LayerNorm(source=source_of(layer_norm)))
        graph.erase_node(next(iter(layer_norm.users)))
        graph.erase_node(layer_norm)
        if not dequantize.users:
            graph.erase_node(dequantize)
    if replaced:
        graph.lint()
        ep.graph_module.recompile()
    return replaced
