"""Float islands of elementwise functions as one int8 table lookup (the cortex_m flow).

An operator the int8 lowering does not take (GELU, exp, erf, a scale by a constant, a model's
own ``y * torch.sigmoid(1.702 * y)``) stays float between a dequantize and a quantize:

    int8 -> dequantize -> f(x) (pointwise float operators, or none) -> quantize -> int8

When every operator between the two is pointwise and reads nothing but the dequantized tensor
(and Python scalars or one-element constants, such as attention's 1/sqrt(d)), the island maps
each of the 256 int8 inputs to one int8 output. It is replaced by a 256-entry table computed
here on the host by running the island's own nodes (the same dequantize, float operators and
quantize, with their arguments) on the 256 values: ``table[q + 128] =
quantize(f(dequantize(q)))``, so the result is the host's dequantize -> f -> quantize, bit for
bit. With no operator in between, the island is a requantization from one scale to another
(a softmax's fixed 1/256 output read by a matmul that observed its own range). The program
holds the table as a constant and calls ``cortex_m::quantized_activation``
(ExecuTorch's Cortex-M backend: ``out[i] = lut[in[i] + 128]``, with MVE gather and DSP loops on
the device and a torch implementation on the host), the operator the backend itself lowers a
standalone quantized sigmoid, tanh or SiLU to.

The Cortex-M passes also leave a pointwise operator with its dequantize and quantize folded
into its meta when no cortex_m kernel takes it (a hardswish after an add: the backend fuses
hardswish only into a convolution or linear); it would run on int8 bytes as if they were
values, and becomes a table the same way (PT2E's quantize and dequantize with those qparams).

Only what is exactly a function of one int8 tensor is taken: a dequantize and each quantize of
one per-tensor scale and zero point, int8 over [-128, 127]; pointwise operators (torch's
``pointwise`` tag) whose tensor arguments all come from the island or are one-element
constants, with the island's shape; and float values that reach nothing but the island and its
quantizes. Anything else (a per-channel quantize, a float value that is also an output or feeds
a float LayerNorm, a second input) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The qparams of a per-tensor int8 quantize/dequantize: (input, scale, zero_point, qmin, qmax,
# dtype), the argument order of cortex_m:: and quantized_decomposed:: alike.
_INT8_RANGE = (-128, 127)
# Elementwise ATen operators that torch does not tag ``pointwise`` (torch 2.13).
_UNTAGGED_POINTWISE = frozenset({"aten::hardswish"})


@dataclass(frozen=True)
class LookupTable:
    """One island replaced by a table: its operators (in graph order) and the model line."""

    ops: tuple[str, ...]
    source: str

    def describe(self) -> str:
        return f"{' -> '.join(self.ops)} at {self.source}"


REPORT_KEY = "lookup_tables"


def describe(report: dict[str, Any]) -> list[str]:
    """One line for the export and run reports, from export.json's ``mixed_precision``:
    the islands that became tables, with their model lines (file:line)."""
    tables = report.get(REPORT_KEY) or []
    if not tables:
        return []
    shown = [t.split(" in ")[0] for t in tables]  # "gelu at model.py:56"
    return [f"elementwise functions as int8 tables: {len(tables)} ({', '.join(shown)})"]


def is_int8_qdq(node: Any, kind: str) -> bool:
    """A per-tensor quantize ("quantize") or dequantize ("dequantize") of int8 over the full
    range, with one scale and one zero point."""
    import torch

    if getattr(node, "op", None) != "call_function":
        return False
    name = str(node.target)
    if not (f".{kind}_per_tensor." in name or name.endswith(f".{kind}_per_tensor.default")) \
            or not ("cortex_m" in name or "quantized_decomposed" in name):
        return False
    if len(node.args) < 6 or node.kwargs:
        return False
    _, scale, zero_point, qmin, qmax, dtype = node.args[:6]
    return (isinstance(scale, float) and isinstance(zero_point, int)
            and (qmin, qmax) == _INT8_RANGE and dtype == torch.int8)


def _pointwise(node: Any) -> bool:
    import torch

    if node.op != "call_function":
        return False
    target = getattr(node.target, "_op", node.target)  # an edge op wraps its ATen overload
    schema = getattr(target, "_schema", None)
    return torch.Tag.pointwise in getattr(target, "tags", ()) or (
        schema is not None and schema.name in _UNTAGGED_POINTWISE)


def _node_args(node: Any) -> list[Any]:
    import torch

    found: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _scalar_constant(ep: Any, node: Any) -> Any | None:
    """The value of a one-element constant of `ep` (a scalar the lowering made a tensor, as
    the 1/sqrt(d) of attention's scores), else None."""
    from torch._export.utils import get_buffer, get_lifted_tensor_constant, get_param

    if getattr(node, "op", None) != "placeholder":
        return None
    for read in (get_param, get_buffer, get_lifted_tensor_constant):
        value = read(ep, node)
        if value is not None:
            return value if value.numel() == 1 else None
    return None


def _island(ep: Any, dequantize: Any) -> tuple[list[Any], list[Any]] | None:
    """The pointwise float nodes fed by `dequantize` alone (graph order) and the int8
    quantizes that end them, or None when a float value of the island escapes it."""
    members = {dequantize}
    order: list[Any] = []
    shape = dequantize.meta["val"].shape
    frontier = [dequantize]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in members or not _pointwise(user):
                continue
            if all(a in members or _scalar_constant(ep, a) is not None
                   for a in _node_args(user)):
                val = user.meta.get("val")
                # Any dtype: softplus compares (bool) and selects (where) in between.
                if val is None or val.shape != shape:
                    return None
                members.add(user)
                order.append(user)
                frontier.append(user)
    if not order:
        # A requantization: the dequantize feeds int8 quantizes of other qparams directly
        # (a softmax's fixed 1/256 output read by a matmul that observed its own range).
        users = list(dequantize.users)
        return ([], users) if users and all(is_int8_qdq(u, "quantize") for u in users) else None
    quantizes = []
    for node in order:
        for user in node.users:
            if user in members:
                continue
            if not is_int8_qdq(user, "quantize"):
                return None  # the float value is needed elsewhere: not a function of int8
            quantizes.append(user)
    if not quantizes:
        return None
    position = {n: i for i, n in enumerate(dequantize.graph.nodes)}
    order.sort(key=position.__getitem__)
    return order, quantizes


def island_table(ep: Any, dequantize: Any, island: list[Any], quantize: Any) -> Any:
    """``quantize(f(dequantize(q)))`` for q = -128..127, by the island's own nodes."""
    import torch

    values: dict[Any, Any] = {}
    for node in island:
        for arg in _node_args(node):
            if arg is not dequantize and arg not in island:
                values[arg] = _scalar_constant(ep, arg)
    every_int8 = torch.arange(-128, 128, dtype=torch.int8)
    values[dequantize] = dequantize.target(every_int8, *dequantize.args[1:])
    for node in island:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
        values[node] = node.target(*args, **kwargs)
    table = quantize.target(values[quantize.args[0]], *quantize.args[1:])
    # A one-element constant of higher rank ([1, 1, 1, 1]) broadcasts the 256 values to
    # [1, 1, 1, 256]: the same values, in order.
    return table.to(torch.int8).reshape(256).contiguous()


def _int8_per_tensor(qparams: Any) -> bool:
    """A QuantArgs (qparams folded into a node's meta by the Cortex-M passes) of one scale
    and zero point, int8 over the full range."""
    import torch

    return (not qparams.per_channel and isinstance(qparams.scale, float)
            and isinstance(qparams.zp, int) and (qparams.qmin, qparams.qmax) == _INT8_RANGE
            and qparams.dtype == torch.int8)


def _folded(node: Any) -> tuple[Any, Any] | None:
    """(input, output) qparams of a pointwise operator the Cortex-M passes annotated as
    quantized (its dequantize and quantize folded into its meta) but lowered to no cortex_m
    kernel, so that it would run on int8 bytes as if they were values (a hardswish after an
    add, which only fuses after a convolution or linear): one int8 tensor argument and
    nothing numeric besides (an argument the passes could have moved into the integer
    domain), per-tensor int8 on both sides."""
    import torch

    if not _pointwise(node):
        return None
    inputs, outputs = node.meta.get("input_qparams") or {}, node.meta.get("output_qparams") or {}
    if set(inputs) != {0} or set(outputs) != {0}:
        return None
    if not (_int8_per_tensor(inputs[0]) and _int8_per_tensor(outputs[0])):
        return None
    source = node.args[0] if node.args else None
    val = getattr(source, "meta", {}).get("val")
    if val is None or val.dtype != torch.int8 or node.meta["val"].dtype != torch.int8:
        return None
    if _node_args(node) != [source] or any(
            isinstance(a, (int, float)) for a in (*node.args[1:], *node.kwargs.values())):
        return None
    return inputs[0], outputs[0]


def folded_table(node: Any, qparams_in: Any, qparams_out: Any) -> Any:
    """``quantize(f(dequantize(q)))`` for q = -128..127, for an operator with folded qparams
    (the dequantize and quantize of PT2E's reference, quantized_decomposed's)."""
    import torch

    x = qparams_in.dequantize_value(torch.arange(-128, 128, dtype=torch.int8))
    y = node.target(x, *node.args[1:], **node.kwargs)
    return qparams_out.quantize_value(y).to(torch.int8).reshape(256).contiguous()


def elementwise_lookup_tables(ep: Any, source_of: Any) -> list[LookupTable]:
    """Replace each float island of pointwise operators between an int8 dequantize and
    quantize of `ep` (a lowered cortex_m edge program, changed in place), and each pointwise
    operator left with folded int8 qparams, with a table lookup. `source_of(node)` names a
    node's model line. Returns what was replaced."""
    import torch

    graph = ep.graph_module.graph
    replaced: list[LookupTable] = []
    for dequantize in [n for n in graph.nodes if is_int8_qdq(n, "dequantize")]:
        source = dequantize.args[0]
        val = getattr(source, "meta", {}).get("val")
        if val is None or val.dtype != torch.int8:
            continue
        found = _island(ep, dequantize)
        if found is None:
            continue
        island, quantizes = found
        for quantize in quantizes:
            _replace(ep, quantize, source, island_table(ep, dequantize, island, quantize))
        # A requantization's own nodes were made by the passes, without a model line: its
        # source's (the operator whose output it requantizes) is the one to name.
        traced = [n for n in (*island, dequantize, source, *quantizes)
                  if n.meta.get("stack_trace")]
        replaced.append(LookupTable(
            ops=tuple(_op_name(n.target) for n in island) or ("requantize",),
            source=source_of(traced[0] if traced else quantizes[0])))
        for node in reversed(island):
            if not node.users:
                graph.erase_node(node)
        if not dequantize.users:
            graph.erase_node(dequantize)
    for node in [n for n in graph.nodes if n.op == "call_function"]:
        qparams = _folded(node)
        if qparams is None:
            continue
        _replace(ep, node, node.args[0], folded_table(node, *qparams))
        replaced.append(LookupTable(ops=(_op_name(node.target),), source=source_of(node)))
    if replaced:
        graph.lint()
        ep.graph_module.recompile()
    return replaced


def _replace(ep: Any, node: Any, source: Any, table: Any) -> None:
    """`node` (an int8 result) becomes the lookup of `source` (int8) in `table`, a constant."""
    from executorch.backends.cortex_m.ops import operators  # noqa: F401 (registers the op)
    from executorch.backends.transforms.utils import create_constant_placeholder
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.export.graph_signature import InputKind

    graph = ep.graph_module.graph
    first_placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_before(first_placeholder):
        # Constant placeholders come before the user inputs.
        table_node = create_constant_placeholder(
            ep, graph, f"{node.name}_table", InputKind.PARAMETER, table)
    with graph.inserting_before(node):
        lookup = graph.call_function(exir_ops.edge.cortex_m.quantized_activation.default,
                                     (source, table_node))
    lookup.meta = {k: v for k, v in node.meta.items()
                   if k not in ("input_qparams", "output_qparams")}
    node.replace_all_uses_with(lookup)
    graph.erase_node(node)


def _op_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    name = schema.name if schema is not None else str(target)
    return name.split("::")[-1]
