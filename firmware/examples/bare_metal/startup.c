/* The application's start-up: vector table, reset handler (FPU on, .data copied, .bss zeroed,
 * the stack painted to measure its high-water mark), semihosting exit. It runs no C++
 * constructors: the deploykit component needs none. With APP_NPU (a component with Ethos-U
 * models) the vector table also holds the NPU's interrupt, and app_npu_start() brings the NPU
 * up. */
#include <stdint.h>

#include "app.h"
#if APP_NPU
#include "deploykit.h" /* DK_NPU_BASE, DK_NPU_IRQ, ...: the board file's, dk_npu_init() */
#endif

extern uint32_t __data_start[], __data_end[], __data_load[], __bss_start[], __bss_end[];
extern uint32_t __stack_limit[], __stack_top[];

int main(void);
void Reset_Handler(void);
void Fault_Handler(void);

#define STACK_PAINT 0xC0FFEE11u

#if APP_NPU
#define APP_VECTORS (16 + DK_NPU_IRQ + 1)
#else
#define APP_VECTORS 16
#endif

__attribute__((section(".vectors"), used)) const void *const app_vectors[APP_VECTORS] = {
    __stack_top,  Reset_Handler, Fault_Handler, Fault_Handler, Fault_Handler, Fault_Handler,
    Fault_Handler, 0, 0, 0, 0, Fault_Handler, Fault_Handler, 0, Fault_Handler, Fault_Handler,
#if APP_NPU
    /* The NPU's interrupt: the component's handler, straight in its slot. */
    [16 + DK_NPU_IRQ] = dk_npu_irq_handler,
#endif
};

#if APP_NPU
int app_npu_start(void) {
  /* Enable the NPU's IRQ in the NVIC (ISER: 0xE000E100), then initialise the driver with the
   * board file's base address (the alias of the security state this code runs in) and
   * settings. */
  volatile uint32_t *const nvic_iser = (volatile uint32_t *)0xE000E100u;
  nvic_iser[DK_NPU_IRQ / 32] = 1u << (DK_NPU_IRQ % 32);
  return dk_npu_init((void *)DK_NPU_BASE, DK_NPU_SECURE_ENABLE, DK_NPU_PRIVILEGE_ENABLE);
}
#endif

void app_exit(int status) {
  /* SYS_EXIT_EXTENDED (0x20), ADP_Stopped_ApplicationExit: QEMU exits with `status`. */
  volatile uint32_t block[2] = {0x20026u, (uint32_t)status};
  register uint32_t r0 __asm__("r0") = 0x20u;
  register volatile uint32_t *r1 __asm__("r1") = block;
  __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  for (;;) {
  }
}

uint32_t app_stack_used(void) {
  const uint32_t *p = __stack_limit;
  while (p < __stack_top && *p == STACK_PAINT) ++p;
  return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
}

void Fault_Handler(void) {
  console_puts("fault\n");
  app_exit(2);
}

void Reset_Handler(void) {
  /* CP10 and CP11 full access: the FPU (and MVE on the Cortex-M55). */
  volatile uint32_t *const cpacr = (volatile uint32_t *)0xE000ED88u;
  *cpacr |= 0xFu << 20;
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  for (uint32_t *s = __data_load, *d = __data_start; d < __data_end;) *d++ = *s++;
  for (uint32_t *d = __bss_start; d < __bss_end;) *d++ = 0u;
  /* Paint the stack below the current frame. */
  uint32_t *sp;
  __asm__ volatile("mov %0, sp" : "=r"(sp));
  for (uint32_t *p = __stack_limit; p < sp - 16; ++p) *p = STACK_PAINT;
  app_exit(main());
}
