/* The example application's services (../bare_metal/app.h) on the pico-sdk: the console is
 * the SDK's stdio (UART0), the exit a halt, the stack is the SDK's. */
#include <stdint.h>
#include <stdio.h>

#include "app.h"
#include "pico/stdlib.h"

void console_init(void) { stdio_init_all(); }

void console_putc(char c) { putchar_raw(c); }

void console_puts(const char *s) {
  while (*s) putchar_raw(*s++);
}

void console_hex(const void *data, uint32_t n) {
  static const char digits[] = "0123456789abcdef";
  const uint8_t *p = (const uint8_t *)data;
  for (uint32_t i = 0; i < n; ++i) {
    putchar_raw(digits[p[i] >> 4]);
    putchar_raw(digits[p[i] & 15u]);
  }
}

void console_dec(uint32_t v) {
  char d[10];
  int n = 0;
  do {
    d[n++] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  while (n) putchar_raw(d[--n]);
}

void app_exit(int status) {
  (void)status;
  for (;;) tight_loop_contents();
}

uint32_t app_stack_used(void) { return 0u; }  /* not measured on the Pico */
