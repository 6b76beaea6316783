/* vectors.c: the MPS family's vector table, placed by sections.ld in DK_VECTORS. */
#include <stdint.h>

#include "board_config.h"
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

#ifdef DK_NPU_IRQ
_Static_assert(DK_NPU_IRQ < DK_NUM_IRQS, "npu.irq is beyond the vector table (DK_NUM_IRQS)");
void dk_npu_irq_handler(void);
/* The NPU's vector slot (irq_vectors.h) names dk_npu_irq_handler. NPU firmware defines it
 * (firmware/runner/npu_ethos_u.cpp); any other image of the board gets this stand-in, which
 * treats the interrupt like every unexpected one (dk_irq_entry: a registered handler, or a
 * fault report). Naked, so that dk_irq_entry sees the exception's own LR. */
__attribute__((weak, naked)) void dk_npu_irq_handler(void) { __asm__ volatile("b dk_irq_entry"); }
#endif

/* The external interrupt slots, generated from the board file: DK_IRQ_VECTORS. */
#include "irq_vectors.h"

/* NMI, faults and exceptions the firmware never raises all report a fault. Reserved slots are 0.
 * External interrupts go through dk_irq_entry (see dk_irq_set_handler), except those the
 * board file gives a handler of their own (the NPU's, in irq_vectors.h). */
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
    DK_IRQ_VECTORS
};

/* Registered external interrupt handlers, read by dk_irq_entry. */
void (*dk_irq_handlers[DK_NUM_IRQS])(void);

int dk_irq_enable(unsigned irq) {
  if (irq >= DK_NUM_IRQS) return -1;
  volatile uint32_t *iser = (volatile uint32_t *)DK_NVIC_ISER0;
  iser[irq / 32u] = 1u << (irq % 32u);
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  return 0;
}

int dk_irq_set_handler(unsigned irq, void (*handler)(void)) {
  if (irq >= DK_NUM_IRQS) return -1;
  dk_irq_handlers[irq] = handler;
  __asm__ volatile("dsb" ::: "memory");
  if (handler) (void)dk_irq_enable(irq);
  return 0;
}
