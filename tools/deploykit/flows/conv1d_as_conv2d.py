"""Conv1d as a Conv2d of height 1, for the cortex_m flow: CMSIS-NN has 2-D convolutions only,
so without this a ``Conv1d`` of an int8 model runs as a float portable convolution between a
dequantize and a quantize (a float island).

The rewrite works on the float model's exported graph, before PT2E quantization, so that the
Cortex-M quantizer annotates an ``aten.conv2d`` and the Cortex-M passes lower it to
``cortex_m::quantized_conv2d`` (or ``quantized_depthwise_conv2d``). Each ``aten.conv1d``
with a parameter as its weight becomes::

    view (N, C, 1, L) -> clone to channels-last -> conv2d [-> its activation]
        -> clone to contiguous -> view (N, O, L')

with a (O, C/g, 1, K) weight registered as a parameter of its own (the quantizer quantizes
parameters, not views of them), stride (1, s), padding (0, p), dilation (1, d) and the same
groups. The views cost nothing on the device (ExecuTorch plans a view as an alias). The two
clones are layout copies: CMSIS-NN reads and writes NHWC, and the NHWC bytes of an (N, C, L)
signal are its NCL bytes transposed, so one int8 copy goes in and one comes out. A ReLU,
hardtanh or clamp that is the convolution's only user moves in front of the copy out, so that
it fuses into the CMSIS-NN kernel as it does after a Conv2d.

One exception to height 1: where CMSIS-NN's 1xN kernel (``arm_convolve_1_x_n_s8``, which the
convolution wrapper picks for a height-1 input whose stride x channels is a multiple of 4)
would refuse the padding on an MVE core (``one_by_n_refuses``: the output leaves part of the
right padding unread, as Conv1d(k5, s2, p2) over 50 samples does; issue #32), the signal is a
column of width 1 instead: view (N, C, L, 1), a (O, C/g, K, 1) weight, stride (s, 1), padding
(p, 0). Its NHWC bytes are the same, the views still cost nothing, and the wrapper sends it to
the general im2col convolution, which takes any padding.

Left as they are (and so still float islands): a convolution whose weight is computed (a slice
or a product of parameters: nothing to quantize as a weight), and ``padding="same"`` with an
odd total padding (asymmetric; a Conv2d pads symmetrically). A padding mode other than zeros
is an ``aten.pad`` before the convolution in the exported graph: the convolution is rewritten,
the pad stays (a reflect pad runs as portable index kernels on the int8 signal, a fallback of
its own that ``inspect`` lists and ``--strict`` refuses).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.flows.common import call_like
from deploykit.flows.mixed_precision import innermost_model_line, innermost_module

# Activations the Cortex-M quantizer fuses into a preceding conv2d (quantizer_support.py).
_CHANNELWISE = (
    "relu.default",
    "relu_.default",
    "hardtanh.default",
    "hardtanh_.default",
    "clamp.default",
    "clamp_.default",
)


@dataclass(frozen=True)
class Conv1dRewrite:
    """What the rewrite did to one graph: the convolutions it rewrote and those it left, each
    named by its node and model line where known."""

    rewritten: tuple[str, ...]
    left: tuple[str, ...]  # "<node>: <why>"

    def report(self) -> dict[str, list[str]]:
        """The entries of export.json's ``mixed_precision``, where there is anything to say."""
        return {
            **({REWRITTEN_KEY: list(self.rewritten)} if self.rewritten else {}),
            **({LEFT_KEY: list(self.left)} if self.left else {}),
        }


REWRITTEN_KEY = "conv1d_as_conv2d"
LEFT_KEY = "conv1d_left_float"


def describe(report: dict[str, Any]) -> list[str]:
    """One line per kind for the export and run reports, from export.json's
    ``mixed_precision``."""
    done, left = report.get(REWRITTEN_KEY, []), report.get(LEFT_KEY, [])
    lines = []
    if done:
        column = any(d.endswith("(as a column)") for d in done)
        lines.append(
            f"Conv1d lowered as Conv2d of height 1{' (or width 1)' if column else ''}: "
            f"{len(done)} layer{'s' if len(done) > 1 else ''} ({', '.join(done)})"
        )
    if left:
        lines.append(f"Conv1d left in float: {'; '.join(left)}")
    return lines


def conv1d_as_conv2d(graph_module: Any, model_file: Path) -> Conv1dRewrite:
    """Rewrite every ``aten.conv1d`` of `graph_module` (a float graph from
    ``torch.export.export(...).module()``) that has a parameter as its weight into a Conv2d of
    height 1, in place. `model_file` names the layers in the result by their model lines."""
    import torch

    graph = graph_module.graph
    # (a 1-D weight's target, tall) -> its (O, I/g, 1, K) or (O, I/g, K, 1) get_attr
    weights_2d: dict[tuple[str, bool], Any] = {}
    replaced_weights: list[Any] = []
    # The 3-D output of a rewritten convolution -> the channels-last 4-D tensor it is a copy
    # of: a Conv1d reading it reads that tensor instead, with no copy out and in between.
    channels_last_of: dict[tuple[Any, bool], Any] = {}
    rewritten: list[str] = []
    left: list[str] = []
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (
            aten.conv1d.default,
            aten.conv1d.padding,
        ):
            continue
        x, weight, bias, stride, padding, dilation, groups = _conv1d_args(node)
        where = _where(node, model_file)
        why = _why_not(weight, padding, dilation)
        if why:
            left.append(f"{where}: {why}")
            continue
        if isinstance(padding, str):  # "valid", or "same" with an even total (checked above)
            extent = dilation[0] * (weight.meta["val"].shape[-1] - 1)
            padding = [0 if padding == "valid" else extent // 2]
        fake = _fake_mode(node)
        *batch, c, length = x.meta["val"].shape  # an unbatched (C, L) too
        kernel = weight.meta["val"].shape[-1]
        # A signal of height 1 is what CMSIS-NN's 1xN kernel takes, except where that kernel
        # refuses the padding (below); there the signal stands as a column of width 1, whose
        # NHWC bytes are the same, and runs in the general im2col convolution.
        tall = one_by_n_refuses(length, c, kernel, stride[0], padding[0], dilation[0], groups)
        key = (weight.target, tall)
        if key not in weights_2d:
            weights_2d[key] = _weight_2d(graph_module, weight, fake, tall)
            if weight not in replaced_weights:
                replaced_weights.append(weight)
        followers = _channelwise_followers(node)
        last = followers[-1] if followers else node
        with graph.inserting_before(last):
            x4 = channels_last_of.get((x, tall))
            if x4 is None:
                n = batch[0] if batch else 1
                shape = [n, c, length, 1] if tall else [n, c, 1, length]
                x4 = call_like(graph, node, fake, aten.view.default, x, shape)
                x4 = call_like(
                    graph, node, fake, aten.clone.default, x4, memory_format=torch.channels_last
                )
            along = (lambda v: [v, 1]) if tall else (lambda v: [1, v])
            across = (lambda v: [v, 0]) if tall else (lambda v: [0, v])
            conv_args = (x4, weights_2d[key], bias, along(stride[0]), across(padding[0]))
            y = call_like(
                graph, node, fake, aten.conv2d.default, *conv_args, along(dilation[0]), groups
            )
            for f in followers:
                y = call_like(graph, f, fake, f.target, y, *f.args[1:], **f.kwargs)
            y4 = y
            y = call_like(
                graph, last, fake, aten.clone.default, y, memory_format=torch.contiguous_format
            )
            y = call_like(graph, last, fake, aten.view.default, y, list(last.meta["val"].shape))
        channels_last_of[(y, tall)] = y4
        last.replace_all_uses_with(y)
        for old in [*reversed(followers), node]:
            graph.erase_node(old)
        rewritten.append(f"{where} (as a column)" if tall else where)
    if rewritten:
        _drop_dead(graph_module, replaced_weights, channels_last_of)
        graph.lint()
        graph_module.recompile()
    return Conv1dRewrite(tuple(rewritten), tuple(left))


def one_by_n_refuses(
    length: int, channels: int, kernel: int, stride: int, padding: int, dilation: int, groups: int
) -> bool:
    """Whether CMSIS-NN's arm_convolve_wrapper_s8 sends a Conv2d of height 1 with these
    parameters to arm_convolve_1_x_n_s8 and that kernel's MVE (Cortex-M55) code returns
    ARM_CMSIS_NN_FAILURE: it pads the right side with what the output length leaves over, so
    it needs the total padding the output uses to be 2 x padding (or one more). PyTorch's
    output drops the right padding a stride does not reach (Conv1d(k5, s2, p2) over 50
    samples uses 3 of its 4 padded samples), which the kernel refuses. The conditions are
    those of arm_nn_is_convolve_1x1 and arm_nn_is_convolve_1_x_n (CMSIS-NN
    arm_nnsupportfunctions.h) and arm_convolve_1_x_n_s8.c."""
    if dilation != 1 or groups != 1 or (stride * channels) % 4:
        return False  # not the 1xN kernel
    if kernel == 1 and padding == 0:
        return False  # the 1x1 kernels
    out = (length + 2 * padding - kernel) // stride + 1
    total = (out - 1) * stride + kernel - length
    return padding * 2 + total % 2 != total


def _conv1d_args(node: Any) -> tuple[Any, ...]:
    defaults = (None, None, None, [1], [0], [1], 1)
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    args = list(node.args) + list(defaults[len(node.args) :])
    for i, name in enumerate(names):
        if name in node.kwargs:
            args[i] = node.kwargs[name]
    return tuple(args)


def _why_not(weight: Any, padding: Any, dilation: list[int]) -> str:
    if getattr(weight, "op", None) != "get_attr":
        return "its weight is computed in the model, not a parameter"
    if padding == "same":
        total = dilation[0] * (weight.meta["val"].shape[-1] - 1)
        if total % 2:
            return (
                "padding='same' pads unevenly here (a kernel of even extent); a Conv2d "
                "pads both sides alike"
            )
    return ""


def _where(node: Any, model_file: Path) -> str:
    """The model line of the layer, else (a model built of library modules) its module."""
    where = innermost_model_line(node, model_file)
    if where and where[0].startswith(f"{model_file.name}:"):
        return where[0]
    module = innermost_module(node)
    return f"module {module}" if module else node.name


def _channelwise_followers(conv: Any) -> list[Any]:
    """The nodes after `conv`, each the only user of the one before, that compute per channel
    and position (an inference BatchNorm, ReLU, hardtanh, clamp): they work on the 4-D tensor
    as on the 3-D one, and there the quantizer folds or fuses them into the convolution."""
    followers: list[Any] = []
    node = conv
    while len(node.users) == 1:
        user = next(iter(node.users))
        name = f"{getattr(user.target, '__name__', '')}"
        if user.op != "call_function" or user.args[0] is not node:
            break
        if name in _CHANNELWISE or (name == "batch_norm.default" and user.args[5] is False):
            followers.append(user)
            node = user
        else:
            break
    return followers


def _fake_mode(node: Any) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([a.meta["val"] for a in node.all_input_nodes if "val" in a.meta])


def _weight_2d(graph_module: Any, weight: Any, fake: Any, tall: bool = False) -> Any:
    """A get_attr of a new parameter holding `weight`'s tensor as (O, I/g, 1, K), or
    (O, I/g, K, 1) when `tall`."""
    import torch

    tensor = _attr(graph_module, weight.target).detach()
    name = weight.target.replace(".", "_") + ("_as_conv2d_tall" if tall else "_as_conv2d")
    while hasattr(graph_module, name):
        name += "_"
    graph_module.register_parameter(
        name,
        torch.nn.Parameter(tensor.unsqueeze(3 if tall else 2).clone(), requires_grad=False),
    )
    with graph_module.graph.inserting_after(weight):
        node = graph_module.graph.get_attr(name)
    node.meta.update({k: v for k, v in weight.meta.items() if k != "val"})
    # Static: a weight of a fake mode with dynamic shapes would otherwise get a symbolic
    # extent (a column weight did), which then reaches the view shapes after it.
    node.meta["val"] = fake.from_tensor(getattr(graph_module, name), static_shapes=True)
    return node


def _attr(root: Any, target: str) -> Any:
    for part in target.split("."):
        root = getattr(root, part)
    return root


def _drop_dead(graph_module: Any, weights: list[Any], channels_last_of: dict[Any, Any]) -> None:
    """Remove what the rewrite left unused: copies out that only fed another rewritten
    convolution, and the 1-D weights (so that they are not exported as well)."""
    graph = graph_module.graph
    for view, _ in channels_last_of:
        if not view.users:
            clone = view.args[0]
            graph.erase_node(view)
            graph.erase_node(clone)
    for node in weights:
        if not node.users:
            owner, _, name = node.target.rpartition(".")
            graph.erase_node(node)
            delattr(_attr(graph_module, owner) if owner else graph_module, name)
