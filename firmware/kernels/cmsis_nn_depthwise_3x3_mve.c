/*
 * cmsis_nn_depthwise_3x3_mve.c: a direct int8 3x3 depthwise convolution for MVE, with the
 * results of CMSIS-NN's arm_depthwise_conv_wrapper_s8 bit for bit.
 *
 * CMSIS-NN's MVE path (arm_depthwise_conv_s8_opt) copies every output pixel's 3x3 window into
 * an im2col buffer, a copy or fill per tap, before its dot products (on DS-CNN's 3x3 layers 2.4
 * instructions per MAC on qemu-an547, with the bands of an in-place layer). This one takes one
 * channel at a time:
 *
 * - The channel's input is gathered (VLDRB gather, four rows per load) into a small buffer,
 *   column by column with a fixed 32 bytes between columns, the padding around it holding
 *   -input_offset (the input zero point), as CMSIS-NN's im2col does: a padding tap adds
 *   (x + input_offset) x w = 0.
 * - Four vertically adjacent output pixels of one column are the four int32 lanes: each of the
 *   9 taps is one VLDRB.S32 from the buffer (a fixed immediate offset from one pointer) and one
 *   VMLA by the tap's weight, a scalar in a core register, on an accumulator that starts at
 *   bias + input_offset x (sum of the weights): 18 instructions for 36 MACs. Then
 *   arm_requantize_mve with the channel's multiplier and shift, the output offset, the clamp
 *   and one VSTRB scatter to the four output rows (predicated on the last rows of a column).
 *   The same int32 sums as CMSIS-NN's bias + sum of (x + input_offset) x w (modulo 2^32, no
 *   saturation in between), so the same outputs.
 * - A layer written over its own input: a channel's outputs are written only over its own
 *   input, which is in the buffer by then. So any layer of the domain runs in one call, the
 *   channel's set-up (weights, bias, quantization) once.
 *
 * tests/integration/test_depthwise_3x3_dsp_qemu.py runs layers inside and outside this domain
 * on qemu-an547 against the host's reference (CMSIS-NN's own C code).
 */
#include "cmsis_nn_depthwise_3x3_mve.h"

#if DK_DEPTHWISE_3X3_MVE

#include <string.h>

#define DK_DWM_BLOCK 4        /* channels per block: the four bytes of an input word */
#define DK_DWM_COLUMN 32      /* bytes between buffer columns: padded rows per column */
#define DK_DWM_MAX_COLUMNS 9  /* padded columns: output rows of up to 7 pixels */
#define DK_DWM_PLANE (DK_DWM_MAX_COLUMNS * DK_DWM_COLUMN) /* bytes per channel */
/* A column's last group of four rows reads up to 3 rows past the padded map. */
#define DK_DWM_BUF_BYTES (DK_DWM_BLOCK * DK_DWM_PLANE + 4)
#define DK_DWM_SUMS ((DK_DWM_MAX_COLUMNS - 2) * DK_DWM_COLUMN) /* one channel's sums */

int dk_depthwise_conv_3x3_mve_s8_applies(const cmsis_nn_dw_conv_params *dw_conv_params,
                                         const cmsis_nn_dims *input_dims,
                                         const cmsis_nn_dims *filter_dims,
                                         const cmsis_nn_dims *output_dims) {
  const cmsis_nn_dw_conv_params *p = dw_conv_params;
  return p->ch_mult == 1 && input_dims->n == 1 && output_dims->n == 1 &&
         input_dims->c == output_dims->c && input_dims->c >= DK_DWM_BLOCK &&
         input_dims->c % DK_DWM_BLOCK == 0 && filter_dims->h == 3 && filter_dims->w == 3 &&
         p->dilation.h == 1 && p->dilation.w == 1 && p->stride.h == 1 && p->stride.w == 1 &&
         p->padding.h >= 0 && p->padding.h <= 1 && p->padding.w >= 0 && p->padding.w <= 1 &&
         input_dims->h >= 1 && input_dims->w >= 1 &&
         output_dims->h == input_dims->h + 2 * p->padding.h - 2 && output_dims->h >= 1 &&
         output_dims->w == input_dims->w + 2 * p->padding.w - 2 && output_dims->w >= 1 &&
         input_dims->h + 2 * p->padding.h <= DK_DWM_COLUMN &&
         input_dims->w + 2 * p->padding.w <= DK_DWM_MAX_COLUMNS;
}

/* The sums of x w of one channel, column by column, `groups` vectors of four rows per column:
 * `buf` is the channel's padded map, `f` its first weight (weights `channels` bytes apart). */
static __attribute__((noinline)) void dk_dwm_sums(const int8_t *buf, int32_t *sums,
                                                  const int8_t *f, const int32_t channels,
                                                  const int32_t groups, const int32_t out_w) {
  const int32_t w0 = f[0], w1 = f[channels], w2 = f[2 * channels], w3 = f[3 * channels];
  const int32_t w4 = f[4 * channels], w5 = f[5 * channels], w6 = f[6 * channels];
  const int32_t w7 = f[7 * channels], w8 = f[8 * channels];
  for (int32_t x = 0; x < out_w; ++x, buf += DK_DWM_COLUMN) {
    const int8_t *p = buf;
    for (int32_t g = groups; g > 0; --g, p += 4, sums += 4) {
      /* Weight (ky, kx) is w[3 ky + kx]: buffer column kx, row ky. */
      int32x4_t acc = vmulq_n_s32(vldrbq_s32(p), w0);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + 1), w3);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + 2), w6);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + DK_DWM_COLUMN), w1);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + DK_DWM_COLUMN + 1), w4);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + DK_DWM_COLUMN + 2), w7);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + 2 * DK_DWM_COLUMN), w2);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + 2 * DK_DWM_COLUMN + 1), w5);
      acc = vmlaq_n_s32(acc, vldrbq_s32(p + 2 * DK_DWM_COLUMN + 2), w8);
      vstrwq_s32(sums, acc);
    }
  }
}

/* The outputs of `n` groups of four rows from their sums plus `init`: arm_requantize_mve with
 * the channel's multiplier and shift, the output offset, the clamp, and a scatter to four
 * output rows, the last group's predicated on `tail`. Fast (the shift a right shift, as in
 * most layers): its left shift of 0 left out, and its rounding fixup (the remainder of a
 * negative value, (v & -exponent) >> 31) is v >> 31. */
static inline __attribute__((always_inline)) const int32_t *dk_dwm_outputs(
    const int32_t *sums, int8_t *o, int32_t n, const mve_pred16_t tail, const int32_t init,
    const int32_t mult, const int32_t shift, const uint32x4_t out_rows, const int32_t out_step,
    const int32_t output_offset, const int32x4_t lo, const int32x4_t hi, const int fast) {
  for (; n > 0; --n, sums += 4, o += out_step) {
    int32x4_t v = vaddq_n_s32(vldrwq_s32(sums), init);
    if (fast) {
      v = vqrdmulhq_n_s32(v, mult);
      v = vrshlq_n_s32(vqaddq_s32(v, vshrq_n_s32(v, 31)), shift);
    } else {
      v = arm_requantize_mve(v, mult, shift);
    }
    v = vminq_s32(vmaxq_s32(vaddq_n_s32(v, output_offset), lo), hi);
    if (n > 1) {
      vstrbq_scatter_offset_s32(o, out_rows, v);
    } else {
      vstrbq_scatter_offset_p_s32(o, out_rows, v, tail);
    }
  }
  return sums;
}

/* One channel's outputs from its sums plus `init`, column by column. */
static __attribute__((noinline)) void dk_dwm_store(
    const int32_t *sums, int8_t *out, const int32_t channels, const int32_t init,
    const int32_t mult, const int32_t shift, const int32_t out_h, const int32_t out_w,
    const uint32x4_t out_rows, const int32_t out_step, const int32_t output_offset,
    const int32_t act_min, const int32_t act_max) {
  const int32x4_t lo = vdupq_n_s32(act_min), hi = vdupq_n_s32(act_max);
  const int32_t groups = (out_h + 3) / 4;
  const mve_pred16_t tail = vctp32q((uint32_t)(out_h - 4 * (groups - 1)));
  for (int32_t x = 0; x < out_w; ++x, out += channels) {
    if (shift < 0) {
      sums = dk_dwm_outputs(sums, out, groups, tail, init, mult, shift, out_rows, out_step,
                            output_offset, lo, hi, 1);
    } else {
      sums = dk_dwm_outputs(sums, out, groups, tail, init, mult, shift, out_rows, out_step,
                            output_offset, lo, hi, 0);
    }
  }
}

/* A block's four channels into their planes of the buffer: a gather of one input word (the
 * four channels) from each of four rows, then its bytes to the four planes. */
static __attribute__((noinline)) void dk_dwm_fill(const int8_t *in, int8_t *interior,
                                                  const int32_t channels, const int32_t in_h,
                                                  const int32_t in_w, const uint32x4_t in_rows,
                                                  const int32_t in_step) {
  for (int32_t x = 0; x < in_w; ++x, in += channels, interior += DK_DWM_COLUMN) {
    const int8_t *src = in;
    int8_t *dst = interior;
    for (int32_t left = in_h; left > 0; left -= 4, src += in_step, dst += 4) {
      const mve_pred16_t rows = vctp32q((uint32_t)left);
      const int32x4_t v = vldrwq_gather_offset_z_s32((const int32_t *)src, in_rows, rows);
      vstrbq_p_s32(dst, v, rows);
      vstrbq_p_s32(dst + DK_DWM_PLANE, vshrq_n_s32(v, 8), rows);
      vstrbq_p_s32(dst + 2 * DK_DWM_PLANE, vshrq_n_s32(v, 16), rows);
      vstrbq_p_s32(dst + 3 * DK_DWM_PLANE, vshrq_n_s32(v, 24), rows);
    }
  }
}

void dk_depthwise_conv_3x3_mve_s8(const cmsis_nn_dw_conv_params *dw_conv_params,
                                  const cmsis_nn_per_channel_quant_params *quant_params,
                                  const cmsis_nn_dims *input_dims, const int8_t *input_data,
                                  const int8_t *filter_data, const int32_t *bias_data,
                                  const cmsis_nn_dims *output_dims, int8_t *output_data) {
  int8_t buf[DK_DWM_BUF_BYTES] __attribute__((aligned(4)));
  int32_t sums[DK_DWM_SUMS] __attribute__((aligned(8)));
  const int32_t C = input_dims->c, H = input_dims->h, W = input_dims->w;
  const int32_t Ho = output_dims->h, Wo = output_dims->w, groups = (Ho + 3) / 4;
  const int32_t pad_top = dw_conv_params->padding.h, pad_left = dw_conv_params->padding.w;
  const int32_t input_offset = dw_conv_params->input_offset;
  const int32_t in_row = W * C, out_row = Wo * C;
  /* Byte offsets of four rows: of the input (gathers) and of the output (scatters). */
  const uint32x4_t in_rows = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)in_row);
  const uint32x4_t out_rows = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)out_row);

  /* The padding, kept: each block writes only the map's own rows and columns. */
  memset(buf, (int8_t)-input_offset, sizeof(buf));
  for (int32_t g = 0; g < C; g += DK_DWM_BLOCK) {
    dk_dwm_fill(input_data + g, buf + pad_left * DK_DWM_COLUMN + pad_top, C, H, W, in_rows,
                4 * in_row);
    for (int32_t k = 0; k < DK_DWM_BLOCK; ++k) {
      const int32_t c = g + k;
      const int8_t *f = filter_data + c;
      int32_t sum_w = 0;
      for (int32_t tap = 0; tap < 9; ++tap) {
        sum_w += f[tap * C];
      }
      const int32_t bias = bias_data != NULL ? bias_data[c] : 0;
      /* bias + input_offset x (sum of the weights) + sum of x w over the padded window: the
       * padding's x is -input_offset, so this is bias + sum of (x + input_offset) w over the
       * taps on the map, CMSIS-NN's sum. */
      const int32_t init =
          (int32_t)((uint32_t)bias + (uint32_t)input_offset * (uint32_t)sum_w);
      dk_dwm_sums(buf + k * DK_DWM_PLANE, sums, f, C, groups, Wo);
      dk_dwm_store(sums, output_data + c, C, init, quant_params->multiplier[c],
                   quant_params->shift[c], Ho, Wo, out_rows, 4 * out_row,
                   dw_conv_params->output_offset, dw_conv_params->activation.min,
                   dw_conv_params->activation.max);
    }
  }
}

#endif /* DK_DEPTHWISE_3X3_MVE */
