/*
 * dk_runtime.cpp: what a deploykit library component holds once, however many models it has.
 *
 * - dk_lib_runtime_init(): the ExecuTorch runtime's start (et_pal_init) and the one
 *   registration of the union of the models' kernels and primitive operators into the one
 *   kernel registry (and, for Ethos-U models, of ExecuTorch's EthosUBackend), on the first
 *   dk_<model>_init(); later calls return its result.
 * - The ExecuTorch platform layer (strong definitions over the runtime's weak minimal PAL): no
 *   timer, no log output (the runtime is built without logging in the size and speed
 *   profiles), no heap (every allocation comes from a model's arena); an abort calls
 *   dk_abort_handler(), which the application may define.
 *
 * No static constructors: the application's start-up code owns the C runtime.
 */
#include <stddef.h>
#include <stdint.h>

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "deploykit.h"

extern "C" int dk_lib_register_model_kernels(void);    // dk_deferred_kernels.cpp
extern "C" int dk_lib_register_prim_ops(void);         // dk_deferred_prim_ops.cpp
extern "C" int dk_lib_register_ethos_u_backend(void);  // dk_deferred_ethos_u_backend.cpp

namespace {
bool runtime_started = false;
int runtime_status = DK_OK;
}  // namespace

extern "C" int dk_lib_runtime_init(void) {
  if (runtime_started) return runtime_status;
  executorch::runtime::runtime_init();
  int status = DK_OK;
#if DK_LIB_HAS_PRIM_OPS
  status = dk_lib_register_prim_ops();
#endif
#if DK_LIB_HAS_MODEL_KERNELS
  if (status == DK_OK) status = dk_lib_register_model_kernels();
#endif
#if DK_ETHOS_U
  if (status == DK_OK) status = dk_lib_register_ethos_u_backend();
#endif
  runtime_started = true;
  runtime_status = status;
  return status;
}

/* The default: stop here. An application that can do better (log, reset) defines its own. */
extern "C" __attribute__((weak, noreturn)) void dk_abort_handler(int code) {
  (void)code;
  for (;;) {
    __asm__ volatile("" ::: "memory");
  }
}

extern "C" {

void et_pal_init(void) {}

ET_NORETURN void et_pal_abort(void) { dk_abort_handler(DK_ERR_ABORT); }

et_timestamp_t et_pal_current_ticks(void) { return 0; }

et_tick_ratio_t et_pal_ticks_to_ns_multiplier(void) { return {1u, 1u}; }

void et_pal_emit_log_message(et_timestamp_t, et_pal_log_level_t, const char *, const char *,
                             size_t, const char *, size_t) {}

void *et_pal_allocate(size_t) { return nullptr; }  // every allocation comes from the arenas

void et_pal_free(void *) {}

/* A pure virtual call is a defect; without this, a C application's link pulls libsupc++'s. */
void __cxa_pure_virtual(void) { dk_abort_handler(DK_ERR_ABORT); }

}  // extern "C"
