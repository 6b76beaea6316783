/*
 * dk_deferred_registration.h: ExecuTorch's generated kernel registration and its primitive
 * operators' registration, unchanged, but run when the component is initialised instead of by
 * a static constructor.
 *
 * Both sources end in `... success_with_kernel_reg = register_kernels(kernel_span);`, a
 * static variable whose initializer registers the kernels before main(). A component is linked
 * into an application that owns its start-up code, which may not run C++ constructors at all
 * (a plain C reset handler), and nothing would reference the registration's object in an
 * archive, so the kernels would silently be missing. Included before such a source, this header
 * turns that call into dk_deferred_registration(), a constexpr function that registers nothing:
 * the variable becomes a constant (no constructor is emitted), and the wrapper that includes the
 * source registers the source's own kernel array from a function dk_runtime.cpp calls.
 *
 * Every header those sources include must be included here first, so that the macro below does
 * not rename the declaration of register_kernels() itself.
 */
#ifndef DK_DEFERRED_REGISTRATION_H
#define DK_DEFERRED_REGISTRATION_H

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/profiler.h>

namespace executorch {
namespace ET_RUNTIME_NAMESPACE {
/* Takes the span by reference and reads nothing: a constant expression, so the static variable
 * it initialises needs no constructor. */
constexpr Error dk_deferred_registration(const Span<const Kernel> &) { return Error::Ok; }
}  // namespace ET_RUNTIME_NAMESPACE
}  // namespace executorch
using executorch::ET_RUNTIME_NAMESPACE::dk_deferred_registration;

#define register_kernels(kernels) dk_deferred_registration(kernels)

#endif /* DK_DEFERRED_REGISTRATION_H */
