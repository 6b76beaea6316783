/* mps_internal.h: definitions shared by the MPS family's C and assembly sources (no C code). */
#ifndef DK_MPS_INTERNAL_H
#define DK_MPS_INTERNAL_H

/* Word written over the whole stack at reset; dk_stack_used() finds the deepest overwritten one. */
#define DK_STACK_PAINT 0xDEADBEEF

/* Stack the fault handler switches to, so a fault caused by a stack overflow can still report. */
#define DK_FAULT_STACK_BYTES 1024

/* External interrupt lines in the vector table (the SSE-200/SSE-300 images use fewer than 96). */
#ifndef DK_NUM_IRQS
#define DK_NUM_IRQS 96
#endif

/* Armv8-M Mainline (Cortex-M33, M55, M85) has a stack limit register (MSPLIM). */
#if defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8_1M_MAIN__)
#define DK_HAS_STACK_LIMIT 1
#else
#define DK_HAS_STACK_LIMIT 0
#endif

/* Architectural System Control Space registers (Armv7-M / Armv8-M), not board facts. */
#define DK_SCB_ICSR 0xE000ED04
#define DK_SCB_VTOR 0xE000ED08
#define DK_SCB_SHCSR 0xE000ED24
#define DK_SCB_CPACR 0xE000ED88
#define DK_SYST_CSR 0xE000E010
#define DK_SYST_RVR 0xE000E014
#define DK_SYST_CVR 0xE000E018
#define DK_NVIC_ISER0 0xE000E100
#define DK_SCB_CCR 0xE000ED14
#define DK_SCB_CFSR 0xE000ED28
#define DK_SCB_HFSR 0xE000ED2C
#define DK_SCB_CCSIDR 0xE000ED80
#define DK_SCB_CSSELR 0xE000ED84
/* Cache maintenance (Armv7-M / Armv8-M with caches). */
#define DK_SCB_ICIALLU 0xE000EF50
#define DK_SCB_DCISW 0xE000EF60
#define DK_SCB_DCCMVAC 0xE000EF68
#define DK_SCB_DCCIMVAC 0xE000EF70
#define DK_CCR_DC (1u << 16)
#define DK_CCR_IC (1u << 17)

#endif /* DK_MPS_INTERNAL_H */
