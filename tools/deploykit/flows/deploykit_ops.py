"""deploykit's own torch operators (namespace ``deploykit``): what the cortex_m flow puts into a
program where ExecuTorch's Cortex-M backend has no int8 operator, with the Python
implementation the host reference runs and the schema of the kernel the firmware has
(firmware/kernels/functions.yaml).

``deploykit::quantized_layer_norm(Tensor input, int input_zero_point, float input_scale,
Tensor weight, Tensor bias, float eps, float output_scale, int output_zero_point) -> Tensor``

LayerNorm over the last dimension, int8 in and int8 out (per-tensor scale and zero point on
each side); `weight` and `bias` are float32 vectors of the last dimension's length
(``nn.LayerNorm``'s, ones and zeros when it has none). The arithmetic is defined so that the
host (here, numpy float32) and the device (firmware/kernels/op_quantized_layer_norm.cpp, C
compiled with ``-ffp-contract=off``) give the same bytes: per row of N values

    d_i = x_i - input_zero_point                  (int32)
    S   = sum d_i,  Q = sum d_i * d_i             (exact, int32)
    c_i = N * d_i - S                             (exact, int32: N * (x_i - mean) / scale)
    V   = N * (N * Q - S * S) = sum c_i * c_i     (exact, int64: N^3 * variance / scale^2)

and then in float32, one IEEE operation at a time in this order (each correctly rounded on
both sides, none fused, no float sum whose order could differ):

    n      = (float)N,  s_in = (float)input_scale,  r_out = 1 / (float)output_scale
    var    = ((float)V / (n * n * n)) * (s_in * s_in)
    factor = (1 / sqrt(var + (float)eps)) * (s_in / n)
    y_i    = (((float)c_i * factor) * weight_i) + bias_i
    q_i    = fmin(fmax(rint(y_i * r_out) + (float)output_zero_point, -128), 127)

``rint`` rounds half to even (numpy's ``rint``, C's ``nearbyintf`` in the default rounding
mode). This is torch's float LayerNorm of the dequantized input, quantized, up to float32
rounding: the two differ by at most one output step where a value falls next to a rounding
boundary.

The ``.out`` overload is the schema ExecuTorch's ``to_executorch`` rewrites the call to (as
``executorch/backends/cortex_m/ops/operators.py`` declares its own); the host runs the
functional one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.library import Library, impl, register_fake

NAMESPACE = "deploykit"
# Beyond this width Q (up to 255^2 * N) or c_i (up to 2 * 255 * N) would leave the exact
# integer ranges the arithmetic relies on (int32 Q, float32-exact c_i).
MAX_LAYER_NORM_WIDTH = 16384

_lib = Library(NAMESPACE, "DEF")
_lib.define(
    "quantized_layer_norm(Tensor input, int input_zero_point, float input_scale, "
    "Tensor weight, Tensor bias, float eps, float output_scale, int output_zero_point) "
    "-> Tensor")
_lib.define(
    "quantized_layer_norm.out(Tensor input, int input_zero_point, float input_scale, "
    "Tensor weight, Tensor bias, float eps, float output_scale, int output_zero_point, "
    "*, Tensor(a!) out) -> Tensor(a!)")


def layer_norm_int8(x: np.ndarray, input_zero_point: int, input_scale: float,
                    weight: np.ndarray, bias: np.ndarray, eps: float, output_scale: float,
                    output_zero_point: int) -> np.ndarray:
    """The arithmetic above on `x` (int8, normalized over its last dimension), in numpy."""
    n = x.shape[-1]
    d = x.reshape(-1, n).astype(np.int64) - input_zero_point
    s = d.sum(axis=1, keepdims=True)
    q = (d * d).sum(axis=1, keepdims=True)
    c = n * d - s
    v = n * (n * q - s * s)
    f32 = np.float32
    nf = f32(n)
    s_in = f32(input_scale)
    r_out = f32(1.0) / f32(output_scale)
    # eps = 0 on a constant row divides by zero, into NaN: as on the device, the clamp's
    # fmax/fmin (C's fmaxf/fminf) take the bound over a NaN.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        var = (v.astype(f32) / (nf * nf * nf)) * (s_in * s_in)
        factor = (f32(1.0) / np.sqrt(var + f32(eps))) * (s_in / nf)
        y = ((c.astype(f32) * factor) * weight.astype(f32)) + bias.astype(f32)
        out = np.rint(y * r_out) + f32(output_zero_point)
    return np.fmin(np.fmax(out, f32(-128)), f32(127)).astype(np.int8).reshape(x.shape)


def _check(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    n = input.shape[-1] if input.dim() else 0
    if input.dtype != torch.int8 or weight.dtype != torch.float32 or \
            bias.dtype != torch.float32:
        raise ValueError("deploykit::quantized_layer_norm takes an int8 input and float32 "
                         f"weight and bias, not {input.dtype}, {weight.dtype}, {bias.dtype}")
    if not 0 < n <= MAX_LAYER_NORM_WIDTH or tuple(weight.shape) != (n,) or \
            tuple(bias.shape) != (n,):
        raise ValueError("deploykit::quantized_layer_norm normalizes a last dimension of 1 to "
                         f"{MAX_LAYER_NORM_WIDTH} values with a weight and bias of its length: "
                         f"input {tuple(input.shape)}, weight {tuple(weight.shape)}, bias "
                         f"{tuple(bias.shape)}")


@register_fake(f"{NAMESPACE}::quantized_layer_norm")  # type: ignore[misc]
def _quantized_layer_norm_fake(input: torch.Tensor, input_zero_point: int, input_scale: float,
                               weight: torch.Tensor, bias: torch.Tensor, eps: float,
                               output_scale: float, output_zero_point: int) -> torch.Tensor:
    _check(input, weight, bias)
    return torch.empty_like(input, dtype=torch.int8)


@impl(_lib, "quantized_layer_norm", "CompositeExplicitAutograd")  # type: ignore[misc]
def _quantized_layer_norm(input: torch.Tensor, input_zero_point: int, input_scale: float,
                          weight: torch.Tensor, bias: torch.Tensor, eps: float,
                          output_scale: float, output_zero_point: int) -> torch.Tensor:
    _check(input, weight, bias)
    out = layer_norm_int8(input.detach().cpu().contiguous().numpy(), input_zero_point,
                          input_scale, weight.detach().cpu().numpy(),
                          bias.detach().cpu().numpy(), eps, output_scale, output_zero_point)
    return torch.from_numpy(out).to(input.device)


def quantized_layer_norm_op() -> Any:
    """The edge-dialect operator the export pass inserts."""
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge.deploykit.quantized_layer_norm.default
