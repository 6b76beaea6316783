/*
 * npu_ethos_u.cpp: the Ethos-U NPU in the runner firmware (DK_ETHOS_U=1: an ethos_u_int8 model on
 * a board with an npu section). ExecuTorch's EthosUBackend (linked from the cached runtime,
 * cmake/executorch-runtime/ethos_u.cmake) runs each delegate's command stream through Arm's
 * Ethos-U core driver; this file is everything the driver and the backend leave to the platform:
 *
 * - dk_npu_init(): checks that an Ethos-U of the built type answers at the board's NPU address
 *   (its ID and CONFIG registers, read with dk_probe_read32, so an absent device is a clear error
 *   record, never a hang or a silent success), then ethosu_init() with the board file's secure
 *   and privilege settings and the memory mode's fast arena, and enables the NPU's interrupt.
 * - dk_npu_irq_handler(): the NPU's vector (irq_vectors.h puts it in the board's npu.irq slot).
 * - The driver's cache hooks, ethosu_flush_dcache / ethosu_invalidate_dcache (why each, below).
 * - The driver's semaphore hooks without malloc, with a timeout: an NPU that never interrupts
 *   ends the run with an error record instead of a hang.
 * - Timing: EthosUBackend_execute_begin/end (the backend's hooks around each delegate call) and
 *   ethosu_inference_begin/end (the driver's, around the command stream) collect each call's
 *   CPU ticks, NPU cycle count and PMU counters; dk_npu_send_records() reports them as `npu`
 *   records (docs/protocol.md).
 * - ethosu_fast_scratch / ethosu_fast_scratch_size: the fast arena (section .dk_npu_fast, placed
 *   by the linker script in the SRAM behind the NPU's AXI0 port) for Dedicated_Sram_* modes.
 * - operator new(size_t, nothrow_t): EthosUBackend::init allocates one small handle per delegate
 *   with it; a fixed arena serves them, so the firmware keeps no heap allocator.
 *
 * No address, IRQ number or size is written here: they come from the generated board_config.h
 * (the board file's npu section) and model_config.h (the memory plan).
 */
#include <new>
#include <stddef.h>
#include <stdint.h>

#include <ethosu_driver.h>
#include <pmu_ethosu.h>

#include "board_config.h"
#include "dk_board.h"
#include "dk_protocol.h"
#include "model_config.h"
#include "npu.h"
#include "dk_errors.h"
#include "text.h"

#if !defined(DK_NPU_BASE) || !defined(DK_NPU_IRQ)
#error "DK_ETHOS_U=1 for a board without an npu section (board_config.h has no DK_NPU_BASE)"
#endif
#if defined(ETHOSU85) != defined(DK_NPU_ETHOS_U85) || defined(ETHOSU55) != defined(DK_NPU_ETHOS_U55)
#error "The Ethos-U driver was built for another NPU type than the board's (DK_ETHOS_U_NPU_CONFIG)"
#endif

extern "C" {
extern uint8_t __dk_model_start[];
extern uint8_t __dk_model_end[];
extern uint8_t __dk_npu_fast_start[];
extern uint8_t __dk_npu_fast_end[];
}

namespace {

// The NPU's ID register (offset 0x0) holds the architecture version in bits 31:28: 1 for the
// Ethos-U55 (and U65), 2 for the Ethos-U85. CONFIG (offset 0x28) holds the product in bits
// 31:28: 0 U55, 1 U65, 2 U85. Nothing else answers with these; an absent NPU reads 0 (QEMU's
// mps3-an547 leaves the address unimplemented) or raises a bus fault.
constexpr uintptr_t kIdOffset = 0x0u;
constexpr uintptr_t kConfigOffset = 0x28u;
#if defined(ETHOSU85)
constexpr uint32_t kArchMajor = 2u;
constexpr uint32_t kProduct = 2u;
constexpr const char *kNpuName = "Ethos-U85";
#else
constexpr uint32_t kArchMajor = 1u;
constexpr uint32_t kProduct = 0u;
constexpr const char *kNpuName = "Ethos-U55";
#endif
// How long a command stream may run before the run is declared failed: milliseconds of
// dk_ticks(). The driver is built with it as ETHOSU_INFERENCE_TIMEOUT (ethos_u.cmake), the
// timeout it passes to ethosu_semaphore_take() below, which counts in milliseconds.
#define DK_STR2(x) #x
#define DK_STR(x) DK_STR2(x)
static_assert(DK_NPU_INFERENCE_TIMEOUT_MS > 0, "DK_NPU_INFERENCE_TIMEOUT_MS must be positive");

ethosu_driver npu_driver;

#if DK_NPU_FAST_SCRATCH_SIZE > 0
// The memory mode's fast arena (Dedicated_Sram_<N>KB: N KiB of SRAM the NPU uses as a cache of
// the scratch). Only the NPU reads and writes it.
__attribute__((section(".dk_npu_fast"), aligned(32))) uint8_t fast_arena[DK_NPU_FAST_SCRATCH_SIZE];
#define DK_FAST_ARENA fast_arena
#else
#define DK_FAST_ARENA nullptr
#endif

// Error and log texts are one record each, short.
using Line = TextLine<200>;

uint32_t report(uint32_t code, const Line &line) {
  dk_send_error(code, line.c_str());
  return code;
}

// ---- per-call timing and PMU counters ----
#if defined(ETHOSU85)
// Ethos-U85: SRAM (AXI0) and external (AXI1) data beats, idle and MAC-active cycles.
constexpr ethosu_pmu_event_type kEvents[] = {
    ETHOSU_PMU_SRAM_RD_DATA_BEAT_RECEIVED, ETHOSU_PMU_SRAM_WR_DATA_BEAT_WRITTEN,
    ETHOSU_PMU_EXT_RD_DATA_BEAT_RECEIVED,  ETHOSU_PMU_EXT_WR_DATA_BEAT_WRITTEN,
    ETHOSU_PMU_NPU_IDLE,                   ETHOSU_PMU_MAC_ACTIVE};
constexpr const char *kEventNames[] = {"sram_rd_beats", "sram_wr_beats", "ext_rd_beats",
                                       "ext_wr_beats",  "idle_cycles",   "mac_active_cycles"};
#else
// Ethos-U55: AXI0 (SRAM) read and write beats, AXI1 (external) read beats, idle cycles.
constexpr ethosu_pmu_event_type kEvents[] = {
    ETHOSU_PMU_AXI0_RD_DATA_BEAT_RECEIVED, ETHOSU_PMU_AXI0_WR_DATA_BEAT_WRITTEN,
    ETHOSU_PMU_AXI1_RD_DATA_BEAT_RECEIVED, ETHOSU_PMU_NPU_IDLE};
constexpr const char *kEventNames[] = {"axi0_rd_beats", "axi0_wr_beats", "axi1_rd_beats",
                                       "idle_cycles"};
#endif
constexpr size_t kNumEvents = sizeof kEvents / sizeof kEvents[0];
static_assert(kNumEvents <= ETHOSU_PMU_NCOUNTERS, "more PMU events than counters");
static_assert(sizeof kEventNames / sizeof kEventNames[0] == kNumEvents, "one name per event");

struct CallStats {
  uint64_t npu_cycles;
  uint64_t ticks;
  uint32_t counters[kNumEvents];
};
// Calls beyond this many are counted, not itemised (every input set runs every delegate).
constexpr uint32_t kMaxCalls = 64u;
CallStats calls[kMaxCalls];
uint32_t num_calls;
uint64_t call_start;
volatile int in_delegate;
const char *failure = "";

// ---- semaphores without malloc (the driver's default allocates them) ----
struct Semaphore {
  volatile uint32_t count;
};
Semaphore semaphores[2];  // the driver's global one and the one of our single driver
uint32_t semaphores_used;

// ---- the delegates' handles (EthosUBackend::init: new (std::nothrow) ExecutionHandle) ----
constexpr size_t kHandleArena = 256u;  // 8 B per delegate on 32-bit Arm: room for 32
alignas(8) uint8_t handle_arena[kHandleArena];
size_t handle_used;

bool inside(uintptr_t p, size_t n, const uint8_t *lo, const uint8_t *hi) {
  return p >= reinterpret_cast<uintptr_t>(lo) && p + n <= reinterpret_cast<uintptr_t>(hi);
}

// Memory the CPU never writes while the firmware runs, so the data cache holds no dirty line of
// it and none the NPU could have changed: the embedded model (weights and command streams; it
// was loaded before the core started) and the fast arena (the NPU's alone).
bool cpu_never_writes(uintptr_t p, size_t n) {
  return inside(p, n, __dk_model_start, __dk_model_end) ||
         inside(p, n, __dk_npu_fast_start, __dk_npu_fast_end);
}

}  // namespace

// EthosUBackend.cpp's weak defaults are null and 0 (no fast arena).
extern "C" {
unsigned char *ethosu_fast_scratch = DK_FAST_ARENA;
size_t ethosu_fast_scratch_size = DK_NPU_FAST_SCRATCH_SIZE;
}

void *operator new(size_t size, const std::nothrow_t &) noexcept {
  size = (size + 7u) & ~size_t(7u);
  if (size > kHandleArena - handle_used) return nullptr;  // init fails: MemoryAllocationFailed
  void *p = handle_arena + handle_used;
  handle_used += size;
  return p;
}

extern "C" {

uint32_t dk_npu_init(void) {
  uint32_t id = 0u, config = 0u;
  if (dk_probe_read32(DK_NPU_BASE + kIdOffset, &id) != 0) {
    Line l;
    l << "no Ethos-U at " ;
    l.hex(DK_NPU_BASE) << ": ID register read raised a bus fault (nothing answers there)";
    return report(DK_ERR_NO_NPU, l);
  }
  if ((id >> 28) != kArchMajor) {
    Line l;
    l << "no Ethos-U at ";
    l.hex(DK_NPU_BASE) << ": ID register read ";
    l.hex(id) << ", an " << kNpuName << " reads architecture ";
    l.dec(kArchMajor) << ".x (" << DK_NPU_TARGET << ", board file npu.base)";
    return report(DK_ERR_NO_NPU, l);
  }
  if (dk_probe_read32(DK_NPU_BASE + kConfigOffset, &config) != 0 || (config >> 28) != kProduct) {
    Line l;
    l << "no " << kNpuName << " at ";
    l.hex(DK_NPU_BASE) << ": ID register read ";
    l.hex(id) << ", CONFIG ";
    l.hex(config) << " names product ";
    l.dec(config >> 28) << " (this firmware is built for " << DK_NPU_TARGET << ")";
    return report(DK_ERR_NO_NPU, l);
  }
  const int rc = ethosu_init(&npu_driver, reinterpret_cast<void *>(DK_NPU_BASE), DK_FAST_ARENA,
                             DK_NPU_FAST_SCRATCH_SIZE, DK_NPU_SECURE_ENABLE,
                             DK_NPU_PRIVILEGE_ENABLE);
  if (rc != 0) {
    Line l;
    l << "ethosu_init failed for the " << kNpuName << " at ";
    l.hex(DK_NPU_BASE) << " (ID ";
    l.hex(id) << "): the NPU did not come out of its soft reset";
    return report(DK_ERR_NPU_INIT, l);
  }
  if (dk_irq_enable(DK_NPU_IRQ) != 0) {
    Line l;
    l << "npu.irq ";
    l.dec(DK_NPU_IRQ) << " is beyond the board's interrupt controller";
    return report(DK_ERR_NPU_INIT, l);
  }
  Line l;
  l << "npu: " << kNpuName << " at ";
  l.hex(DK_NPU_BASE) << ", ID ";
  l.hex(id) << ", CONFIG ";
  l.hex(config) << ", IRQ ";
  l.dec(DK_NPU_IRQ) << (DK_NPU_SECURE_ENABLE ? ", secure" : ", non-secure")
                   << (DK_NPU_PRIVILEGE_ENABLE ? ", privileged" : ", unprivileged")
                   << ", fast arena ";
  l.dec(DK_NPU_FAST_SCRATCH_SIZE) << " B";
  dk_send_log(l.c_str());
  return 0;
}

int dk_npu_in_delegate(void) { return in_delegate; }

uint32_t dk_npu_calls(void) { return num_calls; }

const char *dk_npu_failure(void) { return failure; }

void dk_npu_send_records(void) {
  const uint32_t n = num_calls < kMaxCalls ? num_calls : kMaxCalls;
  for (uint32_t i = 0; i < n; ++i) {
    dk_counter_t counters[kNumEvents];
    for (size_t e = 0; e < kNumEvents; ++e) counters[e] = {kEventNames[e], calls[i].counters[e]};
    (void)dk_send_npu(i, calls[i].npu_cycles, calls[i].ticks, counters, kNumEvents);
  }
  if (num_calls > kMaxCalls) {
    Line l;
    l << "npu: ";
    l.dec(num_calls - kMaxCalls) << " more delegate calls ran than npu records were kept for";
    dk_send_log(l.c_str());
  }
}

// The NPU's vector: irq_vectors.h puts this in the board's npu.irq slot.
void dk_npu_irq_handler(void) { ethosu_irq_handler(&npu_driver); }

// ---- EthosUBackend's hooks around each delegate call (weak no-ops in EthosUBackend.cpp) ----
void EthosUBackend_execute_begin() {
  in_delegate = 1;
  if (num_calls < kMaxCalls) calls[num_calls] = CallStats{};
  call_start = dk_ticks();
}

void EthosUBackend_execute_end() {
  if (num_calls < kMaxCalls) calls[num_calls].ticks = dk_ticks() - call_start;
  ++num_calls;
  in_delegate = 0;
}

// ---- the driver's hooks around each command stream ----
void ethosu_inference_begin(struct ethosu_driver *drv, void *) {
  // As Arm's example runner: the cycle counter runs from NPU_ACTIVE to NPU_IDLE (the command
  // stream's own cycles), the event counters over the same window.
  ETHOSU_PMU_Enable(drv);
  ETHOSU_PMU_PMCCNTR_CFG_Set_Stop_Event(drv, ETHOSU_PMU_NPU_IDLE);
  ETHOSU_PMU_PMCCNTR_CFG_Set_Start_Event(drv, ETHOSU_PMU_NPU_ACTIVE);
  uint32_t mask = ETHOSU_PMU_CCNT_Msk;
  for (uint32_t e = 0; e < kNumEvents; ++e) {
    ETHOSU_PMU_Set_EVTYPER(drv, e, kEvents[e]);
    mask |= 1u << e;
  }
  ETHOSU_PMU_CNTR_Enable(drv, mask);
  ETHOSU_PMU_CYCCNT_Reset(drv);
  ETHOSU_PMU_EVCNTR_ALL_Reset(drv);
}

void ethosu_inference_end(struct ethosu_driver *drv, void *) {
  if (num_calls < kMaxCalls) {
    calls[num_calls].npu_cycles = ETHOSU_PMU_Get_CCNTR(drv);
    for (uint32_t e = 0; e < kNumEvents; ++e)
      calls[num_calls].counters[e] = ETHOSU_PMU_Get_EVCNTR(drv, e);
  }
  ETHOSU_PMU_Disable(drv);
  // Called on success, error and timeout alike; the driver then returns -1 for the latter two
  // and EthosUBackend an ExecuTorch error, which the runner reports with this text.
  if (drv->job.result == ETHOSU_JOB_RESULT_TIMEOUT)
    failure = "the NPU did not signal completion (no interrupt) within "
              DK_STR(DK_NPU_INFERENCE_TIMEOUT_MS) " ms";
  else if (drv->job.result == ETHOSU_JOB_RESULT_ERROR)
    failure = "the NPU reported an error while running a command stream";
}

// ---- data cache maintenance (the Cortex-M55/M85 data cache is on: board file cpu.caches) ----
// The NPU reads and writes memory over its own AXI ports, past the CPU's data cache. The driver
// calls these with the command stream's base addresses: [0] the model's weights, [1] the scratch
// (EthosUBackend's temp-pool block: inputs, intermediates, outputs), [2] the fast arena.

// Before the NPU starts: the CPU has just written the inputs into the scratch (EthosUBackend
// copies every input tensor there), and those bytes may still sit in dirty cache lines the NPU
// cannot see. Cleaning writes them to memory. The model and the fast arena are skipped: the CPU
// never writes them, so they have no dirty lines (and cleaning a multi-megabyte model line by
// line would cost more than the NPU's run).
void ethosu_flush_dcache(const uint64_t *base_addr, const size_t *base_addr_size,
                         int num_base_addr) {
  for (int i = 0; i < num_base_addr; ++i) {
    const uintptr_t p = static_cast<uintptr_t>(base_addr[i]);
    if (base_addr_size[i] == 0u || cpu_never_writes(p, base_addr_size[i])) continue;
    dk_dcache_clean(reinterpret_cast<const void *>(p), base_addr_size[i]);
  }
}

// After the NPU finished: it wrote the outputs (and intermediates) into the scratch, but the CPU
// may hold older copies of those lines (from writing the inputs, or read speculatively while the
// NPU ran) and would read them instead of the NPU's results. Clean-and-invalidate drops them
// (cleaning first, so a line shared with CPU data at the range's edge loses no CPU write; the
// scratch itself starts on a line, .dk_npu_scratch is 32-byte aligned). The model is only read
// by the NPU, and the CPU never reads the fast arena: skipped.
void ethosu_invalidate_dcache(const uint64_t *base_addr, const size_t *base_addr_size,
                              int num_base_addr) {
  for (int i = 0; i < num_base_addr; ++i) {
    const uintptr_t p = static_cast<uintptr_t>(base_addr[i]);
    if (base_addr_size[i] == 0u || cpu_never_writes(p, base_addr_size[i])) continue;
    dk_dcache_clean_invalidate(reinterpret_cast<const void *>(p), base_addr_size[i]);
  }
}

// ---- the driver's semaphores: static, no malloc; taking one can time out ----
void *ethosu_semaphore_create(void) {
  if (semaphores_used >= sizeof semaphores / sizeof semaphores[0]) return nullptr;
  Semaphore *s = &semaphores[semaphores_used++];
  s->count = 0u;
  return s;
}

void ethosu_semaphore_destroy(void *) {}

// `timeout` in milliseconds (ETHOSU_SEMAPHORE_WAIT_FOREVER: none). Sleeps in WFE: the NPU's
// interrupt (which gives the semaphore and sends an event) or the tick timer's wakes it.
int ethosu_semaphore_take(void *sem, uint64_t timeout) {
  Semaphore *s = static_cast<Semaphore *>(sem);
  const uint64_t start = dk_ticks();
  const uint64_t hz = dk_tick_hz();
  for (;;) {
    uint32_t count = s->count;
    while (count != 0u) {
      if (__atomic_compare_exchange_n(&s->count, &count, count - 1u, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE))
        return 0;
    }
    if (timeout != ETHOSU_SEMAPHORE_WAIT_FOREVER &&
        (dk_ticks() - start) * 1000u >= timeout * hz)
      return -1;
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
