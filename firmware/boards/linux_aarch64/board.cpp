/*
 * board.cpp: the board API (dk_board.h) for a Linux process on a Cortex-A board (family
 * linux_aarch64): the console is standard output, the timer CLOCK_MONOTONIC in nanoseconds,
 * dk_exit() the process's exit status. dk_board_init() also sizes XNNPACK's thread pool: the
 * DK_THREADS environment variable, else the board file's linux.threads (DK_LINUX_THREADS).
 *
 * Stack and heap are the process's, managed by Linux and the C library: neither is painted
 * nor counted here, so their memory entries are 0 of 0 (the runner's pools are counted).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <executorch/extension/threadpool/threadpool.h>

#include "dk_board.h"

#ifndef DK_LINUX_THREADS
#error "DK_LINUX_THREADS (the board file's linux.threads) is not defined"
#endif

namespace {

uint64_t start_ns = 0;
bool initialised = false;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t thread_count() {
  const char *text = getenv("DK_THREADS");
  if (text != nullptr && *text != '\0') {
    char *end = nullptr;
    const unsigned long n = strtoul(text, &end, 10);
    if (*end == '\0' && n >= 1u && n <= 256u) return static_cast<uint32_t>(n);
  }
  return DK_LINUX_THREADS;
}

}  // namespace

extern "C" {

void dk_board_init(void) {
  if (initialised) return;
  initialised = true;
  start_ns = now_ns();
  executorch::extension::threadpool::ThreadPool *pool =
      executorch::extension::threadpool::get_threadpool();
  if (pool != nullptr) pool->_unsafe_reset_threadpool(thread_count());
}

void dk_console_write(const void *data, size_t len) {
  const char *p = static_cast<const char *>(data);
  while (len > 0) {
    const ssize_t n = write(STDOUT_FILENO, p, len);
    if (n <= 0) _exit(120);  // the reader went away: nothing can be reported any more
    p += n;
    len -= static_cast<size_t>(n);
  }
}

size_t dk_console_read(void *, size_t) { return 0; }

uint64_t dk_ticks(void) { return now_ns() - start_ns; }
uint32_t dk_tick_hz(void) { return 1000000000u; }

void dk_exit(int status) { _exit(status); }

size_t dk_stack_used(void) { return 0; }
size_t dk_stack_size(void) { return 0; }
size_t dk_heap_used(void) { return 0; }
size_t dk_heap_size(void) { return 0; }

int dk_irq_set_handler(unsigned, void (*)(void)) { return -1; }
int dk_irq_enable(unsigned) { return -1; }
int dk_probe_read32(uintptr_t, uint32_t *) { return -1; }
void dk_dcache_clean(const void *, size_t) {}
void dk_dcache_clean_invalidate(const void *, size_t) {}

}  // extern "C"
