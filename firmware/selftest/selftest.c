/*
 * selftest.c: deploykit firmware self-test, without ExecuTorch.
 *
 * It exercises the board support (startup, UART, SysTick, semihosting exit, fault report) and
 * the result protocol. Records sent, in order (seq 0, 1, ...):
 *
 *   hello    protocol=1, board=<DK_BOARD_NAME>, firmware=selftest, selftest_version=1,
 *            lcg_seed=0x2545F491, build=<...>, chunk_bytes=<DK_PROTOCOL_CHUNK_BYTES>
 *   tensor   index 0: C, int32 (dtype 3), sizes [24, 20], 1920 bytes: 2 chunks of 1024 B
 *   tensor   index 1: Y, float32 (dtype 6), sizes [64], 256 bytes: 1 chunk
 *   timing   ticks for SELFTEST_ITERATIONS (16) runs of both computations, tick_hz, 16,
 *            instructions = UINT64_MAX (unknown)
 *   memory   "stack" (high-water, DK_STACK_SIZE), "heap" (high-water, DK_HEAP_SIZE)
 *   done     status 0, records 6
 * then exits with status 0 (the simulator's exit code). All tensors have scale 0.0 and
 * zero_point 0.
 *
 * How the host recomputes the expected outputs (numpy):
 *
 *   state = 0x2545F491                       # SELFTEST_LCG_SEED
 *   def lcg():                               # Numerical Recipes LCG, mod 2**32;
 *       global state                         # each call advances, then returns the new state
 *       state = (1664525 * state + 1013904223) & 0xFFFFFFFF
 *       return state
 *   # One stream, consumed in this order: all of A, then all of B, then all of X.
 *   A = np.array([(lcg() >> 24) - 128 for _ in range(24 * 32)], np.int32).reshape(24, 32)
 *   B = np.array([(lcg() >> 24) - 128 for _ in range(32 * 20)], np.int32).reshape(32, 20)
 *   X = np.array([((lcg() >> 8) & 0xFFFF) - 32768 for _ in range(64)], np.float32) \
 *       / np.float32(4096)                  # exact in float32, range [-8, 8)
 *   C = A @ B                                # int32 [24, 20], exact (|C| <= 32 * 128 * 128)
 *   Y = np.sqrt(X * X + np.float32(1)) * np.float32(0.5) - X / np.float32(3)
 *                                            # float32 [64]; each operation rounded to float32
 *
 * Both outputs must match bit for bit: C is integer, and Y uses only IEEE-754 operations
 * (mul, add, sqrt, div, sub) that the FPU rounds exactly like numpy's float32 ops. This file is
 * compiled with -ffp-contract=off so that no multiply-add is fused.
 *
 * Fault variants (CMake -DDK_SELFTEST_FAULT=n): after hello and a log record it faults instead
 * of computing, and the board's fault handler sends log + fault + done(status 2) and exits 2.
 *   3: no fault: an error record (DK_ERR_SELFTEST) and done(status 1), exit 1, as the runner does
 *      when ExecuTorch fails.
 *   4: no fault: loops forever in dk_selftest_hang_site; the host's time limit ends the run,
 *      and on QEMU the host names the function it hung in.
 *   1: executes UDF at dk_selftest_fault_site: UsageFault, CFSR.UNDEFINSTR (0x00010000),
 *      fault.pc == address of the ELF symbol dk_selftest_fault_site with the Thumb bit cleared.
 *   2: unbounded recursion overflows the main stack: on Armv8-M Mainline (M33, M55) the stack
 *      limit (MSPLIM) raises UsageFault, CFSR.STKOF (0x00100000). The core stops stacking at
 *      the limit, so the stacked registers (r0..xpsr) are reported as 0, with a log record
 *      saying so.
 */
#include <stddef.h>
#include <stdint.h>

#include "board_config.h"
#include "dk_board.h"
#include "dk_errors.h"
#include "dk_protocol.h"

#ifndef DK_SELFTEST_FAULT
#define DK_SELFTEST_FAULT 0
#endif
#ifndef DK_SELFTEST_BUILD_TYPE
#define DK_SELFTEST_BUILD_TYPE "unknown"
#endif

#define SELFTEST_LCG_SEED 0x2545F491u
#define SELFTEST_LCG_MUL 1664525u
#define SELFTEST_LCG_ADD 1013904223u
#define SELFTEST_M 24
#define SELFTEST_K 32
#define SELFTEST_N 20
#define SELFTEST_L 64
#ifndef SELFTEST_ITERATIONS
#define SELFTEST_ITERATIONS 16u
#endif

#define DK_STR_(x) #x
#define DK_STR(x) DK_STR_(x)

static int32_t mat_a[SELFTEST_M][SELFTEST_K];
static int32_t mat_b[SELFTEST_K][SELFTEST_N];
static int32_t mat_c[SELFTEST_M][SELFTEST_N];
static float vec_x[SELFTEST_L];
static float vec_y[SELFTEST_L];

static uint32_t lcg_state = SELFTEST_LCG_SEED;

static uint32_t lcg_next(void) {
  lcg_state = SELFTEST_LCG_MUL * lcg_state + SELFTEST_LCG_ADD;
  return lcg_state;
}

static void make_inputs(void) {
  for (int i = 0; i < SELFTEST_M; ++i)
    for (int k = 0; k < SELFTEST_K; ++k) mat_a[i][k] = (int32_t)(lcg_next() >> 24) - 128;
  for (int k = 0; k < SELFTEST_K; ++k)
    for (int j = 0; j < SELFTEST_N; ++j) mat_b[k][j] = (int32_t)(lcg_next() >> 24) - 128;
  for (int i = 0; i < SELFTEST_L; ++i)
    vec_x[i] = (float)((int32_t)((lcg_next() >> 8) & 0xFFFFu) - 32768) / 4096.0f;
}

static void matmul(void) {
  for (int i = 0; i < SELFTEST_M; ++i)
    for (int j = 0; j < SELFTEST_N; ++j) {
      int32_t acc = 0;
      for (int k = 0; k < SELFTEST_K; ++k) acc += mat_a[i][k] * mat_b[k][j];
      mat_c[i][j] = acc;
    }
}

static void vector_op(void) {
  for (int i = 0; i < SELFTEST_L; ++i) {
    const float x = vec_x[i];
    vec_y[i] = __builtin_sqrtf(x * x + 1.0f) * 0.5f - x / 3.0f;
  }
}

#if DK_SELFTEST_FAULT == 1
/* UDF #0: permanently undefined. The fault record's pc is this function's address. */
__attribute__((naked, noinline)) void dk_selftest_fault_site(void) {
  __asm__ volatile("udf #0");
}
#elif DK_SELFTEST_FAULT == 2
static volatile uint32_t recursion_limit = UINT32_MAX;

__attribute__((noinline)) static uint32_t recurse(uint32_t depth) {
  volatile uint32_t frame[32];
  frame[depth % 32u] = depth;
  if (depth >= recursion_limit) return frame[0];
  return recurse(depth + 1u) + frame[depth % 32u];
}
#elif DK_SELFTEST_FAULT == 4
/* The hang variant's endless loop, a function of its own so that the host can name where the
 * run hangs (a volatile counter keeps the loop). */
__attribute__((noinline)) void dk_selftest_hang_site(void) {
  static volatile uint32_t spins;
  for (;;) spins++;
}
#endif

/* The encoder refused a record (a defect of this file): say so instead of a silent gap. */
static void send_failed(const char *record) {
  dk_send_error(DK_ERR_SEND, record);
  dk_send_done(DK_STATUS_ET_ERROR);
  dk_exit(DK_STATUS_ET_ERROR);
}

int main(void) {
  dk_board_init(); /* already done by the reset handler; harmless */

  dk_send_hello("protocol=1\n"
                "board=" DK_BOARD_NAME "\n"
                "firmware=selftest\n"
                "selftest_version=1\n"
                "lcg_seed=0x2545F491\n"
                "chunk_bytes=" DK_STR(DK_PROTOCOL_CHUNK_BYTES) "\n"
                "build=" DK_SELFTEST_BUILD_TYPE " fault=" DK_STR(DK_SELFTEST_FAULT)
                " gcc=" __VERSION__);

#if DK_SELFTEST_FAULT == 1
  dk_send_log("selftest: executing an undefined instruction at dk_selftest_fault_site");
  dk_selftest_fault_site();
#elif DK_SELFTEST_FAULT == 2
  dk_send_log("selftest: overflowing the main stack");
  (void)recurse(0u);
#elif DK_SELFTEST_FAULT == 3
  /* A device-side error, as the runner reports an ExecuTorch failure: error + done(1). */
  dk_send_error(DK_ERR_SELFTEST, "selftest: deliberate error record");
  dk_send_done(DK_STATUS_ET_ERROR);
  dk_exit(DK_STATUS_ET_ERROR);
#elif DK_SELFTEST_FAULT == 4
  dk_send_log("selftest: hanging in dk_selftest_hang_site");
  dk_selftest_hang_site();
#endif

  make_inputs();

  const uint64_t t0 = dk_ticks();
  for (uint32_t it = 0; it < SELFTEST_ITERATIONS; ++it) {
    matmul();
    vector_op();
    __asm__ volatile("" ::: "memory"); /* keep every iteration */
  }
  const uint64_t ticks = dk_ticks() - t0;

  const int32_t c_sizes[2] = {SELFTEST_M, SELFTEST_N};
  const int32_t y_sizes[1] = {SELFTEST_L};
  if (dk_send_tensor(0, DK_DTYPE_INT32, 2, c_sizes, 0.0f, 0, mat_c, (uint32_t)sizeof mat_c) != 0)
    send_failed("tensor 0");
  if (dk_send_tensor(1, DK_DTYPE_FLOAT32, 1, y_sizes, 0.0f, 0, vec_y, (uint32_t)sizeof vec_y) != 0)
    send_failed("tensor 1");

  dk_send_timing(ticks, dk_tick_hz(), SELFTEST_ITERATIONS, DK_INSTRUCTIONS_UNKNOWN);

  const dk_memory_entry_t mem[2] = {
      {"stack", (uint32_t)dk_stack_used(), (uint32_t)dk_stack_size()},
      {"heap", (uint32_t)dk_heap_used(), (uint32_t)dk_heap_size()},
  };
  if (dk_send_memory(mem, 2) != 0) send_failed("memory");

  dk_send_done(DK_STATUS_OK);
  dk_exit(DK_STATUS_OK);
}
