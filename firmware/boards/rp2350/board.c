/*
 * board.c: the board API (dk_board.h) for the RP2350 (Raspberry Pi Pico 2) over the pico-sdk.
 *
 * Start-up is the SDK's (crt0, runtime_init); dk_board_init() runs as the first static
 * constructor, before ExecuTorch's, and again harmlessly from main().
 *
 *   console   the SDK's stdio (USB CDC and/or UART, as the board file's `stdio` says), through
 *             the serial link of dk_link.h: every result byte is kept in a RAM transcript and
 *             sent when the host asks for it, so a host that opens the port late loses nothing
 *   timer     the 64-bit microsecond timer (time_us_64), DK_TIMER_HZ = 1 MHz
 *   exit      no semihosting on a board: dk_exit() serves the transcript forever
 *   faults    HardFault, MemManage, BusFault, UsageFault and SecureFault (enabled separately)
 *             are reported as log + fault + done(2) records. They are appended to the
 *             transcript without any I/O (USB cannot run at fault priority); the transcript is
 *             described in watchdog scratch registers 0-3, the chip reboots through the
 *             watchdog, and the next boot serves the saved transcript instead of running main()
 *   link      serviced from a TIMER0 alarm at the lowest interrupt priority every
 *             DK_LINK_SERVICE_MS (board file serial.service_ms), besides the main thread's own
 *             writes: a hung program still answers the host and streams what it sent
 *   watchdog  armed around each execute() for DK_WATCHDOG_EXECUTE_MS (board file
 *             watchdog.execute_ms); the transcript is kept described in the scratch registers
 *             meanwhile, so a hang reboots into serving it followed by a WATCHDOG error
 *   stack     core 0's stack is the board file's `stack` region (SCRATCH_X + SCRATCH_Y), painted
 *             at init; MSPLIM is set to its limit so an overflow faults (CFSR.STKOF)
 *   heap      _sbrk is bounded by the board file's heap_size and records its high-water mark
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "board_config.h"
#include "dk_board.h"
#include "dk_fault_capture.h"
#include "dk_link.h"
#include "dk_protocol.h"
#include "dk_errors.h"
#include "hardware/irq.h"
#include "hardware/timer.h"
#include "hardware/structs/watchdog.h"
#include "hardware/watchdog.h"
#include "pico/stdlib.h"

#if !defined(DK_CONSOLE_PICO_STDIO)
#error "the rp2350 family supports console kind pico-stdio only"
#endif
#if !defined(DK_TIMER_PICO_TIMER)
#error "the rp2350 family supports timer kind pico-timer only"
#endif
_Static_assert(DK_TIMER_HZ == 1000000u, "pico-timer runs at 1 MHz (time_us_64)");
#if !defined(DK_LINK_SERVICE_MS) || !defined(DK_WATCHDOG_EXECUTE_MS)
#error "DK_LINK_SERVICE_MS and DK_WATCHDOG_EXECUTE_MS come from the board file (pico_board.cmake)"
#endif

/* The transcript holds one whole run. The runner's is sized from its model: model_config.h's
 * DK_RESULT_BYTES counts what the run sends (hello, the outputs, timing, memory, done) plus
 * room for an error or a fault report (tools/deploykit/readers/protocol/budget.py). Firmware without
 * a model (the self-test) takes the board file's serial.transcript_bytes. */
#if defined(__has_include)
#if __has_include("model_config.h")
#include "model_config.h"
#endif
#endif
#if defined(DK_RESULT_BYTES)
#define DK_TRANSCRIPT_BYTES DK_RESULT_BYTES
#elif defined(DK_LINK_TRANSCRIPT_BYTES)
#define DK_TRANSCRIPT_BYTES DK_LINK_TRANSCRIPT_BYTES
#else
#error "DK_LINK_TRANSCRIPT_BYTES (the board file's serial.transcript_bytes) is not defined"
#endif

/* Linker symbols (firmware/boards/rp2350/sections.ld). */
extern uint32_t __dk_stack_limit[];
extern uint32_t __dk_stack_top[];
extern uint8_t __dk_heap_start[];
extern uint8_t __dk_heap_end[];

#define REG32(addr) (*(volatile uint32_t *)(addr))
/* Architectural System Control Space registers (Armv8-M), not board facts. */
#define DK_SCB_SHCSR 0xE000ED24u
#define SHCSR_FAULTS_ENA ((1u << 16) | (1u << 17) | (1u << 18) | (1u << 19))
#define DK_STACK_PAINT 0xDEADBEEFu
/* The fault report's own stack: dk_fault_report and the record encoder appending to the
 * transcript (no I/O in fault mode) take 312 B in the mlp_mnist image (scripts/stack-depth). */
#define DK_FAULT_STACK_BYTES 512u

/* Watchdog scratch 0-3 describe a saved transcript (the SDK's watchdog_reboot uses 4-7):
 * 0 the magic (saved by the fault handler, or kept current while execute() is watched),
 * 1 its length, 2 its CRC-32, 3 its address. */
#define DK_SAVED_MAGIC 0xD3F4017Bu
#define DK_WATCHED_MAGIC 0xD3F4A7C8u

/* The transcript lives in .uninitialized_data: not zeroed at start-up, so it survives the
 * watchdog reboot after a fault. */
static uint8_t __uninitialized_ram(dk_transcript)[DK_TRANSCRIPT_BYTES]
    __attribute__((aligned(4)));

/* ---- the serial link's port: the SDK's stdio drivers, raw (no CR/LF translation) ---- */

static size_t dk_port_read(void *buf, size_t len) {
  const int n = stdio_get_until((char *)buf, (int)len, get_absolute_time());
  return n > 0 ? (size_t)n : 0u;
}

static void dk_port_write(const void *buf, size_t len) {
  stdio_put_string((const char *)buf, (int)len, false, false);
  stdio_flush();
}

static uint64_t dk_port_now_us(void) { return time_us_64(); }

/* USB is serviced by stdio_usb's background interrupt; just wait a little. */
static void dk_port_idle(void) { busy_wait_us_32(100u); }

static const dk_link_port_t dk_port = {dk_port_read, dk_port_write, dk_port_now_us, dk_port_idle};

/* ---- init ---- */

static int dk_board_ready;

static void dk_paint_stack(void) {
  uint32_t sp;
  __asm__ volatile("mov %0, sp" : "=r"(sp));
  /* Leave the live part (and a margin for this function's frame) alone. */
  for (volatile uint32_t *p = __dk_stack_limit; (uintptr_t)p + 64u < sp; ++p) *p = DK_STACK_PAINT;
}

/* DK_SAVED_MAGIC (a fault) or DK_WATCHED_MAGIC (the watchdog fired in execute()) when a valid
 * transcript survived the reboot (its length in *used); -1: such a reboot whose transcript did
 * not survive (-2 for a hang); 0: a normal boot. Clears the marker either way. */
static int64_t dk_saved_transcript(size_t *used) {
  const uint32_t magic = watchdog_hw->scratch[0];
  if (!watchdog_caused_reboot() || (magic != DK_SAVED_MAGIC && magic != DK_WATCHED_MAGIC))
    return 0;
  const uint32_t n = watchdog_hw->scratch[1];
  const uint32_t crc = watchdog_hw->scratch[2];
  const uint32_t where = watchdog_hw->scratch[3];
  watchdog_hw->scratch[0] = 0u;
  if (where != (uint32_t)(uintptr_t)dk_transcript || n == 0u || n > sizeof dk_transcript ||
      dk_crc32(0u, dk_transcript, n) != crc)
    return magic == DK_WATCHED_MAGIC ? -2 : -1;
  *used = n;
  return magic;
}

/* ---- the link's service tick: a TIMER0 alarm at the lowest priority ---- */

static uint dk_tick_alarm;

static void dk_link_tick(void) {
  timer_hw->intr = 1u << dk_tick_alarm; /* acknowledge */
  dk_link_service();
  /* Re-armed after the work, from now: a target already passed would fire only at the 32-bit
   * wrap (71 minutes). */
  timer_hw->alarm[dk_tick_alarm] = timer_hw->timerawl + DK_LINK_SERVICE_MS * 1000u;
}

static void dk_link_tick_start(void) {
  dk_tick_alarm = (uint)hardware_alarm_claim_unused(true);
  const uint irq = hardware_alarm_get_irq_num(dk_tick_alarm);
  irq_set_exclusive_handler(irq, dk_link_tick);
  /* Below stdio_usb's own interrupts: they may run inside a tick, never the other way. */
  irq_set_priority(irq, PICO_LOWEST_IRQ_PRIORITY);
  hw_set_bits(&timer_hw->inte, 1u << dk_tick_alarm);
  irq_set_enabled(irq, true);
  timer_hw->alarm[dk_tick_alarm] = timer_hw->timerawl + DK_LINK_SERVICE_MS * 1000u;
}

void dk_board_init(void) {
  if (dk_board_ready) return;
  dk_board_ready = 1;
  dk_paint_stack();
  __asm__ volatile("msr msplim, %0" ::"r"(__dk_stack_limit));
  /* Report MemManage, BusFault, UsageFault and SecureFault as themselves, not as HardFault. */
  REG32(DK_SCB_SHCSR) |= SHCSR_FAULTS_ENA;
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  stdio_init_all();
  size_t saved = 0u;
  const int64_t replay = dk_saved_transcript(&saved);
  dk_link_init(&dk_port, dk_transcript, sizeof dk_transcript, replay > 0 ? saved : 0u);
  if (replay == DK_SAVED_MAGIC) dk_link_serve_forever(); /* faulted: serve its report only */
  if (replay == -1) {
    dk_send_log("fault: the board faulted and rebooted, but the saved report was corrupted");
    dk_send_done(DK_STATUS_FAULT);
    dk_link_serve_forever();
  }
  if (replay == DK_WATCHED_MAGIC || replay == -2) {
    /* The watchdog fired in execute(): the run's records (when they survived), then why. */
    dk_send_error(DK_ERR_WATCHDOG,
                  replay == -2 ? "the watchdog reset the board in execute(); the records "
                                 "before it did not survive"
                               : "the watchdog reset the board in execute()");
    dk_send_done(DK_STATUS_ET_ERROR);
    dk_link_serve_forever();
  }
  dk_link_tick_start();
}

/* Before ExecuTorch's kernel registration and every other constructor. */
__attribute__((constructor(101))) static void dk_board_ctor(void) { dk_board_init(); }

/* ---- console, timer, exit ---- */

#if DK_WATCHDOG_EXECUTE_MS > 0
static volatile int dk_watched; /* inside execute(), with the watchdog armed */

/* Keeps scratch 1-2 describing the transcript while execute() is watched (the CRC grows by the
 * bytes this write stored), so a watchdog reset leaves it recoverable. */
void dk_console_write(const void *data, size_t len) {
  size_t before = 0u, after = 0u;
  const uint8_t *t = dk_link_transcript(&before);
  dk_link_write(data, len);
  if (!dk_watched) return;
  (void)dk_link_transcript(&after);
  watchdog_hw->scratch[2] = dk_crc32(watchdog_hw->scratch[2], t + before, after - before);
  watchdog_hw->scratch[1] = (uint32_t)after;
}

void dk_execute_watch_begin(void) {
  size_t used = 0u;
  const uint8_t *t = dk_link_transcript(&used);
  watchdog_hw->scratch[1] = (uint32_t)used;
  watchdog_hw->scratch[2] = dk_crc32(0u, t, used);
  watchdog_hw->scratch[3] = (uint32_t)(uintptr_t)t;
  watchdog_hw->scratch[0] = DK_WATCHED_MAGIC;
  dk_watched = 1;
  watchdog_enable(DK_WATCHDOG_EXECUTE_MS, true);
}

void dk_execute_watch_end(void) {
  watchdog_disable();
  dk_watched = 0;
  watchdog_hw->scratch[0] = 0u;
}
#else
void dk_console_write(const void *data, size_t len) { dk_link_write(data, len); }
#endif

#if DK_SERVE
/* Serve firmware: the host's frames, which the link hands on (it keeps REQUEST/ACK). */
size_t dk_console_read(void *buf, size_t len) { return dk_link_read(buf, len); }

/* No sleep: the UART console's receiver has no interrupt here, and its FIFO must be read before
 * it fills; dk_console_read polls the link (USB and UART bytes wait in the SDK's buffers). */
void dk_console_wait(void) {}
#else
/* Host input belongs to the serial link (REQUEST/ACK); the firmware gets none. */
size_t dk_console_read(void *buf, size_t len) {
  (void)buf;
  (void)len;
  return 0u;
}
#endif

uint64_t dk_ticks(void) { return time_us_64(); }

uint32_t dk_tick_hz(void) { return DK_TIMER_HZ; }

void dk_exit(int status) {
  (void)status; /* already in the `done` record */
  dk_link_serve_forever();
}

/* ---- stack and heap ---- */

size_t dk_stack_size(void) {
  return (size_t)((uintptr_t)__dk_stack_top - (uintptr_t)__dk_stack_limit);
}

size_t dk_stack_used(void) {
  const volatile uint32_t *p = __dk_stack_limit;
  const uintptr_t top = (uintptr_t)__dk_stack_top;
  while ((uintptr_t)p < top && *p == DK_STACK_PAINT) ++p;
  return (size_t)(top - (uintptr_t)p);
}

static uint8_t *dk_brk;
static size_t dk_brk_max;

/* newlib's heap, bounded by the board file's heap_size (overrides the SDK's weak _sbrk). */
void *_sbrk(int incr) {
  if (dk_brk == NULL) dk_brk = __dk_heap_start;
  uint8_t *prev = dk_brk;
  if ((incr > 0 && (size_t)incr > (size_t)(__dk_heap_end - dk_brk)) ||
      (incr < 0 && (size_t)(-incr) > (size_t)(dk_brk - __dk_heap_start)))
    return (void *)-1;
  dk_brk += incr;
  const size_t used = (size_t)(dk_brk - __dk_heap_start);
  if (used > dk_brk_max) dk_brk_max = used;
  return prev;
}

size_t dk_heap_size(void) { return (size_t)(__dk_heap_end - __dk_heap_start); }

size_t dk_heap_used(void) { return dk_brk_max; }

/* ---- interrupts ---- */

int dk_irq_set_handler(unsigned irq, void (*handler)(void)) {
  if (irq >= NUM_IRQS) return -1;
  if (handler == NULL) {
    irq_set_enabled(irq, false);
    return 0;
  }
  const irq_handler_t current = irq_get_exclusive_handler(irq);
  if ((current != NULL && current != handler) || (current == NULL && irq_has_handler(irq)))
    return -1; /* the SDK (USB, timers) owns it */
  if (current == NULL) irq_set_exclusive_handler(irq, handler);
  irq_set_enabled(irq, true);
  return 0;
}

/* ---- fault report ---- */


static uint32_t dk_fault_stack[DK_FAULT_STACK_BYTES / 4u] __attribute__((aligned(8)));
/* Referenced only from isr_hardfault's assembly: `used` keeps them through an LTO link. */
__attribute__((used)) uint32_t *const dk_fault_stack_top =
    &dk_fault_stack[DK_FAULT_STACK_BYTES / 4u];
static volatile int dk_in_fault;

__attribute__((used)) DK_NORETURN void dk_fault_report(const uint32_t *frame,
                                                        uint32_t exc_return);

/* Every fault vector. Takes the stacked frame from MSP or PSP (EXC_RETURN bit 2), clears
 * MSPLIM, moves to a private stack (the main one may have overflowed) and reports. */
__attribute__((naked, used)) void isr_hardfault(void) {
  __asm__ volatile(
      "tst lr, #4\n\t"
      "ite eq\n\t"
      "mrseq r0, msp\n\t"
      "mrsne r0, psp\n\t"
      "mov r1, lr\n\t"
      "movs r2, #0\n\t"
      "msr msplim, r2\n\t"
      "movw r2, #:lower16:dk_fault_stack_top\n\t"
      "movt r2, #:upper16:dk_fault_stack_top\n\t"
      "ldr r2, [r2]\n\t"
      "mov sp, r2\n\t"
      "b dk_fault_report\n\t");
}
void isr_memmanage(void) __attribute__((alias("isr_hardfault")));
void isr_busfault(void) __attribute__((alias("isr_hardfault")));
void isr_usagefault(void) __attribute__((alias("isr_hardfault")));
void isr_securefault(void) __attribute__((alias("isr_hardfault")));

__attribute__((used)) void dk_fault_report(const uint32_t *frame, uint32_t exc_return) {
  if (dk_in_fault) watchdog_reboot(0u, 0u, 0u); /* a fault while reporting one */
  dk_in_fault = 1;
  dk_fault_regs_t r;
  const uint32_t exc = dk_fault_exception_number();
  const int frame_lost = dk_fault_capture(frame, exc_return, (uintptr_t)__dk_stack_limit,
                                          (uintptr_t)__dk_stack_top, &r);

  size_t used = 0u;
  if (dk_link_transcript(&used) == NULL)
    dk_link_init(&dk_port, dk_transcript, sizeof dk_transcript, 0u); /* fault before init */
  dk_link_enter_fault_mode(); /* from here on: append only, no I/O */
  dk_fault_log_exception(exc);
  if (frame_lost) dk_send_log("fault: main stack overflow; the stacked registers were lost");
  dk_send_fault(&r);
  dk_send_done(DK_STATUS_FAULT);

  const uint8_t *t = dk_link_transcript(&used);
  watchdog_hw->scratch[1] = (uint32_t)used;
  watchdog_hw->scratch[2] = dk_crc32(0u, t, used);
  watchdog_hw->scratch[3] = (uint32_t)(uintptr_t)t;
  watchdog_hw->scratch[0] = DK_SAVED_MAGIC;
  watchdog_reboot(0u, 0u, 0u);
  for (;;) __asm__ volatile("nop");
}
