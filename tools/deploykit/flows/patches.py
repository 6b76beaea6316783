"""Patch-based execution of a model's first stage (MCUNetV2, Lin et al., NeurIPS 2021).

Image models need the most activation memory in their first layers, where the feature maps
are large. This rewrite of the float model (the graph of ``torch.export(...).module()``,
before quantization) runs that *stage*, from the input up to a chosen layer (the *split*),
on overlapping spatial tiles, one tile after the other: only the split layer's output, which
is much smaller, is ever whole.

Which nodes form the stage: everything from the single 4-D input up to the split that is a
convolution (any groups, stride, padding, dilation), a max or average pooling (floor mode),
a per-position operator (BatchNorm in inference, ReLU, ReLU6/hardtanh, clamp, sigmoid,
hardswish, ...) or an elementwise operator between two stage tensors of the same geometry (a
residual add). The split is a node that is the only stage node still read after it. A global
operator (a mean, an adaptive pooling), a reshape, a linear layer or attention ends the
stage: the first such node is where tiling stops, and the reason `auto` reports.

How one tile is computed (per spatial dimension, rows and columns alike): the tile's output
rows [o0, o1) of the split need, going back through each window operator (kernel k, stride s,
padding p, dilation d), the input rows [o0*s - p, (o1 - 1)*s - p + d*(k - 1) + 1), clamped
to the real map. The input slice starts at a multiple of the stage's total stride, so every
strided layer of the tile sees the same sampling grid as the whole map. Each layer then runs
on its tile with the layer's own padding: at a real border that padding *is* the map's
padding; at an edge between tiles it is not, and the outputs that read it are wrong. Those
rows are tracked forward (the valid region shrinks by each layer's reach) and never used:
the input slice is wide enough that the valid region covers the tile's output, which is cut
out of it. So every tile's output equals the corresponding part of the whole map, and zero
padding applies only at the real borders.

A single row of tiles (a grid 1xM: column strips, left to right) over a chain (each layer
reads the one before: no residual add) does not recompute that overlap: it carries it
(`_carried_columns`, `CarryStep`). Tile c computes of every stage tensor only the columns
no earlier tile has (up to where the next tile's layers need them); a window layer reads
the last columns of its input that the previous tile kept (at most extent - stride of
them, a small slice cut from the previous tile's input, which then dies) joined along the
width to this tile's new columns, and runs without column padding, so that it computes
exactly its new output columns. At the map's borders (the first tile's left, the last
tile's right) the layer runs with its own padding, which there is the map's; the few
columns it computes from that padding on the side inside the map are wrong and cut off
before the next layer reads them (on the last tile the input starts on the layer's stride
grid, a column or two earlier than needed, so that its sampling grid is the map's). The
tiles' outputs are the split's columns, joined along the width; the extra MACs are those
few border columns. Where this does not apply (several rows, a residual add, tiles too
narrow for the layers' reach), every tile recomputes its overlap as above.

The graph after the rewrite, per row of tiles: the input's rows (one slice), per tile its
columns (one slice), the stage's operators on the tile (the same weight and parameter nodes
as the whole map: the same numbers), the tile's columns cut to its output; the row's tiles
concatenated along the width, the rows cut to their output; at the end the rows concatenated
along the height. The nodes are in that order, so a tile's intermediates are dead before the
next tile starts, and ExecuTorch's memory planner reuses their memory (the plan is read back
from the ``.pte``, not assumed).

Quantization: the tiles of one layer share the layer's quantization parameters. The int8
flows calibrate the model without patches and hand every tile's observer the observer of its
layer (``share_observers``), so the scales and zero points are those of the unpatched program
and its outputs are the same, bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from deploykit.flows.common import call_like
from deploykit.util.errors import ConfigError

OFF = "off"
AUTO = "auto"
_GRID = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")
# `auto`: at most this many more MACs than the model without patches.
DEFAULT_MAC_BUDGET = 0.25
# The node meta key naming the unpatched node a tile's node computes a part of.
ORIGIN_KEY = "deploykit_patch_of"
MAX_AUTO_GRID = 8
# What one more instruction costs the method allocator (Method::load: its values, tensors,
# argument lists and the instruction), measured: mobilenet_v1_025 int8 in 1x6 tiles up to
# its 8th layer has 62 more instructions and a method pool 25,732 B larger (21,076 B ->
# 46,808 B, program/method_memory.py). `auto` takes only grids whose activations plus this
# growth are below the activations without tiles, breaks ties with it, and reports it.
METHOD_BYTES_PER_INSTRUCTION = 415
# A slice or a join of tiles costs less: its arguments are a few integers, its input and its
# output. Measured: mobilenet_v1_025 int8 in 1x4 tiles up to relu_7 that carry their overlap
# has 57 more instructions, 24 of them the layers' and 33 slices and joins, and a method pool
# 17,932 B larger (21,080 B -> 39,012 B on qemu-an547): (17,932 - 24 x 415) / 33 = 241 B.
METHOD_BYTES_PER_COPY = 241

_POINTWISE = {
    "relu.default", "relu_.default", "hardtanh.default", "hardtanh_.default",
    "clamp.default", "clamp_.default", "sigmoid.default", "tanh.default", "silu.default",
    "hardswish.default", "hardswish_.default", "hardsigmoid.default", "hardsigmoid_.default",
    "dropout.default", "leaky_relu.default", "relu6.default", "gelu.default",
}
_BINARY = {"add.Tensor", "mul.Tensor", "sub.Tensor", "div.Tensor"}


def parse_patches(value: str | None, where: str = "--patches") -> tuple[int, int] | str:
    """`auto`, `off` or a grid "NxM" (N rows by M columns of tiles) -> AUTO, OFF or (N, M)."""
    text = OFF if value is None else str(value).strip().lower()
    if text in (AUTO, OFF):
        return text
    match = _GRID.match(text)
    if not match:
        raise ConfigError(f"{where} {value}: not a tile grid.",
                          "Give auto, off, or NxM (rows x columns of tiles, e.g. 3x3).")
    grid = (int(match.group(1)), int(match.group(2)))
    if grid == (1, 1):
        raise ConfigError(f"{where} {value}: a 1x1 grid is the whole map.",
                          "Give at least two tiles (e.g. 2x2), or off.")
    return grid


@dataclass(frozen=True)
class Window:
    """One spatial dimension of a window operator (a convolution or a pooling)."""

    kernel: int
    stride: int
    padding: int
    dilation: int = 1

    @property
    def extent(self) -> int:
        return self.dilation * (self.kernel - 1) + 1

    def out_size(self, size: int) -> int:
        return (size + 2 * self.padding - self.extent) // self.stride + 1

    def needs(self, lo: int, hi: int) -> tuple[int, int]:
        """The input rows [lo', hi') that the output rows [lo, hi) read (padding included)."""
        return lo * self.stride - self.padding, (hi - 1) * self.stride - self.padding + \
            self.extent


@dataclass(frozen=True)
class Span:
    """A tile's extent in one dimension of one stage tensor, in whole-map coordinates: it holds
    rows [start, start + size); rows [valid_lo, valid_hi) equal the whole map's."""

    start: int
    size: int
    valid_lo: int
    valid_hi: int
    padding: int = 0  # a window layer's padding on the tile (its own, or 0 inside the map)


@dataclass
class StageNode:
    """A node of the stage: how its output's geometry follows from its stage inputs."""

    node: Any
    kind: str  # "window", "pointwise", "binary"
    inputs: list[Any]  # the stage nodes it reads (the input placeholder included)
    windows: tuple[Window, Window] | None = None  # (rows, columns) for "window"
    shape: tuple[int, ...] = ()  # its output shape (N, C, H, W) on the whole map
    macs: int = 0  # multiply-accumulates on the whole map


@dataclass(frozen=True)
class Stage:
    """The leading stage of a graph up to its split node, in graph order."""

    input: Any  # the placeholder
    input_shape: tuple[int, ...]
    nodes: tuple[StageNode, ...]

    @property
    def split(self) -> StageNode:
        return self.nodes[-1]

    @property
    def stride(self) -> tuple[int, int]:
        """The total stride from the input to the split, per dimension."""
        return _total_stride(self.nodes, self.input)


@dataclass
class Stages:
    """What the graph offers: each node that can end a stage (in order), and why tiling stops
    where it does."""

    input: Any
    input_shape: tuple[int, ...]
    nodes: list[StageNode] = field(default_factory=list)
    splits: list[int] = field(default_factory=list)  # indices into nodes
    stop: str = ""  # why the stage cannot go further

    def stage(self, split: int) -> Stage:
        return Stage(self.input, self.input_shape, tuple(self.nodes[: split + 1]))


def _name(node: Any) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _ints(value: Any, default: int, count: int = 2) -> tuple[int, ...]:
    if value is None or value == []:
        return (default,) * count
    if isinstance(value, int):
        return (value,) * count
    values = tuple(int(v) for v in value)
    return values * count if len(values) == 1 else values


def _arg(node: Any, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _windows(node: Any) -> tuple[tuple[Window, Window] | None, str]:
    """The (rows, columns) windows of a convolution or pooling node, or why it is not tiled."""
    name = _name(node)
    if name == "conv2d.default":
        weight = node.args[1]
        if getattr(weight, "op", None) != "get_attr":
            return None, "its weight is computed in the model"
        kh, kw = weight.meta["val"].shape[-2:]
        stride = _ints(_arg(node, 3, "stride", 1), 1)
        padding = _ints(_arg(node, 4, "padding", 0), 0)
        dilation = _ints(_arg(node, 5, "dilation", 1), 1)
    elif name == "conv2d.padding":
        return None, "a convolution with padding given as a string"
    elif name in ("max_pool2d.default", "avg_pool2d.default"):
        kh, kw = _ints(node.args[1], 1)
        stride = _ints(_arg(node, 2, "stride", []) or node.args[1], 1)
        padding = _ints(_arg(node, 3, "padding", 0), 0)
        if name == "max_pool2d.default":
            dilation = _ints(_arg(node, 4, "dilation", 1), 1)
            ceil = _arg(node, 5, "ceil_mode", False)
        else:
            dilation = (1, 1)
            ceil = _arg(node, 4, "ceil_mode", False)
            if _arg(node, 6, "divisor_override", None) is not None:
                return None, "an average pooling with a divisor override"
        if ceil:
            return None, "a pooling in ceil mode"
    else:
        return None, ""
    return (Window(int(kh), stride[0], padding[0], dilation[0]),
            Window(int(kw), stride[1], padding[1], dilation[1])), ""


def _macs(node: Any, shape: tuple[int, ...]) -> int:
    if _name(node) != "conv2d.default":
        return 0
    weight = node.args[1].meta["val"].shape  # (O, I/g, kh, kw)
    return math.prod(shape) * int(weight[1]) * int(weight[2]) * int(weight[3])


def _is_4d(node: Any) -> bool:
    val = getattr(node, "meta", {}).get("val")
    return val is not None and hasattr(val, "shape") and len(val.shape) == 4


def find_stages(graph_module: Any) -> Stages:
    """The stage nodes of `graph_module` in graph order and where it can be split."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    images = [n for n in placeholders if _is_4d(n)]
    if len(placeholders) != 1 or len(images) != 1:
        return Stages(None, (), stop="the model does not take a single 4-D image input")
    x = images[0]
    stages = Stages(x, tuple(int(d) for d in x.meta["val"].shape))
    in_stage = {x}
    open_nodes = {x}  # stage nodes with users not yet visited
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        reads = [a for a in node.all_input_nodes if a in in_stage]
        if not reads:
            continue
        entry, why = _stage_node(node, reads)
        if entry is None:
            stages.stop = f"{node.name} ({_name(node)}): {why}"
            break
        stages.nodes.append(entry)
        in_stage.add(node)
        open_nodes.add(node)
        for a in reads:
            if all(u in in_stage for u in a.users):
                open_nodes.discard(a)
        if open_nodes == {node}:
            stages.splits.append(len(stages.nodes) - 1)
    # A split right before a per-position operator would part it from the layer it fuses
    # with (a convolution's BatchNorm and activation): the stage ends after it instead.
    stages.splits = [i for i in stages.splits
                     if i + 1 >= len(stages.nodes) or not _fuses(stages.nodes[i + 1].node)]
    return stages


_FUSING = ("batch_norm.default", "relu.default", "relu_.default", "hardtanh.default",
           "hardtanh_.default", "clamp.default", "clamp_.default")


def _fuses(node: Any) -> bool:
    """Whether `node` is a per-position operator that the int8 lowering folds or fuses into
    the operator before it (its only reader): no tensor of its own on the device."""
    if _name(node) not in _FUSING or not node.args:
        return False
    before = node.args[0]
    return hasattr(before, "users") and len(before.users) == 1 and before.op == "call_function"


def _stage_node(node: Any, reads: list[Any]) -> tuple[StageNode | None, str]:
    if node.op != "call_function":
        return None, "not an operator call"
    if not _is_4d(node):
        return None, "its output is not a 4-D map (a global or reshaping operator)"
    shape = tuple(int(d) for d in node.meta["val"].shape)
    name = _name(node)
    windows, why = _windows(node)
    if windows is not None:
        if reads != [node.args[0]]:
            return None, "its weight or parameters come from the stage"
        return StageNode(node, "window", reads, windows, shape, _macs(node, shape)), ""
    if why:
        return None, why
    first = node.args[0] if node.args else None
    if name in _POINTWISE or (name == "batch_norm.default" and not _arg(node, 5, "training",
                                                                         False)):
        if reads != [first]:
            return None, "its parameters come from the stage"
        return StageNode(node, "pointwise", reads, shape=shape), ""
    if name in _BINARY:
        shapes = {tuple(a.meta["val"].shape[-2:]) for a in reads}
        others = [a for a in node.args[:2] if a not in reads]
        if len(shapes) != 1 or any(_is_4d(a) and tuple(a.meta["val"].shape[-2:]) != (1, 1)
                                   for a in others if hasattr(a, "meta")):
            return None, "an elementwise operator over maps of different sizes"
        return StageNode(node, "binary", reads, shape=shape), ""
    return None, "not a convolution, pooling or per-position operator (a global operator, " \
        "a reshape, a linear layer or attention cannot be tiled)"


def _total_stride(nodes: tuple[StageNode, ...], x: Any) -> tuple[int, int]:
    stride: dict[Any, tuple[int, int]] = {x: (1, 1)}
    for s in nodes:
        before = {stride[a] for a in s.inputs}
        if len(before) != 1:
            raise ConfigError(f"{s.node.name}: its inputs are sampled at different strides.",
                              "Tile a stage without such a branch (--patches off).")
        (rh, rw), = before
        if s.windows is not None:
            rh, rw = rh * s.windows[0].stride, rw * s.windows[1].stride
        stride[s.node] = (rh, rw)
    return stride[nodes[-1].node]


# ---- one dimension of one tile ----

def _backward(stage: Stage, dim: int, lo: int, hi: int) -> tuple[int, int]:
    """The input rows (dim 0) or columns (dim 1) the split's [lo, hi) needs, in the map."""
    need: dict[Any, tuple[int, int]] = {stage.split.node: (lo, hi)}
    size = stage.input_shape[2 + dim]
    for s in reversed(stage.nodes):
        a, b = need[s.node]
        if s.windows is not None:
            full = s.inputs[0].meta["val"].shape[2 + dim]
            a, b = s.windows[dim].needs(a, b)
            a, b = max(a, 0), min(b, int(full))
        for src in s.inputs:
            old = need.get(src)
            need[src] = (a, b) if old is None else (min(old[0], a), max(old[1], b))
    a, b = need[stage.input]
    return max(a, 0), min(b, size)


def _forward(stage: Stage, dim: int, start: int, end: int, shrink: bool) -> dict[Any, Span] | None:
    """Each stage tensor's span for an input slice [start, end) of one dimension; None when a
    strided layer of the tile would sample another grid than the whole map's, or the operands
    of an elementwise operator would cover different parts of the map.

    A window layer pads a tile that reaches a border of the map (its padding there is the
    map's own) with the layer's padding on both sides; with `shrink`, a tile inside the map
    not at all: it reads only real rows and computes only the rows they determine (without,
    every layer keeps the tile's extent, which elementwise operators over branches need). The
    rows next to a side padded inside the map are wrong and left out of the valid region."""
    size = stage.input_shape[2 + dim]
    spans: dict[Any, Span] = {stage.input: Span(start, end - start, start, end)}
    full: dict[Any, int] = {stage.input: size}
    for s in stage.nodes:
        ins = [spans[a] for a in s.inputs]
        full[s.node] = int(s.shape[2 + dim])
        if s.windows is None:
            if len({(i.start, i.size) for i in ins}) != 1:
                return None
            spans[s.node] = Span(ins[0].start, ins[0].size, max(i.valid_lo for i in ins),
                                 min(i.valid_hi for i in ins))
            continue
        w = s.windows[dim]
        i = ins[0]
        total = full[s.inputs[0]]
        at_start, at_end = i.start == 0, i.start + i.size == total
        pad = w.padding if at_start or at_end or not shrink else 0
        if (i.start - pad + w.padding) % w.stride:
            return None
        out_start = (i.start - pad + w.padding) // w.stride
        out_size = (i.size + 2 * pad - w.extent) // w.stride + 1
        if out_size < 1:
            return None
        # Output m reads [m*s - p, m*s - p + extent): valid where that is valid data or the
        # map's own padding.
        lo = -w.padding if at_start and i.valid_lo == 0 else i.valid_lo
        hi = total + w.padding if at_end and i.valid_hi == total else i.valid_hi
        valid_lo = max(-(-(lo + w.padding) // w.stride), out_start)
        valid_hi = min((hi - w.extent + w.padding) // w.stride + 1, out_start + out_size)
        spans[s.node] = Span(out_start, out_size, valid_lo, max(valid_hi, valid_lo), pad)
    return spans


def _cuts(size: int, parts: int) -> list[tuple[int, int]]:
    """`size` rows in `parts` nearly equal runs, the larger first."""
    base, extra = divmod(size, parts)
    cuts, at = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        cuts.append((at, at + n))
        at += n
    return cuts


@dataclass(frozen=True)
class DimPlan:
    """The tiles of one dimension: per tile its output run at the split, its input slice and
    every stage tensor's span."""

    outputs: tuple[tuple[int, int], ...]
    inputs: tuple[tuple[int, int], ...]
    spans: tuple[dict[Any, Span], ...]
    # Columns whose tiles carry their overlap (`_carried_columns`): per tile, each window
    # layer's step; empty where every tile recomputes it.
    carry: tuple[dict[Any, CarryStep], ...] = ()


@dataclass(frozen=True)
class CarryStep:
    """One window layer on one tile of a row of tiles that carry their overlap. The tile owes
    the layer's output columns `out` (whole-map coordinates) and runs the layer on its input
    columns `input`: the last `carried` of them kept from the previous tile, then this tile's
    own. Inside the map the layer runs without column padding and computes exactly `out`; at
    a border of the map it runs with its own padding (the map's there: zeros for a
    convolution, what a pooling pads with for it) on both sides, computing the columns
    `computed`, of which those reading the padding on the side inside the map are wrong and
    cut off before the next layer reads them (on the last tile, the input starts on the
    layer's stride grid for that, a few columns before what `out` needs). `keep`: how many of
    the last input columns the next tile carries."""

    out: tuple[int, int]
    input: tuple[int, int]
    carried: int
    padding: int
    computed: tuple[int, int]
    keep: int = 0


def _carry_refusal(stage: Stage) -> str:
    """Why the tiles of a row cannot carry their overlap along the width ("" if they can):
    it takes a chain, each layer reading the one before."""
    readers: dict[Any, int] = {}
    for s in stage.nodes:
        if len(s.inputs) != 1:
            return f"{s.node.name} joins two branches of the stage (a residual add)"
        readers[s.inputs[0]] = readers.get(s.inputs[0], 0) + 1
    if any(count > 1 for count in readers.values()):
        return "a stage tensor is read by two branches"
    return ""


def _carried_columns(stage: Stage, parts: int) -> DimPlan | None:
    """The columns of a single row of `parts` tiles over a chain, each tile computing of every
    stage tensor the columns no earlier tile has (`CarryStep`; at most a few more at the last
    tile's left, for the stride grid); None where a tile would compute no new column of some
    tensor, or would need columns the previous tile does not hold (tiles too narrow for the
    layers' reach)."""
    x, split = stage.input, stage.split.node
    widths = {x: stage.input_shape[3], **{s.node: s.shape[3] for s in stage.nodes}}
    outputs = _cuts(widths[split], parts)
    # Each tensor's columns up to the end of each tile: backwards from the split's run, the
    # input columns the layer needs; the last tile computes the rest of every map.
    ends: list[dict[Any, int]] = []
    for _, hi in outputs[:-1]:
        end = {split: hi}
        for s in reversed(stage.nodes):
            at = end[s.node]
            if s.windows is not None:
                at = min(widths[s.inputs[0]], s.windows[1].needs(0, at)[1])
            end[s.inputs[0]] = at
        ends.append(end)
    ends.append(dict(widths))
    starts = [{n: 0 for n in widths}, *ends[:-1]]
    if any(ends[c][s.node] <= starts[c][s.node] for c in range(parts) for s in stage.nodes):
        return None
    steps: list[dict[Any, CarryStep]] = []
    spans: list[dict[Any, Span]] = []
    inputs: list[tuple[int, int]] = []
    for c in range(parts):
        tile: dict[Any, CarryStep] = {}
        read = (starts[c][x], ends[c][x])
        for s in stage.nodes:
            if s.windows is None:
                continue
            step = _carry_step(s, starts[c], ends[c])
            if step is None:
                return None
            source = s.inputs[0]
            carried = 0 if source is x else max(0, starts[c][source] - step.input[0])
            if carried and (c == 0 or
                            carried > ends[c - 1][source] - steps[c - 1][s.node].input[0]):
                return None  # the previous tile does not hold the columns
            tile[s.node] = dataclasses.replace(step, carried=carried)
            if source is x:
                read = step.input
        steps.append(tile)
        inputs.append(read)
        spans.append({n: Span(starts[c][n], ends[c][n] - starts[c][n], starts[c][n],
                              ends[c][n]) for n in widths if n is not x}
                     | {x: Span(read[0], read[1] - read[0], *read)})
    for c in range(parts - 1):
        for node, step in steps[c].items():
            steps[c][node] = dataclasses.replace(step, keep=steps[c + 1][node].carried)
    return DimPlan(tuple(outputs), tuple(inputs), tuple(spans), tuple(steps))


def _carry_step(s: StageNode, starts: dict[Any, int], ends: dict[Any, int]
                ) -> CarryStep | None:
    """Window layer `s` on a tile that owes its columns [starts, ends) (`CarryStep`, with
    `carried` left 0), or None when that tile cannot compute them on its own."""
    w = s.windows[1]
    o0, o1 = starts[s.node], ends[s.node]
    need_lo, need_hi = w.needs(o0, o1)
    lo, hi = need_lo, ends[s.inputs[0]]
    padding, computed = 0, (o0, o1)
    if need_lo < 0:  # the map's left border: the columns reading the right padding are cut
        padding, lo = w.padding, 0
        computed = (0, (hi + 2 * w.padding - w.extent) // w.stride + 1)
    elif need_hi > hi:  # the right border: the input starts on the stride grid
        padding = w.padding
        first = o0 - -(-w.padding // w.stride)
        lo = first * w.stride
        computed = (first, first + (hi - lo + 2 * w.padding - w.extent) // w.stride + 1)
    elif (hi - lo - w.extent) // w.stride + 1 != o1 - o0:
        return None
    if lo < 0 or computed[0] > o0 or computed[1] < o1:
        return None
    return CarryStep((o0, o1), (lo, hi), 0, padding, computed)


def _covers(stage: Stage, spans: dict[Any, Span] | None, lo: int, hi: int) -> bool:
    got = spans[stage.split.node] if spans is not None else None
    return got is not None and got.valid_lo <= lo and hi <= got.valid_hi


def _exact_slice(stage: Stage, dim: int, lo: int, hi: int, need_lo: int,
                 need_hi: int) -> tuple[tuple[int, int], dict[Any, Span]] | None:
    """The input slice of the split's [lo, hi) when every layer reads only what it needs (a
    tile inside the map unpadded): the rows the receptive field needs, else a few more
    (down to a start where every strided layer samples the map's grid)."""
    for a in range(need_lo, max(need_lo - 4 * stage.stride[dim], 0) - 1, -1):
        spans = _forward(stage, dim, a, need_hi, shrink=True)
        if _covers(stage, spans, lo, hi):
            return (a, need_hi), spans
    return None


def _widened_slice(stage: Stage, dim: int, lo: int, hi: int, need_lo: int, need_hi: int,
                   full: int) -> tuple[tuple[int, int], dict[Any, Span]] | None:
    """The input slice of the split's [lo, hi) when every layer keeps the tile's extent (a
    stage with a residual branch): each layer's padding inside the map spoils the rows next
    to it, so the slice widens, by whole steps of the stage's stride (which keeps every
    strided layer on the map's grid), until the split's valid rows cover the tile."""
    step = stage.stride[dim]
    a, b = need_lo - need_lo % step, need_hi
    while True:
        spans = _forward(stage, dim, a, b, shrink=False)
        if spans is None:
            return None
        if _covers(stage, spans, lo, hi):
            return (a, b), spans
        got = spans[stage.split.node]
        wider = (max(0, a - (got.valid_lo - lo) * step) if got.valid_lo > lo else a,
                 min(full, b + (hi - got.valid_hi) * step) if got.valid_hi < hi else b)
        if wider == (a, b):
            return None
        a, b = wider


def plan_dim(stage: Stage, dim: int, parts: int) -> DimPlan:
    size = stage.split.shape[2 + dim]
    if parts > size:
        what = "rows" if dim == 0 else "columns"
        raise ConfigError(
            f"A grid of {parts} tile {what} is larger than the map at {stage.split.node.name} "
            f"({size} {what}).", f"Give at most {size} tile {what}, or --patches auto.")
    full = stage.input_shape[2 + dim]
    outputs = _cuts(size, parts)
    inputs, spans = [], []
    for lo, hi in outputs:
        need_lo, need_hi = _backward(stage, dim, lo, hi)
        found = _exact_slice(stage, dim, lo, hi, need_lo, need_hi) or \
            _widened_slice(stage, dim, lo, hi, need_lo, need_hi, full)
        if found is None:
            raise AssertionError(f"no input slice computes [{lo}, {hi}) of dimension {dim}")
        inputs.append(found[0])
        spans.append(found[1])
    return DimPlan(tuple(outputs), tuple(inputs), tuple(spans))


@dataclass(frozen=True)
class PatchPlan:
    """A grid of tiles over one stage: what the rewrite builds and what it costs."""

    stage: Stage
    grid: tuple[int, int]
    rows: DimPlan
    cols: DimPlan

    @property
    def macs(self) -> int:
        """The stage's multiply-accumulates over all tiles."""
        total = 0
        for s in self.stage.nodes:
            if not s.macs:
                continue
            per_position = s.macs // math.prod(s.shape[2:])
            if self.carries:
                total += per_position * s.shape[2] * sum(
                    steps[s.node].computed[1] - steps[s.node].computed[0]
                    for steps in self.cols.carry)
                continue
            for rs in self.rows.spans:
                for cs in self.cols.spans:
                    total += per_position * rs[s.node].size * cs[s.node].size
        return total

    @property
    def stage_macs(self) -> int:
        return sum(s.macs for s in self.stage.nodes)

    @property
    def carries(self) -> bool:
        """Whether the tiles carry their overlap instead of recomputing it."""
        return bool(self.cols.carry)

    def describe(self) -> str:
        n, m = self.grid
        return f"{n}x{m} tiles up to {self.stage.split.node.name}"


def plan_patches(stage: Stage, grid: tuple[int, int]) -> PatchPlan:
    """The tiles of `grid` over `stage`. A single row of tiles over a chain carries the
    overlap from tile to tile (`_carried_columns`: the same outputs, without recomputing
    it); otherwise, or where a tile is too narrow for that, each tile recomputes it."""
    cols = None
    if grid[0] == 1 and grid[1] <= stage.split.shape[3] and not _carry_refusal(stage):
        cols = _carried_columns(stage, grid[1])
    return PatchPlan(stage, grid, plan_dim(stage, 0, grid[0]),
                     cols or plan_dim(stage, 1, grid[1]))


# ---- the rewrite ----

def apply_patches(graph_module: Any, plan: PatchPlan) -> None:
    """Replace the stage of `graph_module` by its tiles (module docstring), in place.

    The input and the tiles are cut and joined in the layout the stage computes in
    (channels-last in the cortex_m flow, whose input is given channels-last):
    deploykit's slice and cat kernels copy in memory order
    (firmware/kernels/op_memory_order_copy.cpp), so no tile needs a layout copy."""
    import torch

    aten = torch.ops.aten

    graph = graph_module.graph
    stage = plan.stage
    split = stage.split.node
    fake = _fake_mode(split)
    anchor = next(n for n in graph.nodes if n in split.users) if split.users else None
    height, width = stage.input_shape[2:]
    strips = []
    with graph.inserting_before(anchor):
        if plan.carries:
            tiles = _carried_tiles(graph, plan, fake)
            strips.append(_part(graph, split, fake, aten.cat.default, tiles, 3))
        for r, (rlo, rhi) in enumerate(() if plan.carries else plan.rows.outputs):
            rows_in = _crop(graph, stage.input, fake, stage.input, 2, *plan.rows.inputs[r],
                            height)
            tiles = []
            for c, (clo, chi) in enumerate(plan.cols.outputs):
                tile_in = _crop(graph, stage.input, fake, rows_in, 3, *plan.cols.inputs[c],
                                width)
                env: dict[Any, Any] = {
                    stage.input: tile_in}
                for s in stage.nodes:
                    env[s.node] = _copy(graph, s, env, fake, plan.rows.spans[r],
                                        plan.cols.spans[c], r * len(plan.cols.outputs) + c)
                span = plan.cols.spans[c][split]
                tiles.append(_crop(graph, split, fake, env[split], 3, clo - span.start,
                                   chi - span.start, span.size))
            strip = tiles[0] if len(tiles) == 1 else \
                _part(graph, split, fake, aten.cat.default, tiles, 3)
            span = plan.rows.spans[r][split]
            strips.append(_crop(graph, split, fake, strip, 2, rlo - span.start, rhi - span.start,
                                span.size))
        whole = strips[0] if len(strips) == 1 else \
            _part(graph, split, fake, aten.cat.default, strips, 2)
    split.replace_all_uses_with(whole)
    for s in reversed(stage.nodes):
        graph.erase_node(s.node)
    graph.eliminate_dead_code()
    graph.lint()
    graph_module.recompile()


def _carried_tiles(graph: Any, plan: PatchPlan, fake: Any) -> list[Any]:
    """The tiles of a row that carry their overlap (`CarryStep`), in order: each tile's new
    columns of the split. A window layer reads the columns kept from the previous tile joined
    to this tile's own; right after that join, the columns the next tile reads again are
    kept (a small slice), so that the join is dead once the layer has run. Columns a layer
    computed from the padding on a side inside the map are cut off where the next window
    layer (or the join of the tiles) reads the tensor, after the per-position operators that
    the int8 lowering fuses into the layer."""
    import torch

    aten = torch.ops.aten
    stage = plan.stage
    x, width = stage.input, stage.input_shape[3]
    kept: dict[Any, Any] = {}  # a stage tensor -> its columns kept from the previous tile
    tiles = []
    for c, steps in enumerate(plan.cols.carry):
        spans = plan.cols.spans[c]
        cols = {n: dataclasses.replace(span, padding=0) for n, span in spans.items()}
        env: dict[Any, Any] = {}
        held: dict[Any, tuple[int, int]] = {}  # the columns of each value of the tile
        for s in stage.nodes:
            source = s.inputs[0]
            step = steps.get(s.node)
            if step is None:  # a per-position operator: the tile's columns of its input
                if source is x:
                    env[x] = _crop(graph, x, fake, x, 3, *plan.cols.inputs[c], width)
                    held[x] = plan.cols.inputs[c]
                env[s.node] = _copy(graph, s, env, fake, plan.rows.spans[0], cols, c)
                held[s.node] = held[source]
                continue
            if source is x:
                value = _crop(graph, x, fake, x, 3, *step.input, width)
            else:
                own = _cut(graph, source, fake, env[source], held[source],
                           (step.input[0] + step.carried, step.input[1]))
                value = own if not step.carried else _part(
                    graph, source, fake, aten.cat.default, [kept.pop(source), own], 3)
            if step.keep:
                size = step.input[1] - step.input[0]
                kept[source] = _crop(graph, source, fake, value, 3, size - step.keep, size,
                                     size)
            cols[s.node] = dataclasses.replace(spans[s.node], padding=step.padding)
            env[s.node] = _copy(graph, s, {**env, source: value}, fake, plan.rows.spans[0],
                                cols, c)
            held[s.node] = step.computed
        split = stage.split.node
        tiles.append(_cut(graph, split, fake, env[split], held[split],
                          (spans[split].start, spans[split].start + spans[split].size)))
    return tiles


def _cut(graph: Any, like: Any, fake: Any, node: Any, holds: tuple[int, int],
         wanted: tuple[int, int]) -> Any:
    """Columns `wanted` of `node`, which holds the columns `holds` (map coordinates)."""
    size = holds[1] - holds[0]
    return _crop(graph, like, fake, node, 3, wanted[0] - holds[0], wanted[1] - holds[0], size)


def _crop(graph: Any, like: Any, fake: Any, node: Any, dim: int, lo: int, hi: int,
          size: int) -> Any:
    """`node`'s [lo, hi) along `dim` (of `size`): a slice (a copy on the device), or `node`
    itself when that is all of it."""
    import torch

    if lo == 0 and hi == size:
        return node
    return _part(graph, like, fake, torch.ops.aten.slice.Tensor, node, dim, lo, hi)


def _part(graph: Any, whole: Any, fake: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
    """A slice, concatenation or layout copy of tiles of `whole` (the input or the split): it
    holds values of `whole`, so it quantizes as `whole` does."""
    node = _call(graph, whole, fake, target, *args, **kwargs)
    node.meta[ORIGIN_KEY] = whole.name
    return node


# Where a window operator takes its padding, and the arguments before it when left out.
_PADDING_ARG = {
    "conv2d.default": (4, "padding", (None, [1, 1])),
    "max_pool2d.default": (3, "padding", ([],)),
    "avg_pool2d.default": (3, "padding", ([],)),
}


def _copy(graph: Any, s: StageNode, env: dict[Any, Any], fake: Any, rows: dict[Any, Span],
          cols: dict[Any, Span], tile: int) -> Any:
    """`s`'s node on the tile: its stage inputs replaced by the tile's, the rest (parameters,
    scalars) the same nodes; a window operator with the tile's padding.

    A convolution's weight and bias are the same values in a parameter of the tile's own
    (after the first tile): PT2E folds a BatchNorm into the convolution's weight attribute
    in place, once per convolution, which on a shared attribute would fold it once per
    tile. The copies fold alike, quantize alike and are stored once (ExecuTorch's emitter
    keeps one buffer per distinct constant)."""
    import torch

    node = s.node
    if tile and _name(node) == "conv2d.default":
        env = {**env, **{a: _own_parameter(graph, a, tile, fake) for a in node.args[1:3]
                         if isinstance(a, torch.fx.Node) and a.op == "get_attr"}}

    def swap(a: Any) -> Any:
        return env.get(a, a) if isinstance(a, torch.fx.Node) else a

    args = list(torch.fx.node.map_aggregate(node.args, swap))
    kwargs = dict(torch.fx.node.map_aggregate(node.kwargs, swap))
    if s.windows is not None:
        index, name, defaults = _PADDING_ARG[_name(node)]
        kwargs.pop(name, None)
        while len(args) < index:
            args.append(defaults[len(args) - 2])
        padding = [rows[node].padding, cols[node].padding]
        args[index:index + 1] = [padding]
    tile_node = _call(graph, node, fake, node.target, *args, **kwargs)
    tile_node.meta[ORIGIN_KEY] = node.name
    return tile_node


def _own_parameter(graph: Any, attr: Any, tile: int, fake: Any) -> Any:
    """A get_attr of a new parameter holding a copy of `attr`'s tensor, for tile `tile`."""
    import torch

    root = graph.owning_module
    name = f"{attr.target.replace('.', '_')}_tile{tile}"
    while hasattr(root, name):
        name += "_"
    root.register_parameter(name, torch.nn.Parameter(_attr(root, attr.target).detach().clone(),
                                                     requires_grad=False))
    with graph.inserting_after(attr):
        node = graph.get_attr(name)
    node.meta.update({k: v for k, v in attr.meta.items() if k != "val"})
    node.meta["val"] = fake.from_tensor(getattr(root, name), static_shapes=True)
    return node


def _fake_mode(node: Any) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([a.meta["val"] for a in node.all_input_nodes if "val" in a.meta])


def _call(graph: Any, like: Any, fake: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
    """A node made like `like` (flows/common.call_like) but for its origin, which each caller
    sets: the node of the whole model a tile's node stands for."""
    return call_like(graph, like, fake, target, *args, keep_out=(ORIGIN_KEY,), **kwargs)


def tag_origins(graph_module: Any) -> None:
    """Name every node's origin in its metadata (the PT2E passes rename nodes, metadata
    stays), so that the observers of the graph with and without tiles can be matched."""
    for node in graph_module.graph.nodes:
        node.meta.setdefault(ORIGIN_KEY, node.name)


def share_observers(prepared: Any, reference: Any) -> int:
    """Give each activation observer of the tiled, prepared graph `prepared` the state of the
    observer of the same edge (by origin, `tag_origins`) in `reference` (the graph without
    tiles, prepared and calibrated): all tiles of a layer then quantize with the layer's
    scale and zero point, observed on the whole map. A weight's observer sees its weight
    (what calibration would do). Returns how many observers were shared.

    An observer is known by its kind, the node it observes (through the observers before it
    on the same edge: PT2E chains one where a user needs other parameters), how many
    observers precede it, and the nodes reading it; the match falls back to fewer of these where a
    tile's edge has no exact counterpart (a slice of the map reads what the map's node
    read)."""
    import torch

    ref: dict[tuple[Any, ...], Any] = {}
    for node in reference.graph.nodes:
        if _is_observer(node):
            module = getattr(reference, node.target)
            for key in _observer_keys(node, lambda origin: True):
                ref.setdefault((type(module).__name__, *key), module)
    shared = 0
    unmatched = []
    states: dict[str, Any] = {}  # observer module name -> the observer whose state it took
    for node in prepared.graph.nodes:
        if not _is_observer(node):
            continue
        if node.args[0].op == "get_attr":
            with torch.no_grad():
                getattr(prepared, node.target)(_attr(prepared, node.args[0].target))
            continue
        kind = type(getattr(prepared, node.target)).__name__
        found = next((ref[(kind, *k)] for k in _observer_keys(node, lambda o: any(
            k[1] == o for k in ref)) if (kind, *k) in ref), None)
        if found is None:
            # A slice, join or layout copy shares its input's quantization parameters: the
            # observer that feeds it has them (already set: the graph is in order).
            feeding = _copied(node.args[0])
            if feeding is not None and _is_observer(feeding) and feeding.target in states:
                found = states[feeding.target]
        if found is None:
            unmatched.append(node.args[0].name)
            continue
        # The state, not the module: a bias's derived quantization spec holds the observer
        # modules it was prepared with.
        observer = getattr(prepared, node.target)
        if type(observer) is type(found):
            observer.load_state_dict(found.state_dict())
        else:
            # A copy observed by another kind than what it copies (where the quantizer gave
            # the copy a default specification): its parameters must still be those of
            # its input, so it computes them as that observer does.
            observer.calculate_qparams = copy.deepcopy(found).calculate_qparams
        states[node.target] = found
        shared += 1
    if unmatched:
        from deploykit.util.errors import ExportError

        raise ExportError(f"Patches: no observer of the model without tiles for "
                          f"{', '.join(unmatched)}.",
                          "Report this, and export with --patches off meanwhile.")
    return shared


def _observer_keys(observer: Any, known: Callable[[str | None], bool]) -> list[tuple[Any, ...]]:
    """The keys of an observer, the most specific first: (origin, depth, readers' origins),
    (origin, depth), (origin,). A slice, join or layout copy quantizes as what it copies,
    which may be a node the PT2E passes folded away (a BatchNorm): its origin is then looked
    for through its input (`known`: whether an origin has observers to match)."""
    observed, depth = observer.args[0], 1
    while _is_observer(observed):
        observed, depth = observed.args[0], depth + 1
    origin = _origin(observed)
    while not known(origin) and _is_copy(observed):
        observed = _copied(observed)
        while _is_observer(observed):
            observed = observed.args[0]
        origin = _origin(observed)
    readers = frozenset(_origin(u) for u in observer.users)
    return [(origin, depth, readers), (origin, depth), (origin,)]


def _copied(node: Any) -> Any:
    """What a slice, join or layout copy `node` reads (a join: its first part), else None."""
    if not _is_copy(node):
        return None
    return node.args[0][0] if _name(node) == "cat.default" else node.args[0]


def _is_copy(node: Any) -> bool:
    return node.op == "call_function" and _name(node) in ("slice.Tensor", "cat.default",
                                                          "clone.default")


def _is_observer(node: Any) -> bool:
    return node.op == "call_module" and "activation_post_process" in str(node.target)


def _attr(root: Any, target: str) -> Any:
    for part in target.split("."):
        root = getattr(root, part)
    return root


def _origin(node: Any) -> str | None:
    return node.meta.get(ORIGIN_KEY)




# ---- the activation memory of a plan, before any export ----

def _nbytes(shape: Iterable[int], element: int) -> int:
    return math.prod(shape) * element


def _last_users(nodes: list[Any]) -> dict[Any, int]:
    """Each node -> the index (in `nodes`) of its last user among them."""
    position = {n: i for i, n in enumerate(nodes)}
    last: dict[Any, int] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            if a in position:
                last[a] = max(last.get(a, -1), position[n])
    return last


class _Live:
    """A running sum of live tensors and its peak (a tensor is live from the step that makes
    it through the last step that reads it, as ExecuTorch's planner sees lifetimes)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def make(self, size: int) -> None:
        self.now += size
        self.peak = max(self.peak, self.now)

    def free(self, size: int) -> None:
        self.now -= size


def estimate_peak(graph_module: Any, element: Callable[[Any], int],
                  plan: PatchPlan | None = None,
                  fused: Callable[[Any], bool] = lambda n: False,
                  ) -> int:
    """The most activation bytes live at once when the graph runs layer by layer (`plan`:
    with its stage run in tiles). `element(node)`: bytes per value of a node's output (for
    the input: what the program keeps of it, its planned copy and its int8 copy; 0 for an
    input read in place and used as it is); the slices of the input are copies of the values
    the first layer reads, of the size of `element` of the first stage node. `fused(node)`:
    the node's value takes its input's place (an int8 convolution's BatchNorm and ReLU)."""
    nodes = [n for n in graph_module.graph.nodes if n.op in ("placeholder", "call_function")]
    last = _last_users(nodes)
    live = _Live()
    sizes: dict[Any, int] = {}
    stage_nodes = {s.node for s in plan.stage.nodes} if plan is not None else set()

    def size_of(n: Any) -> int:
        val = n.meta.get("val")
        return _nbytes(val.shape, element(n)) if hasattr(val, "shape") else 0

    for i, n in enumerate(nodes):
        if n in stage_nodes and n is not plan.stage.input:
            if n is plan.stage.split.node:
                sizes[n] = _tiled_stage(plan, element, live, size_of(n), fused)
                live.free(sizes[plan.stage.input])  # its last reader was a slice of a tile
            continue
        sizes[n] = size_of(n)
        if fused(n):  # the value replaces its input's
            sizes[n], sizes[n.args[0]] = sizes[n.args[0]], 0
        else:
            live.make(sizes[n])
        for a in {*n.all_input_nodes, n}:
            if last.get(a, i) <= i:
                live.free(sizes.get(a, 0))
    return live.peak


def _tiled_stage(plan: PatchPlan, element: Callable[[Any], int], live: _Live,
                 whole: int, fused: Callable[[Any], bool]) -> int:
    """Walk the tiled stage through `live`; leaves the split's whole output live."""
    if plan.carries:
        return _carried_stage(plan, element, live, whole, fused)
    stage = plan.stage
    order = [stage.input, *(s.node for s in stage.nodes)]
    last = _last_users(order)
    channels = {n: int(n.meta["val"].shape[1]) for n in order}

    value = element(stage.nodes[0].node)  # a slice of the input holds what the stage reads

    def tile_bytes(n: Any, rows: int, cols: int) -> int:
        return channels[n] * rows * cols * (value if n is stage.input else element(n))

    height, width = stage.input_shape[2:]
    strips = []
    for r, (rlo, rhi) in enumerate(plan.rows.outputs):
        a, b = plan.rows.inputs[r]
        # The row of tiles' slice of the input (none for all rows): with several columns the
        # tiles cut theirs from it, and it lives until the last one has; a single column's
        # tile reads it as it is, until its first layer has.
        rows_in = 0 if (a, b) == (0, height) else tile_bytes(stage.input, b - a, width)
        shared = len(plan.cols.outputs) > 1
        if shared:
            live.make(rows_in)
        tiles = []
        for c, (clo, chi) in enumerate(plan.cols.outputs):
            rs, cs = plan.rows.spans[r], plan.cols.spans[c]
            reads_row = plan.cols.inputs[c] == (0, width)  # no cut of columns
            held: dict[Any, int] = {}
            for i, n in enumerate(order):
                if n is stage.input:
                    held[n] = (0 if shared else rows_in) if reads_row else \
                        tile_bytes(n, rs[n].size, cs[n].size)
                else:
                    held[n] = tile_bytes(n, rs[n].size, cs[n].size)
                if n is not stage.input and fused(n):
                    held[n], held[n.args[0]] = held[n.args[0]], 0
                else:
                    live.make(held[n])
                if n is stage.input and shared and c == len(plan.cols.outputs) - 1:
                    live.free(rows_in)  # the last tile's cut was its last reader
                for p in [*(s for s in order if s in n.all_input_nodes)]:
                    if last.get(p, i) <= i:
                        live.free(held[p])
            split = stage.split.node
            if (clo, chi) != (cs[split].start, cs[split].start + cs[split].size):
                crop = tile_bytes(split, rs[split].size, chi - clo)
                live.make(crop)
                live.free(held[split])
                held[split] = crop
            tiles.append(held[split])
        strip = sum(tiles)
        if len(tiles) > 1:
            live.make(strip)
            live.free(sum(tiles))
        rs = plan.rows.spans[r][stage.split.node]
        if (rlo, rhi) != (rs.start, rs.start + rs.size):
            cropped = strip * (rhi - rlo) // rs.size
            live.make(cropped)
            live.free(strip)
            strip = cropped
        strips.append(strip)
    if len(strips) > 1:
        live.make(whole)
        live.free(sum(strips))
    return whole


def _carried_stage(plan: PatchPlan, element: Callable[[Any], int], live: _Live,
                   whole: int, fused: Callable[[Any], bool]) -> int:
    """`_tiled_stage` for tiles that carry their overlap, in the order `_carried_tiles`
    builds them: the columns kept for the next tile are live from the join they are cut
    from until the next tile's join."""
    stage = plan.stage
    x, split = stage.input, stage.split.node
    value = element(stage.nodes[0].node)  # a slice of the input holds what the stage reads

    def nbytes(n: Any, cols: int) -> int:
        _, channels, height, _ = n.meta["val"].shape
        return int(channels) * int(height) * cols * (value if n is x else element(n))

    def cut(n: Any, size: int, held_cols: tuple[int, int], wanted: int) -> int:
        """Bytes of a cut of `wanted` columns of `n`'s value (`size` bytes), if it is one."""
        if wanted == held_cols[1] - held_cols[0]:
            return size
        part = nbytes(n, wanted)
        live.make(part)
        live.free(size)
        return part

    kept: dict[Any, int] = {}
    tiles = []
    for c, steps in enumerate(plan.cols.carry):
        spans = plan.cols.spans[c]
        held: dict[Any, int] = {}
        cols: dict[Any, tuple[int, int]] = {}
        for s in stage.nodes:
            source, step = s.inputs[0], steps.get(s.node)
            if step is None:
                if source is x:
                    held[x] = nbytes(x, spans[x].size)
                    cols[x] = plan.cols.inputs[c]
                    live.make(held[x])
                cols[s.node] = cols[source]
                if fused(s.node):  # the value replaces its input's
                    held[s.node], held[source] = held[source], 0
                    continue
                held[s.node] = nbytes(s.node, cols[s.node][1] - cols[s.node][0])
                live.make(held[s.node])
                live.free(held[source])
                continue
            size = step.input[1] - step.input[0]
            if source is x:
                layer_in = nbytes(x, size)
                live.make(layer_in)
            else:
                layer_in = cut(source, held[source], cols[source], size - step.carried)
                if step.carried:
                    joined = nbytes(source, size)
                    live.make(joined)
                    live.free(layer_in + kept.pop(source))
                    layer_in = joined
            if step.keep:
                kept[source] = nbytes(source, step.keep)
                live.make(kept[source])
            cols[s.node] = step.computed
            held[s.node] = nbytes(s.node, step.computed[1] - step.computed[0])
            live.make(held[s.node])
            live.free(layer_in)
        tiles.append(cut(split, held[split], cols[split], spans[split].size))
    live.make(whole)
    live.free(sum(tiles))
    return whole


def model_macs(graph_module: Any) -> int:
    """The multiply-accumulates of the graph's convolutions and linear layers."""
    total = 0
    for n in graph_module.graph.nodes:
        if n.op != "call_function" or "val" not in n.meta:
            continue
        name = _name(n)
        if name.startswith("conv2d"):
            total += _macs(n, tuple(n.meta["val"].shape)) if name == "conv2d.default" else 0
        elif name == "linear.default":
            total += math.prod(n.meta["val"].shape) * int(n.args[1].meta["val"].shape[-1])
    return total


@dataclass
class Tiler:
    """The `--patches` setting of one export: picks the plan, rewrites the float graph and
    keeps what it did for the report (`report`)."""

    setting: str
    quantized: bool  # int8 activations (1 byte a value) or float (4)
    plan_inputs: bool  # the input is copied into the planned buffers
    int8_inputs: bool  # the program takes the input as int8
    mac_budget: float = DEFAULT_MAC_BUDGET
    report: dict[str, Any] = field(default_factory=dict)

    def element(self, node: Any) -> int:
        if node.op != "placeholder":
            return 1 if self.quantized else 4
        planned = (1 if self.int8_inputs else 4) if self.plan_inputs else 0
        # A float input of an int8 program is quantized into a planned int8 copy first.
        return planned + (1 if self.quantized and not self.int8_inputs else 0)

    def fused(self, node: Any) -> bool:
        return self.quantized and _fuses(node)

    def choose(self, graph_module: Any) -> PatchPlan | None:
        choice = parse_patches(self.setting)
        stages = find_stages(graph_module)
        base = estimate_peak(graph_module, self.element, fused=self.fused)
        macs = model_macs(graph_module)
        self.report = {"setting": self.setting, "estimated_peak_without": base,
                       "model_macs": macs}
        if not stages.splits:
            why = stages.stop or "the model has no convolution stage at its input"
            if choice == AUTO:
                self.report["reason"] = f"left unpatched: {why}"
                return None
            raise ConfigError(f"--patches {self.setting}: the model's first layers cannot be "
                              f"tiled: {why}.", "Leave the model unpatched (--patches off).")
        best: tuple[int, int, int, PatchPlan] | None = None
        for index in stages.splits:
            stage = stages.stage(index)
            shape = stage.split.shape
            grids = [choice] if choice != AUTO else [
                (n, m) for n in range(1, MAX_AUTO_GRID + 1) for m in range(1, MAX_AUTO_GRID + 1)
                if (n, m) != (1, 1) and n <= shape[2] and m <= shape[3]]
            for grid in grids:
                if choice != AUTO and (grid[0] > shape[2] or grid[1] > shape[3]):
                    continue
                plan = plan_patches(stage, grid)
                extra = plan.macs - plan.stage_macs
                if choice == AUTO and extra > self.mac_budget * macs:
                    continue
                peak = estimate_peak(graph_module, self.element, plan, self.fused)
                method = self.method_growth(plan)
                if choice == AUTO and peak + method >= base:
                    continue  # the method pool would take back what the tiles save
                # The least activations; on a tie, the fewest instructions, then MACs.
                if best is None or (peak, method, extra) < (best[0], best[2], best[1]):
                    best = (peak, extra, method, plan)
        if best is None:
            if choice == AUTO:
                self.report["reason"] = (
                    f"left unpatched: tiles do not lower the peak ({base:,} B) by more than "
                    f"their instructions add to the method pool, within {self.mac_budget:.0%} "
                    "more MACs")
                return None
            stage = stages.stage(stages.splits[0])
            plan_patches(stage, choice)  # raises: the grid is larger than every map
        assert best is not None
        peak, extra, method, plan = best
        if choice == AUTO and peak >= base:
            self.report["reason"] = (f"left unpatched: tiles do not lower the peak "
                                     f"({base:,} B without, {peak:,} B at best)")
            return None
        self.report.update({
            "grid": f"{plan.grid[0]}x{plan.grid[1]}", "split": plan.stage.split.node.name,
            "estimated_peak": peak, "estimated_method_pool_growth": method,
            "overlap": "carried" if plan.carries else
            f"recomputed: {_recomputed_why(plan)}",
            "stage_macs": plan.stage_macs, "tiled_stage_macs": plan.macs,
            "mac_overhead": round(extra / macs, 4) if macs else 0.0})
        return plan

    def method_growth(self, plan: PatchPlan) -> int:
        """The method pool the tiles' instructions add: every tile repeats the stage's
        layers (METHOD_BYTES_PER_INSTRUCTION each), and its slices and cut, and the joins of
        the tiles and rows (METHOD_BYTES_PER_COPY each); tiles that carry their overlap
        slice and join the kept columns instead (`_carry_copies`)."""
        stage = plan.stage
        layers = sum(1 for s in stage.nodes if not self.fused(s.node))
        rows, cols = plan.grid
        if plan.carries:
            copies = _carry_copies(plan) + 1
        else:
            copies = rows * cols * ((rows > 1) + (cols > 1) + 1) + \
                rows * (cols > 1) + rows + (rows > 1)
        return (rows * cols - 1) * layers * METHOD_BYTES_PER_INSTRUCTION + \
            copies * METHOD_BYTES_PER_COPY

    def rewrite(self, graph_module: Any) -> bool:
        plan = self.choose(graph_module)
        if plan is None:
            return False
        apply_patches(graph_module, plan)
        return True


def _recomputed_why(plan: PatchPlan) -> str:
    """Why the tiles of `plan` recompute their overlap instead of carrying it."""
    if plan.grid[0] > 1:
        return "several rows of tiles"
    return _carry_refusal(plan.stage) or "a tile is narrower than the layers' reach"


def _carry_copies(plan: PatchPlan) -> int:
    """The slices and joins of tiles that carry their overlap (`_carried_tiles`)."""
    x, split, width = plan.stage.input, plan.stage.split.node, plan.stage.input_shape[3]
    copies = 0
    for c, steps in enumerate(plan.cols.carry):
        spans = plan.cols.spans[c]
        held: dict[Any, tuple[int, int]] = {x: plan.cols.inputs[c]}
        for s in plan.stage.nodes:
            source, step = s.inputs[0], steps.get(s.node)
            if step is None:
                copies += source is x and plan.cols.inputs[c] != (0, width)
                held[s.node] = held[source]
                continue
            if source is x:
                copies += step.input != (0, width)
            else:
                copies += held[source] != (step.input[0] + step.carried, step.input[1])
                copies += bool(step.carried)
            copies += bool(step.keep)
            held[s.node] = step.computed
        copies += held[split] != (spans[split].start, spans[split].start + spans[split].size)
    return copies


def describe(report: dict[str, Any], planned: int | None = None,
             bound: int | None = None) -> list[str]:
    """Lines for the export, inspect and plan reports, from export.json's `patches` entry;
    `planned`, `bound`: the program's planned activation bytes and its lower bound."""
    if not report:
        return []
    if "grid" not in report:
        return [f"patches {report.get('setting')}: {report.get('reason', 'left unpatched')}"]
    lines = [f"patches: {report['grid']} tiles up to {report['split']}, "
             f"{report['stage_macs']:,} -> {report['tiled_stage_macs']:,} MACs in the stage "
             f"(+{report['mac_overhead']:.1%} of the model's {report['model_macs']:,})"]
    if report.get("overlap") == "carried":
        lines[0] += ("; the tiles carry their overlap (each keeps the columns the next tile's "
                     "layers read again, instead of recomputing them)")
    elif "overlap" in report:
        lines[0] += f"; the tiles recompute their overlap ({report['overlap']})"
    without = report["estimated_peak_without"]
    now = f"planned {planned:,} B" if planned is not None else \
        f"estimated {report['estimated_peak']:,} B"
    lines.append(f"patches: activations {now} with patches (lower bound "
                 f"{bound if bound is not None else report['estimated_peak']:,} B); without "
                 f"patches the layer-by-layer lower bound is {without:,} B"
                 + (f" ({planned / without:.2f}x)" if planned is not None and without else ""))
    return lines


def share_constants(ep: Any) -> int:
    """Make the tiles' copies of a constant (a convolution's weight, bias, requantization
    multipliers and shifts: the same values for every tile) one placeholder of the lowered
    program `ep`, in place: the emitter stores equal data once anyway, but each placeholder is
    a tensor of its own in the method's values, which the method allocator pays for. Returns
    how many placeholders were merged."""
    import hashlib

    import torch
    from executorch.backends.transforms.utils import (
        delete_constant_placeholder,
        get_param_tensor,
        is_param_node,
    )

    first: dict[tuple[Any, ...], Any] = {}
    merged = 0
    for node in list(ep.graph.nodes):
        if node.op != "placeholder" or not is_param_node(ep, node):
            continue
        tensor = get_param_tensor(ep, node)
        if tensor is None:
            continue
        data = tensor.detach().contiguous().cpu()
        key = (str(data.dtype), tuple(data.shape), tuple(data.stride()),
               hashlib.sha256(data.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
               if data.numel() else "")
        kept = first.setdefault(key, node)
        if kept is node:
            continue
        node.replace_all_uses_with(kept)
        delete_constant_placeholder(ep, node)
        merged += 1
    if merged:
        ep.graph.lint()
        ep.graph_module.recompile()
    return merged

