/*
 * dk_board.h: the board API every board family (firmware/boards/<family>/) implements.
 *
 * The firmware (selftest, ExecuTorch runner) talks to the hardware only through this header.
 * Board facts (addresses, clocks, sizes) come from the generated board_config.h and memory.ld;
 * nothing here depends on a particular board. Usable from C11 and C++17.
 *
 * Start-up contract: the family's reset handler enables the FPU (when built with one), copies
 * .data, zeroes .bss, paints the stack, calls dk_board_init(), runs the static constructors
 * and then main(). When main() returns, its value goes to dk_exit().
 */
#ifndef DK_BOARD_H
#define DK_BOARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DK_NORETURN __attribute__((noreturn))
#else
#define DK_NORETURN
#endif

/* Console, timer and fault reporting. Called by the reset handler before main(); calling it
 * again is harmless. */
void dk_board_init(void);

/* Blocking write of `len` bytes to the console (the UART the host reads). */
void dk_console_write(const void *data, size_t len);

/* Non-blocking read: copies at most `len` bytes already received, returns how many (0 when
 * nothing is waiting or the board has no console input). */
size_t dk_console_read(void *buf, size_t len);

/* Serve firmware (DK_SERVE): waits until console input may have arrived, after dk_console_read
 * returned nothing; it may return early (any interrupt), and returns at once on a board that
 * cannot wait for input. On the mps family with the receiver's interrupt in the board file
 * (console.rx_irq) the core sleeps in WFI, and the tick counter does not advance meanwhile. */
void dk_console_wait(void);

/* Monotonic 64-bit tick counter since dk_board_init(), at dk_tick_hz() ticks per second. */
uint64_t dk_ticks(void);
uint32_t dk_tick_hz(void);

/* Ends the program with `status`. On simulators the exit status becomes the simulator's exit
 * code (semihosting SYS_EXIT_EXTENDED); on hardware the board parks the core. */
DK_NORETURN void dk_exit(int status);

/* Stack high-water mark (bytes touched since reset; the stack is painted at reset) and the
 * stack size linked into the firmware. */
size_t dk_stack_used(void);
size_t dk_stack_size(void);

/* Heap high-water mark (bytes handed out by _sbrk) and the heap size linked in. */
size_t dk_heap_used(void);
size_t dk_heap_size(void);

/* Optional: route external interrupt `irq` to `handler` and enable it in the interrupt
 * controller. Returns 0, or -1 when `irq` is out of range or the board has no support.
 * An interrupt that fires without a handler is reported as a fault. */
int dk_irq_set_handler(unsigned irq, void (*handler)(void));

/* Optional: enable external interrupt `irq` in the interrupt controller, for an interrupt whose
 * vector slot the generated vector table fills directly (the NPU's, irq_vectors.h). Returns 0,
 * or -1 when `irq` is out of range or the board has no support. */
int dk_irq_enable(unsigned irq);

/* Optional (families with devices that may be absent, e.g. an NPU): read the 32-bit register at
 * `addr` and return 0, or return -1 when the read raises a bus fault (nothing answers there),
 * leaving *value untouched. The fault is absorbed, not reported. */
int dk_probe_read32(uintptr_t addr, uint32_t *value);

/* Optional (families whose cores have a data cache): cache maintenance for memory that another
 * bus master (an NPU, a DMA) reads or writes. clean: write the dirty lines of [addr, addr+size)
 * to memory, so the other master reads what the CPU wrote; clean_invalidate: also drop the
 * lines, so the CPU's next read fetches what the other master wrote. Whole lines are affected
 * (the range is widened to line boundaries). No-ops while the data cache is off. */
void dk_dcache_clean(const void *addr, size_t size);
void dk_dcache_clean_invalidate(const void *addr, size_t size);

/* Families with a watchdog around execute() (DK_WATCHDOG_EXECUTE_MS > 0, from the board file's
 * watchdog.execute_ms): the runner arms it before each execute() and disarms it after. A hang
 * in between reboots the board, which then serves the run's records and a WATCHDOG error. */
#if defined(DK_WATCHDOG_EXECUTE_MS) && DK_WATCHDOG_EXECUTE_MS > 0
void dk_execute_watch_begin(void);
void dk_execute_watch_end(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* DK_BOARD_H */
