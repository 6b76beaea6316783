/* vectors.c: the MPS family's vector table, placed by sections.ld in DK_VECTORS. */
#include <stdint.h>

#include "mps_internal.h"

typedef union {
  void (*handler)(void);
  const void *stack_top;
} dk_vector_t;

extern uint32_t __dk_stack_top[];
void Reset_Handler(void);
void dk_fault_entry(void);
void dk_irq_entry(void);
void dk_systick_handler(void);

#define DK_NUM_SYSTEM_VECTORS 16
#define DK_NUM_VECTORS (DK_NUM_SYSTEM_VECTORS + DK_NUM_IRQS)

/* VTOR needs the table aligned to its size rounded up to a power of two (at least 128). */
#define DK_VECTORS_ALIGN (DK_NUM_VECTORS <= 32 ? 128 : DK_NUM_VECTORS <= 64 ? 256 : \
                          DK_NUM_VECTORS <= 128 ? 512 : 1024)
_Static_assert(DK_NUM_VECTORS <= 256, "DK_NUM_IRQS too large for DK_VECTORS_ALIGN");

/* NMI, faults and exceptions the firmware never raises all report a fault. Reserved slots are 0.
 * External interrupts go through dk_irq_entry (see dk_irq_set_handler). */
__extension__ __attribute__((section(".vectors"), used, aligned(DK_VECTORS_ALIGN)))
const dk_vector_t dk_vectors[DK_NUM_VECTORS] = {
    [0] = {.stack_top = __dk_stack_top},
    [1] = {.handler = Reset_Handler},
    [2] = {.handler = dk_fault_entry},  /* NMI */
    [3] = {.handler = dk_fault_entry},  /* HardFault */
    [4] = {.handler = dk_fault_entry},  /* MemManage */
    [5] = {.handler = dk_fault_entry},  /* BusFault */
    [6] = {.handler = dk_fault_entry},  /* UsageFault */
    [7] = {.handler = dk_fault_entry},  /* SecureFault (Armv8-M with TrustZone) */
    [11] = {.handler = dk_fault_entry}, /* SVCall */
    [12] = {.handler = dk_fault_entry}, /* DebugMonitor */
    [14] = {.handler = dk_fault_entry}, /* PendSV */
    [15] = {.handler = dk_systick_handler},
    [DK_NUM_SYSTEM_VECTORS ... DK_NUM_VECTORS - 1] = {.handler = dk_irq_entry},
};

/* Registered external interrupt handlers, read by dk_irq_entry. */
void (*dk_irq_handlers[DK_NUM_IRQS])(void);

int dk_irq_set_handler(unsigned irq, void (*handler)(void)) {
  if (irq >= DK_NUM_IRQS) return -1;
  dk_irq_handlers[irq] = handler;
  __asm__ volatile("dsb" ::: "memory");
  if (handler) {
    volatile uint32_t *iser = (volatile uint32_t *)DK_NVIC_ISER0;
    iser[irq / 32u] = 1u << (irq % 32u);
  }
  return 0;
}
