/*
 * kernel_status.h: the last refusal of a kernel's library call, kept for the `execute_error`
 * record (docs/protocol.md).
 *
 * ExecuTorch's cortex_m kernels check the status CMSIS-NN returns and fail the kernel call;
 * the status itself only reaches ExecuTorch's log, which the size and speed profiles compile
 * out. So the firmware links every CMSIS-NN call those kernels make through a wrapper
 * (`-Wl,--wrap=<function>`, kernel_status.c) that keeps the function's name and status when the
 * call does not succeed: 8 bytes of RAM, and no change to the fetched ExecuTorch sources.
 */
#ifndef DK_KERNEL_STATUS_H
#define DK_KERNEL_STATUS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dk_kernel_failure {
  const char *call;  /* the library function that refused, NULL when none did */
  int32_t status;    /* its status (CMSIS-NN: arm_cmsis_nn_status), 0 when none */
} dk_kernel_failure_t;

extern dk_kernel_failure_t dk_kernel_failure;

/* Forget the last refusal (before each execute(), so a report names this run's call). */
static inline void dk_kernel_failure_clear(void) {
  dk_kernel_failure.call = 0;
  dk_kernel_failure.status = 0;
}

#ifdef __cplusplus
}
#endif

#endif /* DK_KERNEL_STATUS_H */
