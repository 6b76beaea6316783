/*
 * dk_ethos_u.cpp: the Ethos-U NPU in a library component (DK_ETHOS_U=1: ethos_u_int8 models on
 * a board with an npu section; firmware/library/ethos_u.cmake). ExecuTorch's EthosUBackend runs
 * each delegate's command stream through Arm's Ethos-U core driver; this file is what the
 * driver and the backend leave to the platform, without deploykit's board support (the
 * application owns the vector table, the interrupts and the start-up code):
 *
 * - dk_npu_init(base, secure_enable, privilege_enable): the application's call, with the NPU's
 *   address in the security state it runs in. Checks that an Ethos-U of the built type answers
 *   there (its ID and CONFIG registers: an absent NPU is DK_ERR_NO_NPU, never a hang; the
 *   driver's own check passes a U55 build on a device that reads 0), then ethosu_init() with the
 *   memory mode's fast arena. It does not touch the interrupt controller.
 * - dk_npu_irq_handler(): the application calls it from the NPU's vector slot.
 * - The driver's cache hooks, ethosu_flush_dcache / ethosu_invalidate_dcache (why each, below),
 *   through the architectural cache maintenance registers; no-ops while the data cache is off.
 * - The driver's semaphores, static instead of malloc'ed.
 * - ethosu_fast_scratch / ethosu_fast_scratch_size: the fast arena of a Dedicated_Sram_* memory
 *   mode, in section .bss.dk_npu_fast (EthosUBackend's weak defaults are null and 0).
 *
 * The delegates' handles (EthosUBackend::init's new (std::nothrow)) come from the pool of the
 * component's lean C library (firmware/runner/lean_libc.cpp, DK_LEAN_LIBC_HANDLE_POOL). No
 * address, IRQ number or size is written here: they come from the rendered deploykit.h (the
 * board file's npu section, the memory plan) or from the application.
 */
#include <stddef.h>
#include <stdint.h>

#include <ethosu_driver.h>

#include "deploykit.h"

#if !defined(DK_NPU_BASE) || !defined(DK_NPU_FAST_SCRATCH_SIZE)
#error "DK_ETHOS_U=1 but deploykit.h has no NPU section (a component of CPU-only models)"
#endif
#if defined(ETHOSU85) != defined(DK_NPU_ETHOS_U85) || defined(ETHOSU55) != defined(DK_NPU_ETHOS_U55)
#error "The Ethos-U driver was built for another NPU type than the board's (DK_ETHOS_U_NPU_CONFIG)"
#endif

namespace {

// The NPU's ID register (offset 0x0) holds the architecture version in bits 31:28: 1 for the
// Ethos-U55 (and U65), 2 for the Ethos-U85. CONFIG (offset 0x28) holds the product in bits
// 31:28: 0 U55, 1 U65, 2 U85. (As the runner checks them: firmware/runner/npu_ethos_u.cpp.)
constexpr uintptr_t kIdOffset = 0x0u;
constexpr uintptr_t kConfigOffset = 0x28u;
#if defined(ETHOSU85)
constexpr uint32_t kArchMajor = 2u;
constexpr uint32_t kProduct = 2u;
#else
constexpr uint32_t kArchMajor = 1u;
constexpr uint32_t kProduct = 0u;
#endif

ethosu_driver npu_driver;
bool npu_ready;

#if DK_NPU_FAST_SCRATCH_SIZE > 0
// The memory mode's fast arena (Dedicated_Sram_<N>KB: N KiB of SRAM behind the NPU's AXI0 port
// that the NPU uses as a cache of the scratch). Only the NPU reads and writes it.
__attribute__((section(".bss.dk_npu_fast"), aligned(32))) uint8_t fast_arena[DK_NPU_FAST_SCRATCH_SIZE];
#define DK_FAST_ARENA fast_arena
#else
#define DK_FAST_ARENA nullptr
#endif

uint32_t read32(uintptr_t address) { return *reinterpret_cast<volatile const uint32_t *>(address); }

// ---- data cache maintenance by address (Armv8-M System Control Block) ----
constexpr uintptr_t kScbCcr = 0xE000ED14u;
constexpr uintptr_t kScbCcsidr = 0xE000ED80u;
constexpr uintptr_t kScbCsselr = 0xE000ED84u;
constexpr uintptr_t kScbDccmvac = 0xE000EF68u;   // clean by address to the point of coherency
constexpr uintptr_t kScbDccimvac = 0xE000EF70u;  // clean and invalidate, the same
constexpr uint32_t kCcrDc = 1u << 16;

volatile uint32_t &reg(uintptr_t address) { return *reinterpret_cast<volatile uint32_t *>(address); }

void barrier() { __asm__ volatile("dsb\n\tisb" ::: "memory"); }

// One line at a time over [addr, addr + size), widened to whole lines (CCSIDR's line size, 32 B
// on the Cortex-M55/M85). Nothing while CCR.DC is off (the cache is off, or there is none).
void dcache_by_address(uintptr_t op, uint64_t addr, size_t size) {
  if (size == 0u || !(reg(kScbCcr) & kCcrDc)) return;
  reg(kScbCsselr) = 0u;  // level 1 data cache
  barrier();
  const uintptr_t line = uintptr_t{1} << ((reg(kScbCcsidr) & 7u) + 4u);
  uintptr_t p = static_cast<uintptr_t>(addr) & ~(line - 1u);
  const uintptr_t end = static_cast<uintptr_t>(addr) + size;
  __asm__ volatile("dsb" ::: "memory");
  for (; p < end; p += line) reg(op) = static_cast<uint32_t>(p);
  barrier();
}

// The driver's base addresses, as EthosUBackend (EthosUBackend_Cortex_M.cpp) passes them:
// [0] the delegate's weights and constants (inside the model's program, which the CPU never
// writes: no dirty line, nothing the NPU changed), [1] the scratch (the temp-pool block of
// .bss.dk_npu_scratch.<model>: inputs, intermediates, outputs), [2] the fast arena (the NPU's
// alone). Only the scratch is maintained (a multi-megabyte program line by line would cost
// more than the NPU's run).
constexpr int kScratchBase = 1;

// ---- the driver's semaphores: static, no malloc ----
struct Semaphore {
  volatile uint32_t count;
};
Semaphore semaphores[2];  // the driver's global one and the one of the single driver
uint32_t semaphores_used;

}  // namespace

extern "C" {

#if DK_NPU_FAST_SCRATCH_SIZE > 0
unsigned char *ethosu_fast_scratch = fast_arena;
size_t ethosu_fast_scratch_size = DK_NPU_FAST_SCRATCH_SIZE;
#endif

int dk_npu_init(void *npu_base, int secure_enable, int privilege_enable) {
  if (npu_ready) return DK_OK;  // once: the driver is registered and the NPU in use
  const uintptr_t base = reinterpret_cast<uintptr_t>(npu_base);
  if (base == 0u || (read32(base + kIdOffset) >> 28) != kArchMajor ||
      (read32(base + kConfigOffset) >> 28) != kProduct)
    return DK_ERR_NO_NPU;
  if (ethosu_init(&npu_driver, npu_base, DK_FAST_ARENA, DK_NPU_FAST_SCRATCH_SIZE,
                  secure_enable ? 1u : 0u, privilege_enable ? 1u : 0u) != 0)
    return DK_ERR_NPU_INIT;
  npu_ready = true;
  return DK_OK;
}

void dk_npu_irq_handler(void) { ethosu_irq_handler(&npu_driver); }

// dk_<model>_run() of a model with Ethos-U delegates asks this first: without a driver,
// ethosu_reserve_driver() would wait on a semaphore that does not exist.
int dk_lib_npu_ready(void) { return npu_ready ? 1 : 0; }

// Before the NPU starts: EthosUBackend has just copied the inputs into the scratch, and those
// bytes may still sit in dirty cache lines the NPU cannot see. Cleaning writes them to memory.
void ethosu_flush_dcache(const uint64_t *base_addr, const size_t *base_addr_size,
                         int num_base_addr) {
  if (num_base_addr > kScratchBase)
    dcache_by_address(kScbDccmvac, base_addr[kScratchBase], base_addr_size[kScratchBase]);
}

// After the NPU finished: it wrote the outputs into the scratch, but the CPU may hold older
// copies of those lines (from writing the inputs, or read speculatively meanwhile) and would
// read them instead. Clean-and-invalidate drops them (cleaning first, so that a CPU write in a
// line shared at the range's edge is kept; the scratch block starts on a 32-byte line).
void ethosu_invalidate_dcache(const uint64_t *base_addr, const size_t *base_addr_size,
                              int num_base_addr) {
  if (num_base_addr > kScratchBase)
    dcache_by_address(kScbDccimvac, base_addr[kScratchBase], base_addr_size[kScratchBase]);
}

void *ethosu_semaphore_create(void) {
  if (semaphores_used >= sizeof semaphores / sizeof semaphores[0]) return nullptr;
  Semaphore *s = &semaphores[semaphores_used++];
  s->count = 0u;
  return s;
}

void ethosu_semaphore_destroy(void *) {}

// Sleeps in WFE until the NPU's interrupt gives the semaphore (dk_npu_irq_handler ->
// ethosu_irq_handler, which also sends an event). The component has no clock, so the driver's
// timeout is not applied: an interrupt that never arrives (not wired, not enabled) never
// returns (deploykit.h says so).
int ethosu_semaphore_take(void *sem, uint64_t) {
  Semaphore *s = static_cast<Semaphore *>(sem);
  for (;;) {
    uint32_t count = s->count;
    while (count != 0u) {
      if (__atomic_compare_exchange_n(&s->count, &count, count - 1u, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE))
        return 0;
    }
    __asm__ volatile("wfe" ::: "memory");
  }
}

int ethosu_semaphore_give(void *sem) {
  Semaphore *s = static_cast<Semaphore *>(sem);
  __atomic_fetch_add(&s->count, 1u, __ATOMIC_RELEASE);
  __asm__ volatile("dsb\n\tsev" ::: "memory");
  return 0;
}

}  // extern "C"
