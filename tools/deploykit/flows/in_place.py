"""In-place int8 layers for Cortex-M firmware: a layer whose input dies there writes its output
over that input, so the two never occupy memory at once.

Layer-by-layer execution keeps a layer's input and output alive together; on the MLPerf Tiny
CNNs that pair (plus a residual branch) is the peak of the activation memory, and TensorFlow
Lite Micro's arena pays it too. Written over the input, the peak drops by one feature map:

- **Elementwise** (``quantized_add``, ``quantized_mul``, ``quantized_activation``): CMSIS-NN's
  ``arm_elementwise_*_s8`` and the table lookup read each element (or vector of them) before
  they write the same position, so the output may simply be the input.
- **Convolutions and depthwise convolutions** of stride 1 whose output has the input's shape
  (the 3x3 depthwise and 1x1 pointwise layers of DS-CNN, the second convolution of a ResNet
  block): an output row needs input rows above it, so it cannot be written where it belongs at
  once. The firmware (firmware/kernels/cmsis_nn_in_place.c) runs the CMSIS-NN kernel on bands
  of output rows into a small ring of rows after the kernel's own scratch, and copies a row
  into place once no later row reads the input under it. The ring is ``(band + top padding)``
  rows, the band at least the top padding; the scratch buffer grows by that much, and the
  firmware finds the band from the scratch's size, so this module alone decides it.

Elementwise layers go in place wherever they can; a convolution only where that lowers the
peak of the activations (its bands cost instructions: :func:`write_in_place`). It runs inside
memory planning (flows/memory_planning.py), on the out-variant graph: the output takes the
input's tensor spec (one tensor, one place, the union of the two lifetimes),
which every planning algorithm and the emitter handle as one value. Only for programs that run
on deploykit's firmware, whose checked CMSIS-NN calls take the in-place path when output and
input are the same memory; the host reference (the lowered graph) is not affected, so the
device's comparison with it checks the in-place kernels on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Output pixels per band at least: CMSIS-NN's kernels work on 4 (MVE) or 2 (DSP) pixels at a
# time along a map; bands of a few rows keep the short rows of small maps (DS-CNN's 25x5) from
# running their leftover pixel paths on every row.
BAND_PIXELS = 16
# What a band costs besides its rows' work, at most this share of the layer's instructions.
# Each band is a call of the CMSIS-NN wrapper: about 600 instructions of set-up and row copies,
# and, without MVE, arm_nn_mat_mult_nt_t_s8 sums the whole filter again (about 3.3
# instructions per filter byte). Measured on qemu-an547 and qemu-an505 (DS-CNN, ResNet8);
# instructions per MAC of the layers themselves from the same profiles.
BAND_OVERHEAD_SHARE = 0.02
_CALL_INSTRUCTIONS = 600
_FILTER_SUM_INSTRUCTIONS_PER_BYTE = 3.3
_INSTRUCTIONS_PER_MAC = {("conv", True): 0.4, ("conv", False): 2.0,
                         ("depthwise", True): 2.3, ("depthwise", False): 8.0}

_CONVS = {"cortex_m::quantized_conv2d.out": "conv",
          "cortex_m::quantized_depthwise_conv2d.out": "depthwise"}
_ELEMENTWISE = {"cortex_m::quantized_add.out": (0, 4), "cortex_m::quantized_mul.out": (0, 2),
                "cortex_m::quantized_activation.out": (0,)}
_CHANNELS_LAST = (0, 2, 3, 1)


@dataclass(frozen=True)
class InPlace:
    node: str  # the layer's node name
    op: str  # "cortex_m::quantized_conv2d.out"
    saved: int  # bytes of output no longer planned beside the input
    ring: int  # bytes added to the kernel's scratch (convolutions)
    scratch: int  # the layer's whole scratch: the kernel's own and the ring (convolutions)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "saved": self.saved, "ring": self.ring,
                "scratch": self.scratch}


def _op_name(node: Any) -> str | None:
    name = getattr(node.target, "name", None)
    return name() if node.op == "call_function" and callable(name) else None


def _dies_here(value: Any, node: Any) -> bool:
    """Whether `value` is a kernel's planned result whose only reader is `node`: not a graph
    input or output, not a view of another tensor's memory, not read after `node`."""
    from executorch.exir.tensor import TensorSpec

    spec = getattr(value, "meta", {}).get("spec")
    return (getattr(value, "op", None) == "call_function" and "out" in value.kwargs
            and isinstance(spec, TensorSpec) and not spec.const
            and set(value.users) == {node})


def _same_tensor(a: Any, b: Any) -> bool:
    return (tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
            and tuple(a.dim_order) == tuple(b.dim_order))


def _conv_ring(node: Any, kind: str, backend: Any) -> tuple[int, int] | None:
    """(the kernel's scratch for the whole layer, the ring's bytes) for running `node` in
    place in bands, or None where it cannot: a stride other than 1 down the rows, a layout
    other than channels-last, a band whose kernel would ask for more scratch than the layer."""
    from executorch.backends.cortex_m.library import cmsis_nn

    x = node.args[0]
    if tuple(x.meta["spec"].dim_order) != _CHANNELS_LAST:
        return None
    stride, padding, dilation = node.args[3], node.args[4], node.args[5]
    if stride[0] != 1:
        return None
    n, c, h, w = (int(d) for d in x.meta["val"].shape)
    kernel = [int(d) for d in node.args[1].meta["val"].shape]
    if kind == "conv":  # OHWI
        k_h, filter_nhwc = kernel[1], kernel
        offsets, act = node.args[6:8], node.args[10:12]

        def need(rows_in: int, rows_out: int, pad_top: int) -> int:
            return int(cmsis_nn.convolve_wrapper_buffer_size(
                backend, cmsis_nn.DataType.A8W8, input_nhwc=[n, rows_in, w, c],
                filter_nhwc=filter_nhwc, output_nhwc=[n, rows_out, w, c],
                padding_hw=[pad_top, padding[1]], stride_hw=list(stride),
                dilation_hw=list(dilation), input_offset=offsets[0], output_offset=offsets[1],
                activation_min=act[0], activation_max=act[1]))
    else:  # IHWO
        k_h, filter_nhwc = kernel[1], [kernel[3], kernel[1], kernel[2], 1]
        multiplier, offsets, act = node.args[6], node.args[7:9], node.args[11:13]
        if multiplier != 1:
            return None

        def need(rows_in: int, rows_out: int, pad_top: int) -> int:
            return int(cmsis_nn.depthwise_conv_wrapper_buffer_size(
                backend, cmsis_nn.DataType.A8W8, input_nhwc=[n, rows_in, w, c],
                filter_nhwc=filter_nhwc, output_nhwc=[n, rows_out, w, c],
                padding_hw=[pad_top, padding[1]], stride_hw=list(stride),
                dilation_hw=list(dilation), ch_mult=1, input_offset=offsets[0],
                output_offset=offsets[1], activation_min=act[0], activation_max=act[1]))

    whole = need(h, h, padding[0])
    band = _band_for(_band_rows(kind, backend == cmsis_nn.Backend.MVE, h, w, c, kernel),
                     padding[0], h)
    reach = (k_h - 1) * dilation[0]
    for first_row in range(0, h, band):  # the bands the firmware will run
        rows = min(band, h - first_row)
        top = first_row - padding[0]
        rows_in = min(h - 1, top + rows - 1 + reach) - max(0, top) + 1
        if need(rows_in, rows, max(0, -top)) > whole:
            return None
    return whole, (band + padding[0]) * w * c


def _band_rows(kind: str, mve: bool, h: int, w: int, c: int, kernel: list[int]) -> int:
    """The rows of a band: at least BAND_PIXELS pixels, and few enough bands that their
    overhead stays within BAND_OVERHEAD_SHARE of the layer (the smallest ring that does)."""
    filter_bytes = math.prod(kernel)
    macs = h * w * (filter_bytes if kind == "conv" else c * kernel[1] * kernel[2])
    per_band = _CALL_INSTRUCTIONS + (
        0 if mve or kind != "conv" else _FILTER_SUM_INSTRUCTIONS_PER_BYTE * filter_bytes)
    layer = macs * _INSTRUCTIONS_PER_MAC[kind, mve]
    bands = max(1, 1 + int(BAND_OVERHEAD_SHARE * layer / per_band))
    return min(h, max(math.ceil(BAND_PIXELS / w), math.ceil(h / bands)))


def _band_for(rows: int, pad_top: int, h: int) -> int:
    """At least the top padding: a band's last pad_top rows wait for the next band, and the
    firmware keeps no more than one band's worth waiting."""
    return min(h, max(rows, pad_top))


def _grow_scratch(scratch: Any, size: int) -> None:
    """Make the `exir.memory.alloc` scratch node `scratch` `size` bytes."""
    from executorch.exir.tensor import TensorSpec

    dtype = scratch.args[0][1]
    scratch.args = (((size,), dtype),)
    scratch.meta["val"] = scratch.meta["val"].new_empty((size,))
    scratch.meta["spec"] = TensorSpec.from_tensor(scratch.meta["val"])


def _live_bytes(graph_module: Any, graph_signature: Any) -> list[int]:
    """The planned bytes alive at each node of `graph_module` (layer by layer, each tensor from
    the node that writes it to the last that reads it; constants are not planned)."""
    from executorch.exir.memory_planning import update_all_tensors_lifetime

    live = [0] * len(graph_module.graph.nodes)
    for spec in update_all_tensors_lifetime(graph_module, graph_signature):
        if spec.const or spec.lifetime[0] is None:
            continue
        size = -(-spec.nbytes() // 16) * 16  # the planner's 16-byte alignment
        for step in range(spec.lifetime[0], spec.lifetime[1] + 1):
            live[step] += size
    return live


@dataclass(frozen=True)
class _Candidate:
    node: Any
    input: Any  # the argument whose place the output takes
    op: str
    step: int  # the node's position: where its input and output are both alive
    saved: int
    sizes: tuple[int, int] | None  # a convolution's (kernel scratch, ring); None: elementwise


def _candidates(graph_module: Any, backend: Any) -> list[_Candidate]:
    found = []
    for step, node in enumerate(graph_module.graph.nodes):
        name = _op_name(node)
        kind = _CONVS.get(name) if name else None
        slots = (0,) if kind else _ELEMENTWISE.get(name, ()) if name else ()
        out_spec = node.meta.get("spec")
        for slot in slots:
            x = node.args[slot]
            if not _dies_here(x, node) or not _same_tensor(x.meta["spec"], out_spec):
                continue
            sizes = _conv_ring(node, kind, backend) if kind else None
            if kind and sizes is None:
                break
            found.append(_Candidate(node, x, name, step, out_spec.nbytes(), sizes))
            break
    return found


def write_in_place(graph_module: Any, backend: Any, graph_signature: Any = None) -> list[InPlace]:
    """Give layers of `graph_module` (out-variant, before memory planning) their input's tensor
    spec, growing a convolution's scratch by its ring; `backend` is the board CPU's
    ``cmsis_nn.Backend``. Returns what was made in place, in graph order.

    Elementwise layers go in place wherever they can: it costs nothing. A convolution's bands
    cost instructions, so it goes in place only where it lowers the peak of the activations:
    where, with every layer in place that can be, the bytes alive at it would otherwise be
    above the highest that remains. A layer in place changes the bytes alive at its own
    position only (the input ends there and the output starts there), so the choices are
    independent."""
    found = _candidates(graph_module, backend)
    live = _live_bytes(graph_module, graph_signature)
    lowered = list(live)
    for c in found:
        ring = c.sizes[1] if c.sizes else 0
        lowered[c.step] = live[c.step] - c.saved + ring
    peak = max(lowered, default=0)
    made = []
    for c in found:
        if c.sizes is not None and live[c.step] <= peak:
            continue  # not at the peak: its bands would cost instructions for nothing
        whole, ring = c.sizes if c.sizes else (0, 0)
        if c.sizes:
            _grow_scratch(c.node.args[-1], whole + ring)
        c.node.meta["spec"] = c.input.meta["spec"]
        made.append(InPlace(c.node.name, c.op, c.saved, ring, whole + ring))
    return made
