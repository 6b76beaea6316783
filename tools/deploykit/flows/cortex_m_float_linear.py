"""The cortex_m flow's float linears, rewritten onto kernels the runtime has.

The flow keeps ``aten.linear`` whole through ``to_edge`` (``preserve_ops``), so that the
Cortex-M passes can match a quantized linear (dequantize -> linear -> quantize) and turn it
into ``cortex_m::quantized_linear``. A linear the quantizer left in float (a GRU's gate
projections, a module the mixed-precision fallback kept in float) is then still
``aten.linear``, and would reach the runtime as ``aten::linear.out``, which no kernel of
ExecuTorch v1.4.1's portable library implements. This pass, run after the Cortex-M passes,
rewrites each one as the fp32 flow's export does: ``permute_copy`` of the weight (folded
into a constant afterwards) and ``addmm`` (``mm`` without a bias), with ``view_copy`` around
it for inputs of more than two dimensions.
"""

from __future__ import annotations

from typing import Any


def decompose_float_linear_pass() -> Any:
    """An ExportPass instance (ExecuTorch's pass base class is imported here, not at module
    import, so that importing the flows imports no torch)."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    edge = exir_ops.edge.aten

    class DecomposeFloatLinearPass(ExportPass):
        def call_operator(
            self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], meta: Any
        ) -> Any:
            if op != edge.linear.default:
                return super().call_operator(op, args, kwargs, meta)
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            shape = list(x.to_tensor().shape)
            out_features = weight.to_tensor().shape[0]
            w_t = super().call_operator(edge.permute_copy.default, (weight, [1, 0]), {}, meta)
            flat = (
                x
                if len(shape) == 2
                else super().call_operator(edge.view_copy.default, (x, [-1, shape[-1]]), {}, meta)
            )
            if bias is None:
                y = super().call_operator(edge.mm.default, (flat, w_t), {}, meta)
            else:
                y = super().call_operator(edge.addmm.default, (bias, flat, w_t), {}, meta)
            if len(shape) == 2:
                return y
            return super().call_operator(
                edge.view_copy.default, (y, [*shape[:-1], out_features]), {}, meta
            )

    return DecomposeFloatLinearPass()
