/* npu.h: the runner's Ethos-U NPU support (npu_ethos_u.cpp), compiled in when DK_ETHOS_U=1
 * (ethos_u_int8 firmware for a board with an npu section). */
#ifndef DK_RUNNER_NPU_H
#define DK_RUNNER_NPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Check that an Ethos-U of the built type answers at DK_NPU_BASE (its ID register), initialise
 * the driver (ethosu_init with the board file's security and privilege settings and the memory
 * mode's fast arena) and enable its interrupt. Returns 0; on failure it has sent an `error`
 * record (DK_ERR_NO_NPU or DK_ERR_NPU_INIT, dk_errors.h) and returns that code. */
uint32_t dk_npu_init(void);

/* Nonzero while EthosUBackend::execute() runs: its temp-allocator request is the Vela scratch,
 * which the runner counts apart from the CPU kernels' temp use. */
int dk_npu_in_delegate(void);

/* Delegate calls so far, and one `npu` record for each (NPU cycles, PMU counters, CPU ticks). */
uint32_t dk_npu_calls(void);
void dk_npu_send_records(void);

/* After a failed execute(): why the last NPU run failed ("" when none did), for the error
 * record. */
const char *dk_npu_failure(void);

#ifdef __cplusplus
}
#endif

#endif /* DK_RUNNER_NPU_H */
