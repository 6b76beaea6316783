/*
 * startup.S: reset handler and fault entry for the MPS family (Armv7-M / Armv8-M Mainline).
 *
 * Reset_Handler: sets SP and the stack limit, enables the FPU/MVE (CPACR) when built with one,
 * points VTOR at dk_vectors, copies .data (which also holds .got) from its load address, zeroes
 * .bss, paints the whole stack with DK_STACK_PAINT, then calls dk_board_init(), the static
 * constructors (__libc_init_array), main() and dk_exit(main's result).
 *
 * dk_fault_entry: every fault and unexpected exception. It captures the stacked frame pointer
 * and EXC_RETURN, moves to a private fault stack (the main one may have overflowed) and
 * branches to dk_fault_report(frame, exc_return), which never returns. One fault is absorbed
 * instead: a bus fault of dk_probe_read32's load (a device that may be absent, the NPU), which
 * resumes at dk_probe_fault and makes dk_probe_read32 return -1.
 *
 * Every symbol used in the vector table is `.type %function` so that its address carries the
 * Thumb bit; without it the core locks up instead of taking the exception.
 */
#include "mps_internal.h"

    .syntax unified
    .thumb

    .section .text.Reset_Handler, "ax", %progbits
    .global Reset_Handler
    .type Reset_Handler, %function
    .thumb_func
Reset_Handler:
    ldr     r0, =__dk_stack_top
    mov     sp, r0
#if DK_HAS_STACK_LIMIT
    ldr     r0, =__dk_stack_limit
    msr     msplim, r0
#endif

#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
    /* CPACR: full access to CP10 and CP11 (FPU and MVE). Before any FP instruction. */
    ldr     r0, =DK_SCB_CPACR
    ldr     r1, [r0]
    orr     r1, r1, #(0xF << 20)
    str     r1, [r0]
    dsb
    isb
#endif

    ldr     r0, =DK_SCB_VTOR
    ldr     r1, =dk_vectors
    str     r1, [r0]
    dsb
    isb

    /* .data (and .got): copy from its load address in DK_CODE. */
    ldr     r0, =__dk_data_load
    ldr     r1, =__dk_data_start
    ldr     r2, =__dk_data_end
    cmp     r0, r1
    beq     2f
1:  cmp     r1, r2
    bhs     2f
    ldr     r3, [r0], #4
    str     r3, [r1], #4
    b       1b
2:
    /* .bss: zero. */
    ldr     r1, =__dk_bss_start
    ldr     r2, =__dk_bss_end
    movs    r3, #0
3:  cmp     r1, r2
    bhs     4f
    str     r3, [r1], #4
    b       3b
4:
    /* Paint the whole stack (nothing has been pushed yet) for the high-water measurement. */
    ldr     r1, =__dk_stack_limit
    mov     r2, sp
    ldr     r3, =DK_STACK_PAINT
5:  cmp     r1, r2
    bhs     6f
    str     r3, [r1], #4
    b       5b
6:
    bl      dk_board_init
    bl      __libc_init_array
    bl      main
    bl      dk_exit
    .pool
    .size Reset_Handler, . - Reset_Handler

    .section .text.dk_fault_entry, "ax", %progbits
    .global dk_fault_entry
    .type dk_fault_entry, %function
    .thumb_func
dk_fault_entry:
    mov     r1, lr                  /* EXC_RETURN */
    tst     r1, #4                  /* bit 2: frame on PSP (1) or MSP (0) */
    ite     eq
    mrseq   r0, msp
    mrsne   r0, psp
    /* The faulting instruction dk_probe_read32's load? Then resume at dk_probe_fault: rewrite
     * the stacked PC (offset 24 in every frame format), clear the fault status (CFSR and HFSR
     * are write-one-to-clear) and return from the exception. */
    ldr     r2, [r0, #24]
    ldr     r3, =dk_probe_load
    bic     r3, r3, #1
    cmp     r2, r3
    bne     1f
    ldr     r3, =dk_probe_fault
    bic     r3, r3, #1
    str     r3, [r0, #24]
    ldr     r2, =DK_SCB_CFSR
    ldr     r3, [r2]
    str     r3, [r2]
    ldr     r2, =DK_SCB_HFSR
    ldr     r3, [r2]
    str     r3, [r2]
    dsb
    bx      lr
1:
#if DK_HAS_STACK_LIMIT
    movs    r2, #0
    msr     msplim, r2
#endif
    ldr     r2, =dk_fault_stack_top
    msr     msp, r2
    isb
    b       dk_fault_report
    .pool
    .size dk_fault_entry, . - dk_fault_entry

    /* External interrupts: tail-call the handler registered with dk_irq_set_handler() (LR still
     * holds EXC_RETURN, so the handler's return ends the exception); none registered: fault. */
    .section .text.dk_irq_entry, "ax", %progbits
    .global dk_irq_entry
    .type dk_irq_entry, %function
    .thumb_func
dk_irq_entry:
    mrs     r0, ipsr
    subs    r0, r0, #16
    cmp     r0, #DK_NUM_IRQS
    bhs     1f
    ldr     r1, =dk_irq_handlers
    ldr     r1, [r1, r0, lsl #2]
    cmp     r1, #0
    beq     1f
    bx      r1
1:  b       dk_fault_entry
    .pool
    .size dk_irq_entry, . - dk_irq_entry

    /* int dk_probe_read32(uintptr_t addr, uint32_t *value) (dk_board.h): 0 and *value, or -1
     * when the load at dk_probe_load faults (dk_fault_entry resumes at dk_probe_fault). */
    .section .text.dk_probe_read32, "ax", %progbits
    .global dk_probe_read32
    .type dk_probe_read32, %function
    .thumb_func
dk_probe_read32:
dk_probe_load:
    ldr     r2, [r0]
    dsb
    str     r2, [r1]
    movs    r0, #0
    bx      lr
dk_probe_fault:
    movs    r0, #0
    subs    r0, r0, #1
    bx      lr
    .size dk_probe_read32, . - dk_probe_read32

    .section .bss.dk_fault_stack, "aw", %nobits
    .balign 8
dk_fault_stack:
    .space  DK_FAULT_STACK_BYTES
dk_fault_stack_top:
