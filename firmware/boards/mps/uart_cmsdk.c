/* uart_cmsdk.c: polled console on an Arm CMSDK APB UART (base, clock, baud from board_config.h). */
#include <stddef.h>
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"

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
