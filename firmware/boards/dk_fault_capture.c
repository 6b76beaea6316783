#include "dk_fault_capture.h"

#include <string.h>

#define DK_REG32(addr) (*(volatile uint32_t *)(addr))
#define DK_SCB_CFSR_ADDR 0xE000ED28u
#define DK_SCB_HFSR_ADDR 0xE000ED2Cu
#define DK_SCB_MMFAR_ADDR 0xE000ED34u
#define DK_SCB_BFAR_ADDR 0xE000ED38u
#define DK_CFSR_STKOF (1u << 20)

int dk_fault_capture(const uint32_t *frame, uint32_t exc_return, uintptr_t stack_limit,
                     uintptr_t stack_top, dk_fault_regs_t *regs) {
  memset(regs, 0, sizeof *regs);
  const uintptr_t f = (uintptr_t)frame;
  const int on_psp = (exc_return & 4u) != 0u;
  if (on_psp || (f >= stack_limit && f + 32u <= stack_top)) {
    regs->r0 = frame[0];
    regs->r1 = frame[1];
    regs->r2 = frame[2];
    regs->r3 = frame[3];
    regs->r12 = frame[4];
    regs->lr = frame[5];
    regs->pc = frame[6];
    regs->xpsr = frame[7];
  }
  regs->cfsr = DK_REG32(DK_SCB_CFSR_ADDR);
  const int frame_lost = (regs->cfsr & DK_CFSR_STKOF) && !on_psp && f == stack_limit;
  if (frame_lost)
    regs->r0 = regs->r1 = regs->r2 = regs->r3 = regs->r12 = regs->lr = regs->pc = regs->xpsr = 0u;
  regs->hfsr = DK_REG32(DK_SCB_HFSR_ADDR);
  regs->mmfar = DK_REG32(DK_SCB_MMFAR_ADDR);
  regs->bfar = DK_REG32(DK_SCB_BFAR_ADDR);
  regs->exc_return = exc_return;
  return frame_lost;
}

static const char *dk_exception_name(uint32_t exc) {
  switch (exc) {
    case 2: return "NMI";
    case 3: return "HardFault";
    case 4: return "MemManage";
    case 5: return "BusFault";
    case 6: return "UsageFault";
    case 7: return "SecureFault";
    case 11: return "SVCall";
    case 12: return "DebugMonitor";
    case 14: return "PendSV";
    default: return exc >= 16u ? "unhandled IRQ" : "exception";
  }
}

void dk_fault_log_exception(uint32_t exc) {
  char buf[64];
  size_t n = 0u;
  const char *parts[3] = {"fault: ", dk_exception_name(exc), " (exception "};
  for (size_t i = 0u; i < 3u; ++i)
    for (const char *s = parts[i]; *s && n < sizeof buf - 12u; ++s) buf[n++] = *s;
  char digits[10];
  size_t d = 0u;
  do {
    digits[d++] = (char)('0' + exc % 10u);
    exc /= 10u;
  } while (exc && d < sizeof digits);
  while (d) buf[n++] = digits[--d];
  buf[n++] = ')';
  dk_send_log_n(buf, n);
}
