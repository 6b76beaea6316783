"""Quantized batch matmuls lowered right after the q/dq folding, before the passes that
retrace the graph.

ExecuTorch v1.4.1's ``FoldAndAnnotateQParamsPass`` folds each quantize/dequantize into its
operator, after which the passes of ``CortexMPassManager`` that follow retrace the graph with
fake tensors. In that retrace a folded ``linear`` (int8 input and weight, int32 bias) gives an
int32 value, and the reshapes and permutes after it stay int32, whereas a folded ``softmax``
gives int8. Attention's second matmul, ``softmax(q @ kᵀ) @ v``, reads one of each, and
``aten.bmm``'s meta function refuses the mix ("expected scalar type torch.int8 but found
torch.int32") in ``ReplaceScalarWithTensorArgPass``: the matmul then stayed float (the
mixed-precision fallback), the block's largest float island. (``q @ kᵀ`` reads two linears,
int32 both, and gets through.)

The fix substitutes every quantized ``bmm`` with ``cortex_m::quantized_batch_matmul`` at that
point, with the Cortex-M backend's own substitution function (the one ``AtenToCortexMPass``
would apply at the end), so the retracing passes see the Cortex-M operator, whose meta
function takes any input dtypes. The result is the same operator with the same arguments;
only the point where it is made moves. ``AtenToCortexMPass`` still sizes its scratch buffer.
"""

from __future__ import annotations

import functools


@functools.cache
def early_batch_matmul_pass() -> type:
    """The pass class (made on first use: importing the Cortex-M backend is slow)."""
    from executorch.backends.cortex_m.passes import aten_to_cortex_m_pass
    from executorch.backends.transforms.aten_to_dialect_pass import AtenToDialectPass
    from executorch.exir.dialects._ops import ops as exir_ops

    class EarlyBatchMatmulPass(AtenToDialectPass):
        """``aten.bmm`` with folded int8 qparams -> ``cortex_m::quantized_batch_matmul``."""

    EarlyBatchMatmulPass.register_dialect_substitution(exir_ops.edge.aten.bmm.default)(
        aten_to_cortex_m_pass._get_bmm_replacement)
    return EarlyBatchMatmulPass
