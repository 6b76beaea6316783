/*
 * op_memory_order_copy.cpp: slice_copy.Tensor_out, cat.out, permute_copy.out and
 * _clone_dim_order.out that copy in the tensors' memory order (their dim order), replacing
 * ExecuTorch v1.4.1's portable kernels for these operators in deploykit's firmware
 * (firmware/kernels/functions.yaml).
 *
 * Why: the portable slice and cat compute their copy runs from the logical dimensions, which
 * equal the memory order only for a contiguous tensor. On a channels-last (NHWC) tensor, which
 * is what the cortex_m flow's convolutions read and write, they copy the wrong bytes; and on a
 * contiguous tensor cut along its last dimension they copy one element per memcpy (about 45
 * instructions per byte on a Cortex-M). The portable dim-order copy and permute go through
 * per-element index arithmetic (and the permute assumes contiguous tensors). Here:
 *   - slice and cat: the outer dimensions (before the cut one in memory order) times one
 *     memcpy of the cut range with everything inside it (one per step when step > 1);
 *   - dim-order copy and permute: a walk over the output in its memory order with the
 *     input's stride of the innermost output dimension, on 1/2/4/8-byte words (the bytes are
 *     copied, not converted: input and output have one dtype).
 * Argument checks and output sizes are the portable library's own (kernels/portable/cpu/util),
 * so the kernels accept and refuse exactly what the portable ones do, and give the same
 * result on every contiguous tensor.
 */
#include <cstdint>
#include <cstring>

#include <executorch/kernels/portable/cpu/util/copy_ops_util.h>
#include <executorch/kernels/portable/cpu/util/slice_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>

namespace torch {
namespace executor {
namespace native {

using Tensor = executorch::aten::Tensor;
template <typename T>
using OptionalArrayRef = executorch::aten::OptionalArrayRef<T>;

namespace {

// A tensor seen in memory order around one logical dimension: `outer` runs of `extent`
// entries of `inner_bytes` each.
struct Runs {
  size_t outer;
  size_t extent;
  size_t inner_bytes;
};

size_t bytes_per_element(const Tensor& t) {
  return static_cast<size_t>(t.element_size());
}

Runs runs_around(const Tensor& t, int64_t dim) {
  const auto order = t.dim_order();
  Runs r{1, static_cast<size_t>(t.size(dim)), bytes_per_element(t)};
  bool inside = false;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == dim) {
      inside = true;
    } else if (inside) {
      r.inner_bytes *= static_cast<size_t>(t.size(order[i]));
    } else {
      r.outer *= static_cast<size_t>(t.size(order[i]));
    }
  }
  return r;
}

// Copies the strided view of `in` whose logical dimension d has the stride
// view_strides[d] (elements) into `out`, walking `out` in its memory order: the innermost
// dimension as a run, an odometer over the others.
template <typename WORD>
void copy_view(const Tensor& in, const size_t* view_strides, Tensor& out) {
  const WORD* src = in.const_data_ptr<WORD>();
  WORD* dst = out.mutable_data_ptr<WORD>();
  const auto order = out.dim_order();
  const size_t ndim = order.size();
  const size_t last = order[ndim - 1];
  const size_t run = static_cast<size_t>(out.size(last));
  const size_t run_stride = view_strides[last];
  size_t index[kTensorDimensionLimit] = {};  // position in the outer dimensions, memory order
  const size_t runs = out.numel() / run;
  size_t base = 0;  // the input offset of the current run's first element
  for (size_t r = 0; r < runs; ++r) {
    const WORD* s = src + base;
    for (size_t k = 0; k < run; ++k) {
      dst[k] = s[k * run_stride];
    }
    dst += run;
    // Advance the odometer over the outer dimensions, innermost first.
    for (size_t i = ndim - 1; i-- > 0;) {
      const size_t d = order[i];
      base += view_strides[d];
      if (++index[i] < static_cast<size_t>(out.size(d))) break;
      base -= index[i] * view_strides[d];
      index[i] = 0;
    }
  }
}

// copy_view for the element size of `in` (the bytes are moved, not converted).
bool copy_view_bytes(const Tensor& in, const size_t* view_strides, Tensor& out) {
  switch (bytes_per_element(in)) {
    case 1:
      copy_view<uint8_t>(in, view_strides, out);
      return true;
    case 2:
      copy_view<uint16_t>(in, view_strides, out);
      return true;
    case 4:
      copy_view<uint32_t>(in, view_strides, out);
      return true;
    case 8:
      copy_view<uint64_t>(in, view_strides, out);
      return true;
    default:
      return false;
  }
}

}  // namespace

Tensor& dk_slice_copy_Tensor_out(KernelRuntimeContext& ctx, const Tensor& in, int64_t dim,
                                 std::optional<int64_t> start_val,
                                 std::optional<int64_t> end_val, int64_t step, Tensor& out) {
  ET_KERNEL_CHECK(ctx, check_slice_copy_args(in, dim, step, out), InvalidArgument, out);
  if (dim < 0) dim += in.dim();
  ET_KERNEL_CHECK(ctx, tensors_have_same_dim_order(in, out), InvalidArgument, out);
  int64_t end = end_val.has_value() ? end_val.value() : in.size(dim);
  int64_t start = start_val.has_value() ? start_val.value() : 0;
  const int64_t length = adjust_slice_indices(in.size(dim), &start, &end, step);
  Tensor::SizesType target_sizes[kTensorDimensionLimit];
  size_t target_ndim = 0;
  get_slice_copy_out_target_size(in, dim, length, target_sizes, &target_ndim);
  ET_KERNEL_CHECK(ctx, resize_tensor(out, {target_sizes, target_ndim}) == Error::Ok,
                  InvalidArgument, out);
  if (length <= 0 || in.numel() == 0) return out;

  const Runs r = runs_around(in, dim);
  const char* src = in.const_data_ptr<char>() + static_cast<size_t>(start) * r.inner_bytes;
  char* dst = out.mutable_data_ptr<char>();
  const size_t len = static_cast<size_t>(length);
  if (step == 1) {
    const size_t bytes = len * r.inner_bytes;
    for (size_t i = 0; i < r.outer; ++i) {
      std::memcpy(dst, src, bytes);
      src += r.extent * r.inner_bytes;
      dst += bytes;
    }
    return out;
  }
  for (size_t i = 0; i < r.outer; ++i) {
    const char* s = src + i * r.extent * r.inner_bytes;
    for (size_t j = 0; j < len; ++j) {
      std::memcpy(dst, s, r.inner_bytes);
      s += static_cast<size_t>(step) * r.inner_bytes;
      dst += r.inner_bytes;
    }
  }
  return out;
}

Tensor& dk_cat_out(KernelRuntimeContext& ctx, executorch::aten::ArrayRef<Tensor> tensors,
                   int64_t dim, Tensor& out) {
  if (dim < 0) dim += out.dim();
  ET_KERNEL_CHECK(ctx, check_cat_args(tensors, dim, out), InvalidArgument, out);
  Tensor::SizesType out_sizes[kTensorDimensionLimit];
  size_t out_ndim = 0;
  get_cat_out_target_size(tensors, dim, out_sizes, &out_ndim);
  ET_KERNEL_CHECK(ctx, resize_tensor(out, {out_sizes, out_ndim}) == Error::Ok,
                  InvalidArgument, out);
  // As ATen: 1-D empty inputs take no part (check_cat_args allows them with any dim).
  bool copies_bytes = true;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    copies_bytes = copies_bytes && bytes_per_element(t) == bytes_per_element(out);
  }
  // Inputs of another element size are converted, as the portable kernel does; complex
  // outputs take only their own dtype (check_cat_args does not refuse the mix).
  ET_KERNEL_CHECK(ctx, copies_bytes || !executorch::runtime::isComplexType(out.scalar_type()),
                  InvalidArgument, out);
  if (out.numel() == 0) return out;

  const Runs r = runs_around(out, dim);
  const size_t inner = r.inner_bytes / bytes_per_element(out);  // elements per run entry
  char* out_bytes = out.mutable_data_ptr<char>();
  size_t offset = 0;  // elements of out before the current input's part of a run
  static constexpr const char op_name[] = "cat.out";
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const size_t part = static_cast<size_t>(t.size(dim)) * inner;  // elements per outer step
    if (bytes_per_element(t) == bytes_per_element(out)) {
      const char* src = t.const_data_ptr<char>();
      const size_t bytes = part * bytes_per_element(out);
      char* dst = out_bytes + offset * bytes_per_element(out);
      for (size_t i = 0; i < r.outer; ++i) {
        std::memcpy(dst, src, bytes);
        src += bytes;
        dst += r.extent * r.inner_bytes;
      }
    } else {
      ET_SWITCH_REALHBBF16_TYPES(out.scalar_type(), ctx, op_name, CTYPE_OUT, [&] {
        ET_SWITCH_REALHBBF16_TYPES(t.scalar_type(), ctx, op_name, CTYPE_IN, [&] {
          const CTYPE_IN* src = t.const_data_ptr<CTYPE_IN>();
          CTYPE_OUT* dst = out.mutable_data_ptr<CTYPE_OUT>() + offset;
          for (size_t i = 0; i < r.outer; ++i) {
            for (size_t k = 0; k < part; ++k) dst[k] = static_cast<CTYPE_OUT>(src[k]);
            src += part;
            dst += r.extent * inner;
          }
        });
      });
    }
    offset += part;
  }
  return out;
}

Tensor& dk_clone_dim_order_out(KernelRuntimeContext& ctx, const Tensor& self, bool non_blocking,
                               OptionalArrayRef<int64_t> dim_order, Tensor& out) {
  ET_KERNEL_CHECK(ctx, self.scalar_type() == out.scalar_type(), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, check__to_dim_order_copy_args(self, non_blocking, dim_order, out),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, resize_tensor(out, self.sizes()) == Error::Ok, InvalidArgument, out);
  if (self.numel() == 0) return out;
  if (tensors_have_same_dim_order(self, out)) {
    std::memcpy(out.mutable_data_ptr(), self.const_data_ptr(), self.nbytes());
    return out;
  }
  size_t view_strides[kTensorDimensionLimit];
  for (size_t d = 0; d < static_cast<size_t>(self.dim()); ++d) {
    view_strides[d] = static_cast<size_t>(self.strides()[d]);
  }
  ET_KERNEL_CHECK_MSG(ctx, copy_view_bytes(self, view_strides, out), InvalidArgument, out,
                      "element size %d", static_cast<int>(self.element_size()));
  return out;
}

Tensor& dk_permute_copy_out(KernelRuntimeContext& ctx, const Tensor& in,
                            executorch::aten::ArrayRef<int64_t> dims, Tensor& out) {
  ET_KERNEL_CHECK(ctx, check_permute_copy_args(in, dims, out), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensors_have_same_dim_order(in, out), InvalidArgument, out);
  Tensor::SizesType out_sizes[kTensorDimensionLimit];
  size_t out_ndim = 0;
  get_permute_copy_out_target_size(in, dims, out_sizes, &out_ndim);
  ET_KERNEL_CHECK(ctx, resize_tensor(out, {out_sizes, out_ndim}) == Error::Ok,
                  InvalidArgument, out);
  if (in.numel() == 0) return out;
  // Output dimension d reads input dimension dims[d].
  size_t view_strides[kTensorDimensionLimit];
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t from = dims[d] < 0 ? dims[d] + in.dim() : dims[d];
    view_strides[d] = static_cast<size_t>(in.strides()[from]);
  }
  if (in.dim() == 0) {
    std::memcpy(out.mutable_data_ptr(), in.const_data_ptr(), in.nbytes());
    return out;
  }
  ET_KERNEL_CHECK_MSG(ctx, copy_view_bytes(in, view_strides, out), InvalidArgument, out,
                      "element size %d", static_cast<int>(in.element_size()));
  return out;
}

}  // namespace native
}  // namespace executor
}  // namespace torch
