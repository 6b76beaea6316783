"""The PT2E int8 quantization step the int8 flows share, and reading the quantization
parameters at the lowered program's inputs and outputs. Only the quantizer differs per flow."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deploykit.flows.base import QuantParams
from deploykit.flows.common import flatten_tensors

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec


def quantize_pt2e(spec: ModelSpec, st: Stages, inputs: tuple[Any, ...],
                   calibration: list[tuple[Any, ...]], quantizer: Any,
                   float_rewrite: Callable[[Any], None] | None = None,
                   tile_rewrite: Callable[[Any], bool] | None = None) -> tuple[Any, list, list]:
    """torch.export → PT2E prepare → calibrate → convert; the quantized model and its and the
    float model's outputs on `inputs`. Shared by the int8 flows; only the quantizer differs,
    and `float_rewrite`, which a flow may apply to the exported float graph (in place) before
    it is quantized.

    `tile_rewrite` (flows/patches.py) rewrites the float graph into tiles, in place, and says
    whether it did. The tiles of a layer must quantize as the layer does, so the model is
    calibrated without tiles and each tile's observers take the state of their layer's: no tile is
    observed on its own."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from deploykit.flows.patches import share_observers, tag_origins

    def float_graph(example: tuple[Any, ...]) -> Any:
        with st.step("torch.export", "Make the model exportable with torch.export.export("
                     "model, example_inputs()) (no data-dependent Python control flow)."):
            exported = torch.export.export(spec.module, example)
            try:
                # torch 2.13 adds a _guards_fn call_module that the Arm/Cortex-M passes reject.
                graph_module = exported.module(check_guards=False)
            except TypeError:  # older torch: no such argument, and no such node
                graph_module = exported.module()
        if float_rewrite is not None:
            with st.step("float graph rewrite"):
                float_rewrite(graph_module)
        if tile_rewrite is not None:
            tag_origins(graph_module)
        return graph_module

    untiled = float_graph(inputs)
    with st.step("quantization (prepare_pt2e)"):
        prepared = prepare_pt2e(untiled, quantizer)
    with st.step("calibration"), torch.no_grad():
        for sample in calibration:
            prepared(*sample)
    if tile_rewrite is not None:
        graph_module = float_graph(inputs)
        with st.step("patches (tiles of the first stage)"):
            tiled = tile_rewrite(graph_module)
        if tiled:
            with st.step("quantization of the tiles (prepare_pt2e, the layers' observers)"):
                calibrated = prepared
                prepared = prepare_pt2e(graph_module, quantizer)
                share_observers(prepared, calibrated)
    with st.step("quantization (convert_pt2e)"):
        converted = convert_pt2e(prepared)
    with st.step("reference (quantized PT2E model)"), torch.no_grad():
        reference = flatten_tensors(converted(*[t.clone() for t in inputs]))
    with st.step("eager reference"), torch.no_grad():
        eager = flatten_tensors(spec.module(*[t.clone() for t in inputs]))
    return converted, reference, eager


def qparams_from_node_args(args: tuple[Any, ...]) -> QuantParams:
    # cortex_m.{quantize,dequantize}_per_tensor(x, scale, zero_point, qmin, qmax, dtype)
    _, scale, zp, qmin, qmax, dtype = args[:6]
    return QuantParams(scale=float(scale), zero_point=int(zp), qmin=int(qmin), qmax=int(qmax),
                       dtype=str(dtype).replace("torch.", ""))


def io_quant(ep: Any) -> tuple[list[QuantParams | None], list[QuantParams | None]]:
    """QuantParams of the cortex_m quantize after each user input / dequantize before each
    user output of a lowered edge program (None where there is none)."""
    from torch.export.graph_signature import InputKind, OutputKind

    def is_op(node: Any, name: str) -> bool:
        return node.op == "call_function" and f"cortex_m.{name}" in str(node.target)

    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    in_q: list[QuantParams | None] = []
    for spec in sig.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders.get(spec.arg.name)
        users = [u for u in node.users if is_op(u, "quantize_per_tensor")] if node else []
        in_q.append(qparams_from_node_args(users[0].args) if len(users) == 1 else None)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0])
    out_q: list[QuantParams | None] = []
    for spec, arg in zip(sig.output_specs, out_args, strict=True):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        ok = hasattr(arg, "op") and is_op(arg, "dequantize_per_tensor")
        out_q.append(qparams_from_node_args(arg.args) if ok else None)
    return in_q, out_q


def quantize(t: Any, q: QuantParams) -> Any:
    import torch

    return torch.ops.quantized_decomposed.quantize_per_tensor.default(
        t, q.scale, q.zero_point, q.qmin, q.qmax, torch.int8)


def dequantize(t: Any, q: QuantParams) -> Any:
    import torch

    if t.dtype != torch.int8:
        return t
    return torch.ops.quantized_decomposed.dequantize_per_tensor.default(
        t, q.scale, q.zero_point, q.qmin, q.qmax, torch.int8)
