/*
 * cmsis_nn_softmax.c: arm_softmax_s8's int8 results with each distinct exponential computed
 * once per call.
 *
 * With GCC 12.2, CMSIS-NN defines ARM_GCC_12_2_ICE (arm_nn_compiler.h: the MVE code hits an
 * internal compiler error), so arm_softmax_s8 always runs the scalar arm_nn_softmax_common_s8,
 * which computes the fixed-point exp EXP_ON_NEG(MUL_SAT(diff * mask, mult)) (some 200
 * instructions) twice for every element: once for the row's sum, once for its output. The exp
 * depends only on diff = input - row max, an int8 difference in [-255, 0], and on the call's
 * mult and shift, so this version keeps it in a table indexed by -diff, filled on first use and
 * shared by all rows of the call: at most 256 exps per call, whatever the tensor's size.
 *
 * Everything else is arm_nn_softmax_common_s8's int8 path, step for step, with the library's
 * own inline arithmetic (MUL_SAT, DIV_POW2, EXP_ON_NEG, ONE_OVER1, CLZ, CLAMP): the same max,
 * sum, headroom, shifted_scale and bits_over_unit, the same rounding and clamp, NN_Q7_MIN below
 * diff_min. tests/integration/test_softmax_host.py compares the two on the host over random
 * inputs and the cortex_m pass's parameters; tests/integration/test_softmax_qemu.py runs it on
 * both QEMU boards against the host's reference (CMSIS-NN's own softmax), bit for bit.
 *
 * Cost: the table is 1 KiB of stack during the call.
 */
#include "cmsis_nn_softmax.h"

#include <string.h>

#include "arm_nnsupportfunctions.h"

#define DK_SOFTMAX_ACCUM_BITS 12 /* arm_nn_softmax_common_s8.c's ACCUM_BITS */
#define DK_SOFTMAX_DIFFS 256     /* -diff for int8 inputs: 0 .. 255 */

/* Not yet computed. EXP_ON_NEG of a value <= 0 (all a softmax passes it: diff <= 0 and a
 * positive mult) is in [0, NN_Q31_MAX], checked over every such value. Correctness does not
 * rest on it: an exp that were -1 would only be computed again at each use. */
#define DK_EXP_UNKNOWN (-1)

/* Out of line: one copy of the exp's code, called once per distinct diff. */
static int32_t __attribute__((noinline))
dk_softmax_exp_fill(int32_t *slot, int32_t diff, int32_t mask, int32_t mult) {
  *slot = EXP_ON_NEG(MUL_SAT(diff * mask, mult));
  return *slot;
}

/* EXP_ON_NEG(MUL_SAT(diff * mask, mult)), from the table once computed. */
static inline int32_t dk_softmax_exp(int32_t *exp_of_minus_diff, int32_t diff, int32_t mask,
                                     int32_t mult) {
  int32_t *slot = &exp_of_minus_diff[-diff];
  const int32_t known = *slot;
  return known != DK_EXP_UNKNOWN ? known : dk_softmax_exp_fill(slot, diff, mask, mult);
}

void dk_arm_softmax_s8(const int8_t *input, const int32_t num_rows, const int32_t row_size,
                       const int32_t mult, const int32_t shift, const int32_t diff_min,
                       int8_t *output) {
  const int32_t mask = (1 << shift);
  int32_t exp_of_minus_diff[DK_SOFTMAX_DIFFS];
  /* All bytes 0xFF: every entry DK_EXP_UNKNOWN (-1). */
  memset(exp_of_minus_diff, 0xFF, sizeof(exp_of_minus_diff));

  for (int32_t row_idx = 0; row_idx < num_rows; ++row_idx) {
    int8_t max = *input;
    for (int32_t col = 1; col < row_size; ++col) {
      max = MAX(max, input[col]);
    }

    int32_t sum = 0;
    for (int32_t col = 0; col < row_size; ++col) {
      const int32_t diff = input[col] - max;
      if (diff >= diff_min) {
        sum += DIV_POW2(dk_softmax_exp(exp_of_minus_diff, diff, mask, mult),
                        DK_SOFTMAX_ACCUM_BITS);
      }
    }

    const int32_t headroom = CLZ(sum);
    const int32_t shifted_scale = ONE_OVER1((sum > 0 ? sum << headroom : 0) - (1 << 31));
    const int32_t bits_over_unit = DK_SOFTMAX_ACCUM_BITS - headroom + 23;

    for (int32_t col = 0; col < row_size; ++col) {
      const int32_t diff = input[col] - max;
      if (diff >= diff_min) {
        const int32_t res =
            DIV_POW2(MUL_SAT(shifted_scale, dk_softmax_exp(exp_of_minus_diff, diff, mask, mult)),
                     bits_over_unit) +
            NN_Q7_MIN;
        output[col] = (int8_t)CLAMP(res, (int32_t)NN_Q7_MAX, (int32_t)NN_Q7_MIN);
      } else {
        output[col] = NN_Q7_MIN;
      }
    }

    input += row_size;
    output += row_size;
  }
}
