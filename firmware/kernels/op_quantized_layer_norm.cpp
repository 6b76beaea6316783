/*
 * op_quantized_layer_norm.cpp: deploykit::quantized_layer_norm.out, LayerNorm over the last
 * dimension with int8 input and output (firmware/kernels/functions.yaml). The cortex_m flow
 * puts it where a LayerNorm was a float island (dequantize -> native_layer_norm ->
 * quantize; tools/deploykit/flows/layer_norm_int8.py).
 *
 * The arithmetic is the one tools/deploykit/flows/deploykit_ops.py defines and the host
 * reference runs in numpy float32; the device gives the same bytes because
 *   - every sum is exact in integers (S and Q in int32, V in int64), so no float sum whose
 *     order could differ;
 *   - the float32 operations are the same ones in the same order, each an IEEE-754 operation
 *     correctly rounded on both sides (+, -, *, /, sqrt, integer to float conversions);
 *   - this file is compiled with -ffp-contract=off (cmake/ExecuTorchRuntime.cmake sets it on
 *     this source whatever the profile's DK_ET_FP_CONTRACT), so no a * b + c is fused into
 *     one rounding (GCC may still use VMLA, which rounds the product and the sum apart), and
 *     without -ffast-math; -fno-math-errno only lets sqrtf be the VSQRT instruction;
 *   - rounding to an integer is nearbyintf in the default rounding mode, half to even, as
 *     numpy's rint (VRINTR on an FPv5 core); the clamp is fminf/fmaxf (VMINNM/VMAXNM).
 */
#include <cmath>
#include <cstdint>

#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>

namespace torch {
namespace executor {
namespace native {

using Tensor = executorch::aten::Tensor;
using ScalarType = executorch::aten::ScalarType;

namespace {

// The widest last dimension the arithmetic is exact for (flows/deploykit_ops.py
// MAX_LAYER_NORM_WIDTH): |c_i| <= 2 * 255 * N stays exact in float32, V in int64.
constexpr int64_t kMaxWidth = 16384;

void layer_norm_row(const int8_t* in, int8_t* out, int32_t width, int32_t input_zero_point,
                    float input_scale, const float* weight, const float* bias, float eps,
                    float output_reciprocal, float output_zero_point) {
  // One pass for S = sum d_i and Q = sum d_i^2 (|d_i| <= 255: Q < 2^31 for the widths taken);
  // V = sum (N d_i - S)^2 = N (N Q - S^2), exactly.
  int32_t sum = 0;
  int32_t squares = 0;
  for (int32_t i = 0; i < width; ++i) {
    const int32_t d = static_cast<int32_t>(in[i]) - input_zero_point;
    sum += d;
    squares += d * d;
  }
  const int64_t v = static_cast<int64_t>(width) *
                    (static_cast<int64_t>(width) * squares - static_cast<int64_t>(sum) * sum);
  const float n = static_cast<float>(width);
  const float var = (static_cast<float>(v) / (n * n * n)) * (input_scale * input_scale);
  const float factor = (1.0f / sqrtf(var + eps)) * (input_scale / n);
  for (int32_t i = 0; i < width; ++i) {
    const int32_t centered = width * (static_cast<int32_t>(in[i]) - input_zero_point) - sum;
    const float y = ((static_cast<float>(centered) * factor) * weight[i]) + bias[i];
    const float q = nearbyintf(y * output_reciprocal) + output_zero_point;
    out[i] = static_cast<int8_t>(fminf(fmaxf(q, -128.0f), 127.0f));
  }
}

}  // namespace

Tensor& dk_quantized_layer_norm_out(KernelRuntimeContext& ctx, const Tensor& input,
                                    int64_t input_zero_point, double input_scale,
                                    const Tensor& weight, const Tensor& bias, double eps,
                                    double output_scale, int64_t output_zero_point,
                                    Tensor& out) {
  ET_KERNEL_CHECK(ctx, input.scalar_type() == ScalarType::Char &&
                           out.scalar_type() == ScalarType::Char &&
                           weight.scalar_type() == ScalarType::Float &&
                           bias.scalar_type() == ScalarType::Float,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, input.dim() >= 1, InvalidArgument, out);
  const int64_t width = input.size(input.dim() - 1);
  ET_KERNEL_CHECK_MSG(ctx, width >= 1 && width <= kMaxWidth, InvalidArgument, out,
                      "last dimension %d", static_cast<int>(width));
  ET_KERNEL_CHECK(ctx, weight.dim() == 1 && weight.size(0) == width && bias.dim() == 1 &&
                           bias.size(0) == width,
                  InvalidArgument, out);
  // Rows of the last dimension are contiguous runs in memory only in the contiguous order.
  ET_KERNEL_CHECK(ctx, is_contiguous_dim_order(input.dim_order().data(), input.dim()) &&
                           tensors_have_same_dim_order(input, out),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, input_zero_point >= -128 && input_zero_point <= 127 &&
                           output_zero_point >= -128 && output_zero_point <= 127,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, resize_tensor(out, input.sizes()) == Error::Ok, InvalidArgument, out);

  const int8_t* in = input.const_data_ptr<int8_t>();
  int8_t* dst = out.mutable_data_ptr<int8_t>();
  const size_t rows = static_cast<size_t>(input.numel() / width);
  const float output_reciprocal = 1.0f / static_cast<float>(output_scale);
  for (size_t r = 0; r < rows; ++r) {
    layer_norm_row(in + r * width, dst + r * width, static_cast<int32_t>(width),
                   static_cast<int32_t>(input_zero_point), static_cast<float>(input_scale),
                   weight.const_data_ptr<float>(), bias.const_data_ptr<float>(),
                   static_cast<float>(eps), output_reciprocal,
                   static_cast<float>(output_zero_point));
  }
  return out;
}

}  // namespace native
}  // namespace executor
}  // namespace torch
