/*
 * cmsis_nn_add.c: CMSIS-NN's int8 elementwise add (a residual add) with each input's rescaling
 * looked up in a table.
 *
 * arm_elementwise_add_s8 rescales each input element ((x + offset) << left_shift, then
 * arm_nn_requantize: a 64-bit multiply and a rounding shift), adds the two and rescales the sum:
 * three requantizations per element, about 82 instructions per element on the Cortex-M33
 * (resnet8's three residual adds are 8% of its execute()). An input's rescaled value depends
 * only on its int8 value, so here each input has a table of its 256 rescaled values, filled
 * once per call with the library's own arithmetic, and only the sum's rescaling is left per
 * element. With MVE, CMSIS-NN's vector add takes 13 instructions per element; here four lanes
 * of each input are gathered from their tables. The two tables take 2 KiB of stack during the
 * call; filling them costs about as much as 150 (M33) or 800 (M55) elements, so calls of fewer
 * than DK_ADD_TABLE_MIN_ELEMENTS elements (a per-channel broadcast calls once per row) go to
 * CMSIS-NN's add.
 *
 * The same bytes as CMSIS-NN's: every entry is arm_nn_requantize of (x + offset) * 2^left_shift,
 * as its scalar path computes it; its MVE path's arm_requantize_mve is the same arithmetic, and
 * its DSP path masks (x + offset) to 16 bits before the shift, which gives the same 32-bit value
 * once left_shift is 16 or more (ExecuTorch's cortex_m add passes 20); other shifts go to
 * CMSIS-NN's add. The sum of two entries is the library's sum.
 */
#include "cmsis_nn_add.h"

#include "arm_nnsupportfunctions.h"

#define DK_ADD_TABLE_MIN_ELEMENTS 1024

/* table[(uint8_t)x] for every int8 x. (x + offset) is within [-383, 383] for offsets in
 * [-255, 255], so its product with 2^23 or less fits an int32. With MVE, four entries at a time
 * through arm_requantize_mve, the same arithmetic as arm_nn_requantize. */
static void dk_rescale_table(int32_t table[256], int32_t offset, int32_t left_shift,
                             int32_t mult, int32_t shift) {
#if defined(ARM_MATH_MVEI)
  for (uint32_t index = 0; index < 256; index += 4) {
    int32x4_t x = vreinterpretq_s32_u32(vidupq_n_u32(index, 1));
    if (index >= 128) {
      x = vsubq_n_s32(x, 256); /* the entries of negative x */
    }
    x = vshlq_r_s32(vaddq_n_s32(x, offset), left_shift);
    vst1q_s32(&table[index], arm_requantize_mve(x, mult, shift));
  }
#else
  for (int32_t x = -128; x < 128; x++) {
    table[(uint8_t)x] = arm_nn_requantize((x + offset) * (1 << left_shift), mult, shift);
  }
#endif
}

/* The sum of two table entries, requantized, offset and clamped: four lanes at a time with MVE
 * (the library's arm_requantize_mve, as its vector add does), one element at a time without,
 * with arm_nn_requantize's shifts worked out once. */
static void dk_add_tables(const int32_t *table_1, const int32_t *table_2,
                          const int8_t *input_1_vect, const int8_t *input_2_vect, int8_t *output,
                          int32_t out_offset, int32_t out_mult, int32_t out_shift,
                          int32_t out_activation_min, int32_t out_activation_max,
                          int32_t block_size) {
#if defined(ARM_MATH_MVEI)
  for (int32_t count = block_size; count > 0; count -= 4) {
    const mve_pred16_t p = vctp32q((uint32_t)count);
    const uint32x4_t index_1 = vldrbq_z_u32((const uint8_t *)input_1_vect, p);
    const uint32x4_t index_2 = vldrbq_z_u32((const uint8_t *)input_2_vect, p);
    int32x4_t sum = vaddq_s32(vldrwq_gather_shifted_offset_z_s32(table_1, index_1, p),
                              vldrwq_gather_shifted_offset_z_s32(table_2, index_2, p));
    sum = vaddq_n_s32(arm_requantize_mve(sum, out_mult, out_shift), out_offset);
    sum = vmaxq_s32(sum, vdupq_n_s32(out_activation_min));
    sum = vminq_s32(sum, vdupq_n_s32(out_activation_max));
    vstrbq_p_s32(output, sum, p);
    input_1_vect += 4;
    input_2_vect += 4;
    output += 4;
  }
#else
  /* arm_nn_requantize: the doubling high multiply (a 64-bit product, + 2^30, >> 31), then the
   * rounding divide by 2^right, where remainder > (mask >> 1) + (negative) adds one: that is
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
#endif
}

arm_cmsis_nn_status dk_elementwise_add_s8(const int8_t *input_1_vect, const int8_t *input_2_vect,
                                          const int32_t input_1_offset, const int32_t input_1_mult,
                                          const int32_t input_1_shift, const int32_t input_2_offset,
                                          const int32_t input_2_mult, const int32_t input_2_shift,
                                          const int32_t left_shift, int8_t *output,
                                          const int32_t out_offset, const int32_t out_mult,
                                          const int32_t out_shift, const int32_t out_activation_min,
                                          const int32_t out_activation_max,
                                          const int32_t block_size) {
  if (block_size >= DK_ADD_TABLE_MIN_ELEMENTS && left_shift >= 16 && left_shift <= 23 &&
      input_1_offset >= -255 && input_1_offset <= 255 && input_2_offset >= -255 &&
      input_2_offset <= 255) {
    int32_t table_1[256], table_2[256];
    dk_rescale_table(table_1, input_1_offset, left_shift, input_1_mult, input_1_shift);
    dk_rescale_table(table_2, input_2_offset, left_shift, input_2_mult, input_2_shift);
    dk_add_tables(table_1, table_2, input_1_vect, input_2_vect, output, out_offset, out_mult,
                  out_shift, out_activation_min, out_activation_max, block_size);
    return ARM_CMSIS_NN_SUCCESS;
  }
  return arm_elementwise_add_s8(input_1_vect, input_2_vect, input_1_offset, input_1_mult,
                                input_1_shift, input_2_offset, input_2_mult, input_2_shift,
                                left_shift, output, out_offset, out_mult, out_shift,
                                out_activation_min, out_activation_max, block_size);
}
