"""Automatic mixed precision for the cortex_m flow: operators the int8 lowering cannot take
stay in float, the rest is int8, and the export says which and what share of the work.

When one of the Cortex-M passes fails on a node (ExecuTorch v1.4.1's own pass list fails in
``ReplaceScalarWithTensorArgPass`` on attention's ``softmax(...) @ v``, which deploykit's pass
list now lowers early, flows/early_batch_matmul.py; the fallback is for the failures not known
yet), the node is traced back to the model: its operator and the model line it comes
from (the node's stack trace). The quantization is then redone with that operator, at that
line, excluded: a ``PatternQuantizer`` with no configuration placed before the Cortex-M
quantizer's own marks its nodes as not quantized (the quantizer's per-node mechanism, as
``set_module_name(name, None)`` is for modules). If excluding the operator does not help,
its innermost module is excluded instead. This repeats, one operator at a time, up to
``MAX_FALLBACKS``, so what stays float is the smallest set found this way, not a guess.

The first upstream failure is kept with a short reproduction (``export-notes.log`` in the
export directory, one of ``FlowResult.files``), so that it can be taken upstream. ``--strict`` turns
any fallback into an error.

``float_compute`` reports, for the final graph, each float operator that does
multiply-accumulates (``addmm``/``mm``/``bmm``/``convolution``) with its model line and MACs,
beside the MACs of the int8 CMSIS-NN operators: the float share of the work.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploykit.flows.base import NOTES_NAME
from deploykit.readers.op_coverage import model_line

# One operator (or module) is excluded per failure; a model that needs more is reported.
MAX_FALLBACKS = 8
_NODE_RE = re.compile(r"While executing %(\w+)")
_FLOAT_MAC_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::convolution")
_INT8_MAC_OPS = (
    "cortex_m::quantized_linear",
    "cortex_m::quantized_batch_matmul",
    "cortex_m::quantized_conv2d",
    "cortex_m::quantized_depthwise_conv2d",
    "cortex_m::quantized_transpose_conv2d",
)


@dataclass(frozen=True)
class FloatChoice:
    """An operator kept in float: its ATen name at one model line, or a whole module."""

    op: str  # "bmm" (the annotation graph's operator name); "" for a module
    line: str  # "transformer_block.py:40"
    module: str = ""  # a module path ("attn") when the operator alone did not help
    source: str = ""  # the model line with its code, for the report
    # Why, where the reason is not an upstream failure but a kernel's refusal (a CMSIS-NN
    # argument check); not part of the identity of the choice.
    reason: str = field(default="", compare=False)

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        if self.module:
            return f"module {self.module} ({self.source or self.line}){why}"
        return f"{self.op} at {self.source or self.line}{why}"


@dataclass(frozen=True)
class UpstreamFailure:
    step: str  # the pass that failed
    error: str  # its first line
    node: str  # the graph node it failed on
    op: str
    source: str  # the model line

    def log_text(self, model_file: Path, cpu: str, versions: dict[str, str]) -> str:
        return _REPRODUCTION.format(
            step=self.step,
            error=self.error,
            node=self.node,
            op=self.op,
            source=self.source,
            model=model_file.name,
            cpu=cpu,
            versions=", ".join(f"{k} {v}" for k, v in versions.items()),
        )


_REPRODUCTION = """\
ExecuTorch's Cortex-M lowering failed; deploykit kept the operator in float and lowered the
rest to int8 (mixed precision). To take the failure upstream:

  pass:      {step}
  error:     {error}
  node:      {node} ({op})
  from:      {source}
  versions:  {versions}

Reproduction (run next to {model}; the exact steps of the cortex_m_int8 flow):

import importlib.util, torch
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
from executorch.backends.cortex_m.target_config import CortexMTargetConfig
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

spec = importlib.util.spec_from_file_location("m", "{model}")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
x = m.example_inputs()
prepared = prepare_pt2e(torch.export.export(m.model(), x).module(check_guards=False),
                        CortexMQuantizer())
prepared(*x)
quantized = torch.export.export(convert_pt2e(prepared), x)
edge = to_edge_transform_and_lower(quantized, compile_config=EdgeCompileConfig(
    preserve_ops=[torch.ops.aten.linear.default], _check_ir_validity=False))
CortexMPassManager(edge.exported_program(),
                   target_config=CortexMTargetConfig.from_target_string("{cpu}")).transform()
"""


@dataclass
class LoweringFailure:
    """Where the int8 lowering stopped: the step, the upstream error (None for a quantized
    operator the passes did not convert) and the node."""

    step: str
    error: BaseException | None
    node: Any | None  # the graph node, when it could be found
    message: str
    # The annotation graph's operator to keep in float, where the node is a lowered one
    # ("conv2d" for a cortex_m::quantized_conv2d); "" for the node's own operator.
    op: str = ""

    def upstream(self, model_file: Path) -> UpstreamFailure:
        where = innermost_model_line(self.node, model_file) if self.node is not None else None
        return UpstreamFailure(
            step=self.step,
            error=self.message,
            node=self.node.name if self.node is not None else "?",
            op=_qualified_name(self.node.target) if self.node is not None else "?",
            source=where[1] if where else "?",
        )


def _qualified_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else str(target)


def failing_node(exc: BaseException, graph_module: Any) -> Any | None:
    """The node a pass failed on: torch.fx's interpreter notes it ("While executing %name")
    on the exception it re-raises."""
    text = "".join(traceback.format_exception(exc))
    names = _NODE_RE.findall(text)
    if not names:
        return None
    by_name = {n.name: n for n in graph_module.graph.nodes}
    return by_name.get(names[-1])


def op_base(target: Any) -> str:
    """ "bmm" for aten.bmm.default, an edge op, or torch.ops.aten.bmm.out."""
    schema = getattr(target, "_schema", None)
    name = schema.name if schema is not None else getattr(target, "__name__", str(target))
    return name.split("::")[-1].split(".")[0]


def innermost_model_line(node: Any, model_file: Path) -> tuple[str, str] | None:
    """("transformer_block.py:40", "transformer_block.py:40 in forward: <code>") for the
    model file's innermost frame of the node's stack trace."""
    shown = model_line(node.meta.get("stack_trace") or "", model_file)
    if shown is None:
        return None
    return shown.split(" in ")[0], shown


def innermost_module(node: Any) -> str:
    """The innermost module path of the node ("attn", "mlp.0"), "" for the model itself."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return re.sub(r"^L\['self'\]\.?", "", path).replace("_modules['", "").replace("']", "")


def choice_for(
    node: Any, model_file: Path, excluded: list[FloatChoice], op: str = ""
) -> FloatChoice | None:
    """What to keep in float next for a failure at `node`: the operator at its line (`op`,
    else the node's own), else (already excluded) its module, else None (nothing left to
    try)."""
    where = innermost_model_line(node, model_file)
    if where is None:
        return None
    line, source = where
    op_choice = FloatChoice(op=op or op_base(node.target), line=line, source=source)
    if op_choice not in excluded:
        return op_choice
    module = innermost_module(node)
    mod_choice = FloatChoice(op="", line=line, module=module, source=source)
    if module and mod_choice not in excluded:
        return mod_choice
    return None


def excluding(quantizer: Any, excluded: list[FloatChoice], model_file: Path) -> Any:
    """`quantizer` (a CortexMQuantizer) with the `excluded` operators and modules marked as
    not quantized before its own quantizers run."""
    if not excluded:
        return quantizer
    from executorch.backends.arm.quantizer.arm_quantizer_utils import (
        NodeFinder,
        PatternQuantizer,
    )

    class ExcludedNodes(NodeFinder):
        def find_nodes(self, model: Any) -> Any:
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                where = innermost_model_line(node, model_file)
                if where is None:
                    continue
                module = innermost_module(node)
                for c in excluded:
                    if c.line != where[0]:
                        continue
                    if (c.module and (module == c.module or module.startswith(c.module + "."))) or (
                        not c.module and op_base(node.target) == c.op
                    ):
                        yield node
                        break

    matcher = next(q.pattern_matcher for q in quantizer.quantizers if hasattr(q, "pattern_matcher"))
    quantizer.quantizers.insert(
        0, PatternQuantizer(None, node_finder=ExcludedNodes(), pattern_matcher=matcher)
    )
    return quantizer


def _numel(shape: Any) -> int:
    return math.prod(int(d) for d in shape)


def _macs(name: str, node: Any) -> int:
    """Multiply-accumulates of one MAC operator, from the shapes in its metadata."""
    out = node.meta.get("val")
    if out is None or not hasattr(out, "shape"):
        return 0
    args = [a.meta.get("val") if hasattr(a, "meta") else None for a in node.args]
    n_out = _numel(out.shape)
    if name in ("aten::addmm",):
        return n_out * int(args[1].shape[-1])
    if name in (
        "aten::mm",
        "aten::bmm",
        "aten::linear",
        "cortex_m::quantized_linear",
        "cortex_m::quantized_batch_matmul",
    ):
        return n_out * int(args[0].shape[-1])
    if name == "aten::convolution" or name.startswith("cortex_m::quantized_") and "conv" in name:
        weight = args[1]
        return n_out * _numel(weight.shape) // max(1, int(out.shape[1]))
    return 0


def float_compute(graph_module: Any, model_file: Path) -> dict[str, Any]:
    """The float MAC operators of a lowered graph with their model lines and MACs, the int8
    MACs, and the float share."""
    floats: dict[tuple[str, str], dict[str, Any]] = {}
    int8_macs = float_macs = 0
    float_other: set[str] = set()
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        name = schema.name
        if name in _INT8_MAC_OPS:
            int8_macs += _macs(name, node)
        elif name in _FLOAT_MAC_OPS:
            macs = _macs(name, node)
            float_macs += macs
            shown = model_line(node.meta.get("stack_trace") or "", model_file) or "?"
            entry = floats.setdefault(
                (name, shown), {"op": name, "source": shown, "count": 0, "macs": 0}
            )
            entry["count"] += 1
            entry["macs"] += macs
        elif name.startswith("aten::") and _is_float(node):
            float_other.add(name)
    total = int8_macs + float_macs
    return {
        "float_mac_ops": sorted(floats.values(), key=lambda e: -e["macs"]),
        "float_macs": float_macs,
        "int8_macs": int8_macs,
        "float_mac_share": float_macs / total if total else 0.0,
        "other_float_ops": sorted(float_other),
    }


def _is_float(node: Any) -> bool:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)) and val:
        val = val[0]  # native_layer_norm: (out, mean, rstd)
    return hasattr(val, "dtype") and val.dtype.is_floating_point and val.dim() > 0


def summary(report: dict[str, Any], choices: list[FloatChoice]) -> str:
    """One paragraph for the export's warnings."""
    ops = report["float_mac_ops"]
    share = report["float_mac_share"]
    parts = [f"{e['op'].split('::')[-1]} x{e['count']} at {e['source']}" for e in ops[:4]]
    more = f" and {len(ops) - 4} more" if len(ops) > 4 else ""
    why = (
        f" The int8 lowering failed on: {'; '.join(c.describe() for c in choices)}; "
        f"these stay float (the upstream failure and its reproduction: {NOTES_NAME})."
        if choices
        else ""
    )
    return (
        f"Mixed precision: {100 * share:.1f}% of the MACs run in float "
        f"({report['float_macs']:,} float, {report['int8_macs']:,} int8 MACs): "
        f"{', '.join(parts)}{more}.{why}"
    )


def describe_float(report: dict[str, Any]) -> list[str]:
    """Lines for a run report: what ran in float, with model lines and the MAC share."""
    if not report or not (report.get("float_mac_ops") or report.get("kept_in_float")):
        return []
    lines = [
        f"float operators (mixed precision; {100 * report['float_mac_share']:.1f}% of "
        f"the MACs, {report['float_macs']:,} of "
        f"{report['float_macs'] + report['int8_macs']:,}):"
    ]
    lines += [
        f"  {e['op']} x{e['count']} ({e['macs']:,} MACs) at {e['source']}"
        for e in report["float_mac_ops"]
    ]
    if report.get("other_float_ops"):
        lines.append(f"  also float: {', '.join(report['other_float_ops'])}")
    if report.get("kept_in_float"):
        lines.append(
            f"  kept in float after an int8 lowering failure: {'; '.join(report['kept_in_float'])}"
        )
    return lines
