/*
 * dk_deferred_kernels.cpp: ExecuTorch's generated registration of the models' kernels
 * (RegisterCodegenUnboxedKernelsEverything.cpp from tools/cmake/Codegen.cmake, the runner's),
 * registered by dk_lib_register_model_kernels() instead of a static constructor
 * (dk_deferred_registration.h says why and how).
 */
#include "dk_deferred_registration.h"

#include DK_REGISTRATION_SOURCE

#undef register_kernels

extern "C" int dk_lib_register_model_kernels(void) {
  using executorch::ET_RUNTIME_NAMESPACE::Kernel;
  constexpr size_t count =
      sizeof torch::executor::function::kernels_to_register / sizeof(Kernel);
  return static_cast<int>(executorch::ET_RUNTIME_NAMESPACE::register_kernels(
      executorch::runtime::Span<const Kernel>(torch::executor::function::kernels_to_register,
                                              count)));
}
