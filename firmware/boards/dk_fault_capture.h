/* dk_fault_capture: read a Cortex-M exception frame and the SCB fault registers into the
 * protocol's fault record. Shared by every board family's fault handler. */
#ifndef DK_FAULT_CAPTURE_H
#define DK_FAULT_CAPTURE_H

#include <stdint.h>

#include "dk_protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill `regs` from the stacked frame (r0 r1 r2 r3 r12 lr pc xpsr), EXC_RETURN and the SCB
 * (CFSR, HFSR, MMFAR, BFAR). The frame is read only where it can be: on the process stack, or
 * inside [stack_limit, stack_top) of the main stack. Returns 1 when the frame was lost (the
 * exception entry itself hit the stack limit, CFSR.STKOF: the core stacked nothing and the
 * registers are reported as 0), else 0. */
int dk_fault_capture(const uint32_t *frame, uint32_t exc_return, uintptr_t stack_limit,
                     uintptr_t stack_top, dk_fault_regs_t *regs);

/* The active exception number (IPSR): 3 HardFault, 4 MemManage, ..., 16+ an IRQ. */
static inline uint32_t dk_fault_exception_number(void) {
  uint32_t ipsr;
  __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
  return ipsr & 0x1FFu;
}

/* Send a log record "fault: <name> (exception <n>)" for IPSR value `exc`, without printf. */
void dk_fault_log_exception(uint32_t exc);

#ifdef __cplusplus
}
#endif

#endif /* DK_FAULT_CAPTURE_H */
