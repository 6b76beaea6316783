/* board.c: MPS family board API (dk_board.h): init, exit, stack/heap use, fault report. */
#include <stddef.h>
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"
#include "dk_fault_capture.h"
#include "dk_protocol.h"
#include "mps_internal.h"

/* Linker symbols (sections.ld). */
extern uint32_t __dk_stack_limit[];
extern uint32_t __dk_stack_top[];
extern uint8_t __dk_heap_start[];
extern uint8_t __dk_heap_end[];

void dk_uart_init(void);
void dk_timer_init(void);
void dk_caches_enable(void);
size_t dk_sbrk_high_water(void);
DK_NORETURN void dk_fault_report(const uint32_t *frame, uint32_t exc_return);

#define REG32(addr) (*(volatile uint32_t *)(addr))

#define SHCSR_MEMFAULTENA (1u << 16)
#define SHCSR_BUSFAULTENA (1u << 17)
#define SHCSR_USGFAULTENA (1u << 18)
#define SHCSR_SECUREFAULTENA (1u << 19) /* Armv8-M with TrustZone; RES0 elsewhere */

#ifndef DK_SEMIHOSTING
#define DK_SEMIHOSTING 1
#endif

static int dk_board_ready;

void dk_board_init(void) {
  if (dk_board_ready) return;
  dk_caches_enable(); /* board file cpu.caches; nothing otherwise */
  dk_uart_init();
  dk_timer_init();
  /* Report MemManage, BusFault and UsageFault as themselves rather than as HardFault. */
  uint32_t shcsr = SHCSR_MEMFAULTENA | SHCSR_BUSFAULTENA | SHCSR_USGFAULTENA;
#if DK_HAS_STACK_LIMIT
  shcsr |= SHCSR_SECUREFAULTENA;
#endif
  REG32(DK_SCB_SHCSR) |= shcsr;
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  dk_board_ready = 1;
}

void dk_exit(int status) {
#if DK_SEMIHOSTING
  /* SYS_EXIT_EXTENDED (0x20) with ADP_Stopped_ApplicationExit (0x20026): the simulator exits
   * with `status` as its exit code (plain SYS_EXIT cannot carry a code on AArch32). */
  volatile uint32_t block[2] = {0x20026u, (uint32_t)status};
  register uint32_t r0 __asm__("r0") = 0x20u;
  register volatile uint32_t *r1 __asm__("r1") = block;
  __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
#else
  (void)status;
#endif
  __asm__ volatile("cpsid i" ::: "memory");
  for (;;) __asm__ volatile("wfi");
}

size_t dk_stack_size(void) {
  return (size_t)((uintptr_t)__dk_stack_top - (uintptr_t)__dk_stack_limit);
}

size_t dk_stack_used(void) {
  const volatile uint32_t *p = __dk_stack_limit;
  const uintptr_t top = (uintptr_t)__dk_stack_top;
  while ((uintptr_t)p < top && *p == (uint32_t)DK_STACK_PAINT) ++p;
  return (size_t)(top - (uintptr_t)p);
}

size_t dk_heap_size(void) {
  return (size_t)((uintptr_t)__dk_heap_end - (uintptr_t)__dk_heap_start);
}

size_t dk_heap_used(void) { return dk_sbrk_high_water(); }

/* ---- fault report ---- */


static volatile int dk_in_fault;

/* Entered from dk_fault_entry on the private fault stack. `frame` is the stacked exception frame
 * (r0 r1 r2 r3 r12 lr pc xpsr). Sends log + fault + done(2) and exits with status 2. */
void dk_fault_report(const uint32_t *frame, uint32_t exc_return) {
  if (dk_in_fault) dk_exit(DK_STATUS_FAULT); /* a fault while reporting one: just stop */
  dk_in_fault = 1;
  dk_fault_regs_t r;
  const uint32_t exc = dk_fault_exception_number();
  const int frame_lost = dk_fault_capture(frame, exc_return, (uintptr_t)__dk_stack_limit,
                                          (uintptr_t)__dk_stack_top, &r);
  if (!dk_board_ready) dk_uart_init();
  dk_fault_log_exception(exc);
  if (frame_lost) dk_send_log("fault: main stack overflow; the stacked registers were lost");
  dk_send_fault(&r);
  dk_send_done(DK_STATUS_FAULT);
  dk_exit(DK_STATUS_FAULT);
}
