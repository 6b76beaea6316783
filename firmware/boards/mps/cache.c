/* cache.c: the L1 caches of the MPS family's cores that have them (Cortex-M55/M85 on Corstone;
 * board file cpu.caches), through the architectural cache maintenance registers (Armv7-M /
 * Armv8-M System Control Block). Cores without caches (Cortex-M33) and QEMU, which models no
 * cache, read CCR.DC as 0 or ignore the operations, so every function here is harmless there. */
#include <stddef.h>
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"
#include "mps_internal.h"

#define REG32(addr) (*(volatile uint32_t *)(addr))

void dk_caches_enable(void);

static inline void dk_barrier(void) { __asm__ volatile("dsb\n\tisb" ::: "memory"); }

/* Reset leaves the caches off with undefined contents: invalidate the whole instruction cache
 * and the data cache (by set and way, geometry from CCSIDR), then turn both on. */
void dk_caches_enable(void) {
#if defined(DK_CPU_CACHES) && DK_CPU_CACHES
  if (REG32(DK_SCB_CCR) & DK_CCR_DC) return; /* already on */
  REG32(DK_SCB_ICIALLU) = 0u;
  REG32(DK_SCB_CSSELR) = 0u; /* level 1 data cache */
  dk_barrier();
  const uint32_t ccsidr = REG32(DK_SCB_CCSIDR);
  const uint32_t sets = ((ccsidr >> 13) & 0x7FFFu) + 1u;
  const uint32_t ways = ((ccsidr >> 3) & 0x3FFu) + 1u;
  const uint32_t line_shift = (ccsidr & 7u) + 4u;
  const uint32_t way_shift = ways > 1u ? (uint32_t)__builtin_clz(ways - 1u) : 0u;
  for (uint32_t set = 0u; set < sets; ++set)
    for (uint32_t way = 0u; way < ways; ++way)
      REG32(DK_SCB_DCISW) = (way << way_shift) | (set << line_shift);
  dk_barrier();
  REG32(DK_SCB_CCR) |= DK_CCR_IC | DK_CCR_DC;
  dk_barrier();
#endif
}

/* By address to the point of coherency, one line at a time. The line size is CCSIDR's (32 B on
 * the Cortex-M55/M85); the range is widened to whole lines. */
static void dk_dcache_by_address(uintptr_t reg, const void *addr, size_t size) {
  if (size == 0u || !(REG32(DK_SCB_CCR) & DK_CCR_DC)) return;
  REG32(DK_SCB_CSSELR) = 0u;
  dk_barrier();
  const uintptr_t line = (uintptr_t)1u << ((REG32(DK_SCB_CCSIDR) & 7u) + 4u);
  uintptr_t p = (uintptr_t)addr & ~(line - 1u);
  const uintptr_t end = (uintptr_t)addr + size;
  __asm__ volatile("dsb" ::: "memory");
  for (; p < end; p += line) REG32(reg) = (uint32_t)p;
  dk_barrier();
}

void dk_dcache_clean(const void *addr, size_t size) {
  dk_dcache_by_address(DK_SCB_DCCMVAC, addr, size);
}

void dk_dcache_clean_invalidate(const void *addr, size_t size) {
  dk_dcache_by_address(DK_SCB_DCCIMVAC, addr, size);
}
