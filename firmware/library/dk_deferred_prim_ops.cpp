/*
 * dk_deferred_prim_ops.cpp: ExecuTorch's primitive operators (kernels/prim_ops/
 * register_prim_ops.cpp, with the runner's selective build of the models' ones where the
 * profile asks for it), registered by dk_lib_register_prim_ops() instead of a static
 * constructor (dk_deferred_registration.h says why and how).
 */
#include <algorithm>
#include <cmath>

#include <executorch/kernels/prim_ops/et_copy_index.h>
#include <executorch/kernels/prim_ops/et_view.h>

#include "dk_deferred_registration.h"

#include <executorch/kernels/prim_ops/register_prim_ops.cpp>

#undef register_kernels

extern "C" int dk_lib_register_prim_ops(void) {
  using executorch::ET_RUNTIME_NAMESPACE::Kernel;
  constexpr size_t count = sizeof torch::executor::function::prim_ops / sizeof(Kernel);
  return static_cast<int>(executorch::ET_RUNTIME_NAMESPACE::register_kernels(
      executorch::runtime::Span<const Kernel>(torch::executor::function::prim_ops, count)));
}
