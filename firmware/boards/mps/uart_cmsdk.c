/* uart_cmsdk.c: polled console on an Arm CMSDK APB UART (base, clock, baud from board_config.h). */
#include <stddef.h>
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"
#include "mps_internal.h"

#if !defined(DK_CONSOLE_CMSDK_UART)
#error "the mps family supports console kind cmsdk-uart only"
#endif

/* Register word offsets. */
#define UART_DATA 0u
#define UART_STATE 1u /* bit 0: TX buffer full, bit 1: RX buffer full */
#define UART_CTRL 2u  /* bit 0: TX enable, bit 1: RX enable */
#define UART_BAUDDIV 4u

#define UART_STATE_TX_FULL 1u
#define UART_STATE_RX_FULL 2u
#define UART_CTRL_RX_IRQ 8u /* CTRL bit 3: RX interrupt enable */
#define UART_INTCLEAR 3u    /* INTSTATUS (read) / INTCLEAR (write); bit 1: RX */
#define UART_INT_RX 2u

_Static_assert(DK_UART_CLOCK_HZ / DK_UART_BAUD >= 16u,
               "CMSDK UART: BAUDDIV = clock / baud must be at least 16");

static volatile uint32_t *const dk_uart = (volatile uint32_t *)DK_UART_BASE;

void dk_uart_init(void) {
  dk_uart[UART_CTRL] = 0u;
  dk_uart[UART_BAUDDIV] = DK_UART_CLOCK_HZ / DK_UART_BAUD;
  dk_uart[UART_CTRL] = 3u;
}

void dk_console_write(const void *data, size_t len) {
  const uint8_t *p = (const uint8_t *)data;
  while (len--) {
    while (dk_uart[UART_STATE] & UART_STATE_TX_FULL) {
    }
    dk_uart[UART_DATA] = *p++;
  }
}

size_t dk_console_read(void *buf, size_t len) {
  uint8_t *p = (uint8_t *)buf;
  size_t n = 0u;
  while (n < len && (dk_uart[UART_STATE] & UART_STATE_RX_FULL)) p[n++] = (uint8_t)dk_uart[UART_DATA];
  return n;
}

#if DK_SERVE
/* Serve firmware waits here for the host's next byte (dk_board.h). With the receiver's
 * interrupt known (console.rx_irq), the core sleeps in WFI until the interrupt is pending, with
 * PRIMASK set, so nothing runs: the interrupt only wakes the core and is cleared unseen (it is
 * enabled at the UART and the NVIC for the wait only, and has no handler). SysTick is stopped
 * meanwhile, because under QEMU's -icount sleep=off a running timer ends every sleep at once
 * (virtual time jumps to its next wrap), so the core never slept and QEMU's vCPU polled the
 * UART against the main loop that delivers the host's bytes; asleep, the bytes arrive about
 * three times as fast on a busy machine. dk_ticks() does not advance while waiting. Without
 * rx_irq it returns at once (the caller polls). */
void dk_console_wait(void) {
#if defined(DK_UART_RX_IRQ)
  volatile uint32_t *const syst_csr = (volatile uint32_t *)DK_SYST_CSR;
  volatile uint32_t *const nvic = (volatile uint32_t *)DK_NVIC_ISER0; /* ICER +32, ICPR +96 */
  const uint32_t word = DK_UART_RX_IRQ / 32u, bit = 1u << (DK_UART_RX_IRQ % 32u);
  uint32_t primask;
  __asm__ volatile("mrs %0, primask\n\tcpsid i" : "=r"(primask)::"memory");
  const uint32_t csr = *syst_csr;
  *syst_csr = csr & ~1u;
  nvic[word] = bit;
  dk_uart[UART_CTRL] = 3u | UART_CTRL_RX_IRQ;
  if (!(dk_uart[UART_STATE] & UART_STATE_RX_FULL)) __asm__ volatile("wfi" ::: "memory");
  dk_uart[UART_CTRL] = 3u;
  dk_uart[UART_INTCLEAR] = UART_INT_RX;
  nvic[32u + word] = bit;
  nvic[96u + word] = bit;
  *syst_csr = csr;
  __asm__ volatile("dsb\n\tisb\n\tmsr primask, %0" ::"r"(primask) : "memory");
#endif
}
#endif
