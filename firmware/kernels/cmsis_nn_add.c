/*
 * cmsis_nn_add.c: CMSIS-NN's int8 elementwise add (a residual add) with each input's rescaling
 * looked up in a table, on cores without MVE.
 *
 * arm_elementwise_add_s8 rescales each input element ((x + offset) << left_shift, then
 * arm_nn_requantize: a 64-bit multiply and a rounding shift), adds the two and rescales the sum:
 * three requantizations per element, about 82 instructions per element on the Cortex-M33
 * (resnet8's three residual adds are 8% of its execute()). An input's rescaled value depends
 * only on its int8 value, so here each input has a table of its 256 rescaled values, filled
 * once per call with the library's own arithmetic, and only the sum's rescaling is left per
 * element. The two tables take 2 KiB of stack during the call; filling them costs about as
 * much as 150 elements, so calls of fewer than DK_ADD_TABLE_MIN_ELEMENTS elements (a
 * per-channel broadcast calls once per row) go to CMSIS-NN's add. With MVE, CMSIS-NN's vector
 * add (13 instructions per element) is kept.
 *
 * The same bytes as CMSIS-NN's: every entry is arm_nn_requantize of (x + offset) * 2^left_shift,
 * as its scalar path computes it. Its DSP path masks (x + offset) to 16 bits before the shift,
 * which gives the same 32-bit value once left_shift is 16 or more (ExecuTorch's cortex_m add
 * passes 20); other shifts go to CMSIS-NN's add. The sum of two entries is the library's sum.
 */
#include "cmsis_nn_add.h"

#include "arm_nnsupportfunctions.h"

#define DK_ADD_TABLE_MIN_ELEMENTS 1024

#if !defined(ARM_MATH_MVEI)
/* table[(uint8_t)x] for every int8 x. (x + offset) is within [-383, 383] for offsets in
 * [-255, 255], so its product with 2^23 or less fits an int32. */
static void dk_rescale_table(int32_t table[256], int32_t offset, int32_t left_shift,
                             int32_t mult, int32_t shift) {
  for (int32_t x = -128; x < 128; x++) {
    table[(uint8_t)x] = arm_nn_requantize((x + offset) * (1 << left_shift), mult, shift);
  }
}
#endif

arm_cmsis_nn_status dk_elementwise_add_s8(const int8_t *input_1_vect, const int8_t *input_2_vect,
                                          const int32_t input_1_offset, const int32_t input_1_mult,
                                          const int32_t input_1_shift, const int32_t input_2_offset,
                                          const int32_t input_2_mult, const int32_t input_2_shift,
                                          const int32_t left_shift, int8_t *output,
                                          const int32_t out_offset, const int32_t out_mult,
                                          const int32_t out_shift, const int32_t out_activation_min,
                                          const int32_t out_activation_max,
                                          const int32_t block_size) {
#if !defined(ARM_MATH_MVEI)
  if (block_size >= DK_ADD_TABLE_MIN_ELEMENTS && left_shift >= 16 && left_shift <= 23 &&
      input_1_offset >= -255 && input_1_offset <= 255 && input_2_offset >= -255 &&
      input_2_offset <= 255) {
    int32_t table_1[256], table_2[256];
    dk_rescale_table(table_1, input_1_offset, left_shift, input_1_mult, input_1_shift);
    dk_rescale_table(table_2, input_2_offset, left_shift, input_2_mult, input_2_shift);
    /* arm_nn_requantize(sum, out_mult, out_shift) with its shifts worked out once: the
     * doubling high multiply (a 64-bit product, + 2^30, >> 31), then the rounding divide by
     * 2^right: remainder > (mask >> 1) + (negative) adds one, which is
     * (r + 2^(right-1) - (negative)) >> right for right > 0, and r for right = 0. */
    const int32_t left = LEFT_SHIFT(out_shift), right = RIGHT_SHIFT(out_shift);
    const int32_t half = (1 << right) >> 1;
    const uint32_t round_down_negative = right > 0;
    const int8_t *const end = output + block_size;
    while (output < end) {
      const int32_t sum = table_1[(uint8_t)*input_1_vect++] + table_2[(uint8_t)*input_2_vect++];
      const int64_t product = (int64_t)(sum * (1 << left)) * out_mult + (1L << 30);
      int32_t r = (int32_t)(product >> 31);
      r = (r + half - (int32_t)(((uint32_t)r >> 31) & round_down_negative)) >> right;
      r = MAX(r + out_offset, out_activation_min);
      *output++ = (int8_t)MIN(r, out_activation_max);
    }
    return ARM_CMSIS_NN_SUCCESS;
  }
#endif
  return arm_elementwise_add_s8(input_1_vect, input_2_vect, input_1_offset, input_1_mult,
                                input_1_shift, input_2_offset, input_2_mult, input_2_shift,
                                left_shift, output, out_offset, out_mult, out_shift,
                                out_activation_min, out_activation_max, block_size);
}
