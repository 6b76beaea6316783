"""A convolution over one input channel runs as a plain CMSIS-NN convolution.

PyTorch's ``Conv2d(1, C, k)`` has ``groups == in_channels == 1``, so the cortex_m backend's
``AtenToCortexMPass`` lowers it as a depthwise convolution with a channel multiplier of C
(``cortex_m::quantized_depthwise_conv2d``). CMSIS-NN's depthwise kernels are built for a
multiplier of 1:

- on a core without MVE (the Cortex-M33), a multiplier of C goes to the generic depthwise
  loop, several times slower per MAC than ``arm_convolve_s8``;
- with MVE, ``arm_depthwise_conv_wrapper_s8`` notices the single input channel and runs
  ``arm_convolve_wrapper_s8`` itself, after transposing the filter into the scratch buffer
  on every call.

Both are the same arithmetic as a plain convolution with the filter laid out OHWI (one
input channel: ``[C, H, W, 1]``) and the same per-channel requantization, so this rewrite,
run after the backend's passes, swaps the operator at export: the M33 gets the convolution
kernel, the M55 skips the per-call transpose and its scratch. The first layer of the MLPerf
Tiny keyword-spotting CNN (``ds_cnn``: 1 -> 64 channels, 10x4) is such a convolution.
"""

from __future__ import annotations

from typing import Any


def one_channel_depthwise_as_conv(ep: Any, cpu_target: Any) -> int:
    """Rewrite, in place, every cortex_m depthwise convolution of `ep` whose input has one
    channel into cortex_m::quantized_conv2d. Returns how many were rewritten."""
    from executorch.backends.arm._passes.arm_pass_utils import get_first_fake_tensor
    from executorch.backends.cortex_m.passes.scratch_buffer_sizes import (
        required_cmsis_nn_buffer_sizes,
    )
    from executorch.backends.transforms.utils import (
        create_constant_placeholder,
        delete_constant_placeholder,
        get_param_tensor,
    )
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.export.graph_signature import InputKind

    depthwise = exir_ops.edge.cortex_m.quantized_depthwise_conv2d.default
    graph_module = ep.graph_module
    graph = graph_module.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != depthwise:
            continue
        (x, weight, bias, stride, padding, dilation, _multiplier, input_offset, output_offset,
         multipliers, shifts, qmin, qmax, scratch) = node.args
        if get_first_fake_tensor(x).shape[1] != 1:
            continue
        # Depthwise filters are [1, H, W, C_out] (IHWO); the convolution takes OHWI.
        filter_ihwo = get_param_tensor(ep, weight)
        with graph.inserting_after(weight):
            filter_ohwi = create_constant_placeholder(
                ep, graph, f"{node.name}_weight_ohwi", InputKind.PARAMETER,
                filter_ihwo.permute(3, 1, 2, 0).contiguous())
        with graph.inserting_before(node):
            conv = graph.call_function(
                exir_ops.edge.cortex_m.quantized_conv2d.default,
                (x, filter_ohwi, bias, stride, padding, dilation, input_offset, output_offset,
                 multipliers, shifts, qmin, qmax, scratch))
        conv.meta = dict(node.meta)
        node.replace_all_uses_with(conv)
        graph.erase_node(node)
        if not weight.users:
            delete_constant_placeholder(ep, weight)
        # The scratch is now the convolution's (im2col); AtenToCortexMPass sizes it the same.
        (size,) = required_cmsis_nn_buffer_sizes(conv, cpu_target.backend)
        scratch.args = (((size,), scratch.args[0][1]),)
        scratch.meta["val"] = scratch.meta["val"].new_empty((size,))
        rewritten += 1
    if rewritten:
        graph.lint()
        graph_module.recompile()
    return rewritten


def drop_one_channel_layout_clones(ep: Any) -> int:
    """Remove, in place, every dim-order clone that only relabels a one-channel input of
    CMSIS-NN convolutions. Returns how many were removed.

    A Conv1d over one channel lowered as a Conv2d takes an (N, 1, 1, L) or (N, 1, L, 1)
    tensor, which the backend clones to channels-last. With one channel and a dimension of 1
    that clone moves no byte, and its strides are ambiguous: the emitter derives the output's
    dim order from them (``dim_order_from_stride``) as (0, 2, 1, 3) or (0, 1, 2, 3), not the
    (0, 2, 3, 1) the clone asks for, and the portable kernel refuses the mismatch on the
    device (``_clone_dim_order``: InvalidArgument; issue #32, found by the execute_error
    record). CMSIS-NN's convolution kernels take a one-channel input in any dim order (their
    channels-last check passes a tensor of one channel), so the clone goes and they read its
    input directly."""
    from executorch.backends.arm._passes.arm_pass_utils import get_first_fake_tensor
    from executorch.exir.dialects._ops import ops as exir_ops

    clone = exir_ops.edge.dim_order_ops._clone_dim_order.default
    convolutions = (exir_ops.edge.cortex_m.quantized_conv2d.default,
                    exir_ops.edge.cortex_m.quantized_depthwise_conv2d.default)
    graph_module = ep.graph_module
    graph = graph_module.graph
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != clone:
            continue
        source = node.args[0]
        before, after = get_first_fake_tensor(source), get_first_fake_tensor(node)
        if before.dim() != 4 or before.shape != after.shape or before.shape[1] != 1:
            continue
        # The same bytes in the same places: every dimension of more than one element keeps
        # its stride.
        if any(before.stride(d) != after.stride(d) for d in range(4) if before.shape[d] > 1):
            continue
        if not node.users or not all(u.op == "call_function" and u.target in convolutions
                                     and u.args[0] is node for u in node.users):
            continue
        node.replace_all_uses_with(source)
        graph.erase_node(node)
        removed += 1
    if removed:
        graph.lint()
        graph_module.recompile()
    return removed
