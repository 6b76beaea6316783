/* A polled CMSDK APB UART (the MPS2/MPS3 boards' console) at APP_UART_BASE. */
#include <stdint.h>

#include "app.h"

#define UART ((volatile uint32_t *)APP_UART_BASE)

void console_init(void) {
  UART[2] = 0u;  /* CTRL */
  UART[4] = APP_UART_BAUDDIV;
  UART[2] = 1u;  /* TX enable */
}

void console_putc(char c) {
  while (UART[1] & 1u) {  /* STATE: TX buffer full */
  }
  UART[0] = (uint32_t)(uint8_t)c;
}

void console_puts(const char *s) {
  while (*s) console_putc(*s++);
}

void console_hex(const void *data, uint32_t n) {
  static const char digits[] = "0123456789abcdef";
  const uint8_t *p = (const uint8_t *)data;
  for (uint32_t i = 0; i < n; ++i) {
    console_putc(digits[p[i] >> 4]);
    console_putc(digits[p[i] & 15u]);
  }
}

void console_dec(uint32_t v) {
  char d[10];
  int n = 0;
  do {
    d[n++] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  while (n) console_putc(d[--n]);
}
