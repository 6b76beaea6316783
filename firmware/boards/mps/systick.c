/* systick.c: 64-bit tick counter from the 24-bit SysTick on the processor clock (DK_TIMER_HZ).
 * SysTick wraps every 2^24 ticks; its interrupt counts the wraps. */
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"
#include "mps_internal.h"

#if !defined(DK_TIMER_SYSTICK)
#error "the mps family supports timer kind systick only"
#endif

#define SYST_CSR (*(volatile uint32_t *)DK_SYST_CSR)
#define SYST_RVR (*(volatile uint32_t *)DK_SYST_RVR)
#define SYST_CVR (*(volatile uint32_t *)DK_SYST_CVR)
#define SCB_ICSR (*(volatile uint32_t *)DK_SCB_ICSR)

#define SYST_RELOAD 0x00FFFFFFu
#define SYST_PERIOD (SYST_RELOAD + 1u)
#define ICSR_PENDSTSET (1u << 26)

static volatile uint32_t dk_systick_wraps;

void dk_systick_handler(void) { dk_systick_wraps++; }

void dk_timer_init(void) {
  SYST_CSR = 0u;
  SYST_RVR = SYST_RELOAD;
  SYST_CVR = 0u;
  SYST_CSR = 7u; /* ENABLE | TICKINT | CLKSOURCE = processor clock */
}

uint64_t dk_ticks(void) {
  uint32_t wraps, value, pending;
  /* Consistent snapshot: retry if the wrap interrupt ran or became pending meanwhile. A wrap
   * that is pending but not yet taken (interrupts masked) is counted here. */
  for (;;) {
    wraps = dk_systick_wraps;
    pending = SCB_ICSR & ICSR_PENDSTSET;
    value = SYST_CVR;
    if ((SCB_ICSR & ICSR_PENDSTSET) == pending && dk_systick_wraps == wraps) break;
  }
  uint64_t periods = (uint64_t)wraps + (pending ? 1u : 0u);
  return periods * SYST_PERIOD + (SYST_RELOAD - value);
}

uint32_t dk_tick_hz(void) { return DK_TIMER_HZ; }
