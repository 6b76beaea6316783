"""At export, the argument checks CMSIS-NN applies at run time, so that a program the kernels
would refuse never reaches the device (issue #32: ``arm_convolve_wrapper_s8`` returned
``ARM_CMSIS_NN_FAILURE`` on the M55 and ``execute()`` failed).

For each CMSIS-NN-backed operator of the lowered graph the conditions of its CMSIS-NN wrapper
(CMSIS-NN as ExecuTorch v1.4.1 pins it) are evaluated on the node's shapes and arguments, for
the board CPU's CMSIS-NN path (MVE, DSP or scalar): which kernel the wrapper picks, and the
refusals of that kernel (``ARM_CMSIS_NN_ARG_ERROR``, ``ARM_CMSIS_NN_FAILURE``), plus the
scratch buffer the program gives it against what the kernel's ``get_buffer_size`` asks
(ExecuTorch's runtime compares them only in a build with ``CORTEX_M_ENABLE_RUNTIME_CHECKS``).
A refusal is a lowering failure of the cortex_m flow: mixed precision keeps that layer in
float and says why, ``--strict`` refuses the export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refusal:
    node: Any  # the cortex_m node
    op: str  # the operator of the annotation graph to keep in float ("conv2d")
    message: str


def refusals(ep: Any, backend: Any) -> list[Refusal]:
    """Every CMSIS-NN-backed node of `ep` (a lowered cortex_m program, before
    to_executorch) that its kernel would refuse on `backend` (a ``cmsis_nn.Backend``)."""
    from executorch.backends.cortex_m.library import cmsis_nn

    mve = backend == cmsis_nn.Backend.MVE
    found = []
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = str(node.target)
        why = ""
        if "cortex_m.quantized_conv2d" in name:
            why = _conv2d(node, mve) or _scratch(node, backend, "conv")
        elif "cortex_m.quantized_depthwise_conv2d" in name:
            why = _depthwise(node) or _scratch(node, backend, "depthwise")
        if why:
            found.append(Refusal(node, "conv2d", why))
    return found


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _conv2d(node: Any, mve: bool) -> str:
    """arm_convolve_wrapper_s8 (arm_convolve_wrapper_s8.c) and the kernels it picks."""
    x, weight, _, stride, padding, dilation = node.args[:6]
    _, c_in, h_in, w_in = _shape(x)
    c_out, k_h, k_w, k_c = _shape(weight)  # OHWI after the cortex_m passes
    _, _, _, w_out = _shape(node)
    if c_in % k_c or c_out % (c_in // k_c):
        return (
            f"arm_convolve_s8 returns ARM_CMSIS_NN_ARG_ERROR: {c_in} input and {c_out} "
            f"output channels are not whole groups of {k_c}"
        )
    one_by_one = padding == [0, 0] and (k_h, k_w) == (1, 1) and dilation == [1, 1] and c_in == k_c
    if one_by_one:
        return ""
    # arm_nn_is_convolve_1_x_n (arm_nnsupportfunctions.h)
    one_by_n = (
        h_in == 1 and dilation[1] == 1 and k_h == 1 and (stride[1] * c_in) % 4 == 0 and c_in == k_c
    )
    if one_by_n and mve:
        # arm_convolve_1_x_n_s8.c, MVE: the right padding is what the output leaves over.
        total = (w_out - 1) * stride[1] + k_w - w_in
        if padding[1] * 2 + total % 2 != total:
            return (
                f"arm_convolve_1_x_n_s8 (MVE) returns ARM_CMSIS_NN_FAILURE: padding "
                f"{padding[1]} each side, but the {w_out} outputs of stride {stride[1]} "
                f"over {w_in} inputs use {total} padded columns in all"
            )
    return ""


def _depthwise(node: Any) -> str:
    """arm_depthwise_conv_wrapper_s8 (arm_depthwise_conv_wrapper_s8.c)."""
    x, _, _, _, _, _, multiplier = node.args[:7]
    _, c_in, _, _ = _shape(x)
    c_out = _shape(node)[1]
    if c_in * multiplier != c_out:
        return (
            f"arm_depthwise_conv_s8 returns ARM_CMSIS_NN_ARG_ERROR: {c_in} input "
            f"channels x multiplier {multiplier} is not {c_out} output channels"
        )
    return ""


def _scratch(node: Any, backend: Any, kind: str) -> str:
    """The scratch tensor (the last argument) against the kernel's get_buffer_size."""
    from executorch.backends.cortex_m.passes import scratch_buffer_sizes as sizes

    scratch = node.args[-1]
    have = _scratch_bytes(scratch)
    if have is None:
        return ""
    size_of = (
        sizes.cmsis_nn_conv_buffer_size
        if kind == "conv"
        else sizes.cmsis_nn_depthwise_conv_buffer_size
    )
    need = size_of(backend, node)[0]
    if need > 0 and have < need:
        return f"the scratch buffer is {have} B, the kernel's get_buffer_size asks {need} B"
    return ""


def _scratch_bytes(scratch: Any) -> int | None:
    """The bytes of a scratch argument: an ``exir.memory.alloc`` of ((size,), dtype), as the
    cortex_m passes make it, or a node with a value."""
    import math

    import torch

    target = getattr(scratch, "target", None)
    if getattr(target, "__name__", "") == "alloc" and scratch.args:
        shape, dtype = scratch.args[0]
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    val = getattr(scratch, "meta", {}).get("val")
    return None if val is None else val.numel() * val.element_size()
