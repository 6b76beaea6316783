/*
 * op_avg_pool3d.cpp: aten::avg_pool3d.out, which ExecuTorch v1.4.1's portable kernels lack
 * (firmware/kernels/functions.yaml). Float and double, 4-D (C, D, H, W) or 5-D (N, C, D, H, W)
 * input in the default dim order.
 *
 * The result is PyTorch's (aten/src/ATen/native/cpu/AvgPoolKernel.cpp, cpu_avg_pool3d): the
 * output size of pooling_output_shape (dilation 1, ceil_mode's last-window rule), each window
 * clipped to the padded input to count `pool_size` and then to the input, the sum accumulated
 * in the input's type in depth-height-width order, divided by divisor_override, else
 * pool_size (count_include_pad) or the number of input elements in the window; a window that
 * lies wholly in the padding gives 0.
 */
#include <cstdint>

#include <executorch/runtime/kernel/kernel_includes.h>

namespace torch {
namespace executor {
namespace native {

using Tensor = executorch::aten::Tensor;
using ScalarType = executorch::aten::ScalarType;
using IntArrayRef = executorch::aten::ArrayRef<int64_t>;

namespace {

// PyTorch's pooling_output_shape with dilation 1.
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, bool ceil_mode) {
  const int64_t num = in + 2 * pad - k + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// A 3-element argument (PyTorch accepts one value for all three dims). `fallback` for empty.
bool triple(IntArrayRef a, IntArrayRef fallback, int64_t v[3]) {
  if (a.size() == 0) a = fallback;
  if (a.size() == 1) {
    v[0] = v[1] = v[2] = a[0];
    return true;
  }
  if (a.size() != 3) return false;
  for (int i = 0; i < 3; ++i) v[i] = a[i];
  return true;
}

template <typename CTYPE>
void pool(const Tensor &in, Tensor &out, const int64_t k[3], const int64_t s[3],
          const int64_t p[3], bool count_include_pad, std::optional<int64_t> divisor) {
  const int64_t nd = in.dim();
  const int64_t D = in.size(nd - 3), H = in.size(nd - 2), W = in.size(nd - 1);
  const int64_t OD = out.size(nd - 3), OH = out.size(nd - 2), OW = out.size(nd - 1);
  int64_t planes = 1;
  for (int64_t d = 0; d < nd - 3; ++d) planes *= in.size(d);
  const CTYPE *src = in.const_data_ptr<CTYPE>();
  CTYPE *dst = out.mutable_data_ptr<CTYPE>();
  for (int64_t c = 0; c < planes; ++c) {
    const CTYPE *plane = src + c * D * H * W;
    for (int64_t od = 0; od < OD; ++od) {
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t d0 = od * s[0] - p[0], h0 = oh * s[1] - p[1], w0 = ow * s[2] - p[2];
          int64_t d1 = d0 + k[0] < D + p[0] ? d0 + k[0] : D + p[0];
          int64_t h1 = h0 + k[1] < H + p[1] ? h0 + k[1] : H + p[1];
          int64_t w1 = w0 + k[2] < W + p[2] ? w0 + k[2] : W + p[2];
          const int64_t pool_size = (d1 - d0) * (h1 - h0) * (w1 - w0);
          d0 = d0 > 0 ? d0 : 0;
          h0 = h0 > 0 ? h0 : 0;
          w0 = w0 > 0 ? w0 : 0;
          d1 = d1 < D ? d1 : D;
          h1 = h1 < H ? h1 : H;
          w1 = w1 < W ? w1 : W;
          CTYPE *o = dst + ((c * OD + od) * OH + oh) * OW + ow;
          if (d0 >= d1 || h0 >= h1 || w0 >= w1) {
            *o = CTYPE(0);
            continue;
          }
          const int64_t factor = divisor.has_value() ? divisor.value()
                                 : count_include_pad ? pool_size
                                                     : (d1 - d0) * (h1 - h0) * (w1 - w0);
          CTYPE sum = CTYPE(0);
          for (int64_t id = d0; id < d1; ++id)
            for (int64_t ih = h0; ih < h1; ++ih)
              for (int64_t iw = w0; iw < w1; ++iw) sum += plane[(id * H + ih) * W + iw];
          *o = sum / static_cast<CTYPE>(factor);
        }
      }
    }
  }
}

}  // namespace

Tensor &avg_pool3d_out(KernelRuntimeContext &ctx, const Tensor &in, IntArrayRef kernel_size,
                       IntArrayRef stride, IntArrayRef padding, bool ceil_mode,
                       bool count_include_pad, std::optional<int64_t> divisor_override,
                       Tensor &out) {
  int64_t k[3], s[3], p[3];
  const int64_t zero[1] = {0};
  ET_KERNEL_CHECK(ctx, triple(kernel_size, kernel_size, k), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, triple(stride, kernel_size, s), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, triple(padding, IntArrayRef(zero, 1), p), InvalidArgument, out);
  bool ok = in.dim() == 4 || in.dim() == 5;
  for (int i = 0; i < 3; ++i) ok = ok && k[i] > 0 && s[i] > 0 && p[i] >= 0 && 2 * p[i] <= k[i];
  ok = ok && (!divisor_override.has_value() || divisor_override.value() != 0);
  ET_KERNEL_CHECK(ctx, ok, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, in.scalar_type() == out.scalar_type(), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensor_is_default_dim_order(in), InvalidArgument, out);

  executorch::aten::SizesType sizes[kTensorDimensionLimit];
  const int64_t nd = in.dim();
  for (int64_t d = 0; d < nd - 3; ++d) sizes[d] = in.size(d);
  for (int i = 0; i < 3; ++i) {
    const int64_t o = pooled_size(in.size(nd - 3 + i), k[i], p[i], s[i], ceil_mode);
    ET_KERNEL_CHECK(ctx, o > 0, InvalidArgument, out);
    sizes[nd - 3 + i] = static_cast<executorch::aten::SizesType>(o);
  }
  ET_KERNEL_CHECK(ctx, resize_tensor(out, {sizes, static_cast<size_t>(nd)}) == Error::Ok,
                  InvalidArgument, out);

  static constexpr const char op_name[] = "avg_pool3d.out";
  ET_SWITCH_FLOAT_TYPES(in.scalar_type(), ctx, op_name, CTYPE, [&]() {
    pool<CTYPE>(in, out, k, s, p, count_include_pad, divisor_override);
  });
  return out;
}

}  // namespace native
}  // namespace executor
}  // namespace torch
