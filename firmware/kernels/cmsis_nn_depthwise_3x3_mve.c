/*
 * cmsis_nn_depthwise_3x3_mve.c: a direct int8 3x3 depthwise convolution for MVE, with the
 * results of CMSIS-NN's arm_depthwise_conv_wrapper_s8 bit for bit.
 *
 * CMSIS-NN's MVE path (arm_depthwise_conv_s8_opt) copies every output pixel's 3x3 window into
 * an im2col buffer, a copy or fill per tap, before its dot products (on DS-CNN's 3x3 layers 2.4
 * instructions per MAC on qemu-an547, with the bands of an in-place layer). This one:
 *
 * - Takes a block of four channels at a time and gathers its input into a buffer on the stack,
 *   one plane per channel, column by column with a fixed 32 bytes between columns: one VLDRW
 *   gather of the block's word from four rows, its four bytes stored to the four planes. The
 *   padding around the map holds -input_offset (the input zero point), as CMSIS-NN's im2col
 *   does: a padding tap adds (x + input_offset) x w = 0.
 * - Then one channel at a time, four vertically adjacent output pixels of a column in the four
 *   int32 lanes: each tap is a VLDRB.S32 from the plane (a fixed immediate offset) and a VMLA
 *   by the tap's weight, a scalar in a core register; a buffer column's loads serve the up to
 *   three output columns that read it (dk_dwm_columns3). The sums start at bias +
 *   input_offset x (sum of the weights): the same int32 as CMSIS-NN's bias + sum of
 *   (x + input_offset) x w over the taps on the map (modulo 2^32, no saturation in between).
 * - The sums go to a small array, then arm_requantize_mve with the channel's multiplier and
 *   shift, the output offset and the clamp, and one VSTRB scatter to the four output rows
 *   (predicated on the last rows of a column): CMSIS-NN's arithmetic, so its outputs.
 * - A layer written over its own input: a block's outputs are written only over its own input,
 *   which is in the buffer by then, so any layer of the domain runs in one call, each channel's
 *   set-up (weights, bias, quantization) once.
 *
 * Gathers: one per four input words (the fill); the multiply loops load contiguously.
 *
 * tests/integration/test_depthwise_3x3_dsp_qemu.py runs layers inside and outside this domain
 * on qemu-an547 against the host's reference (CMSIS-NN's own C code).
 */
#include "cmsis_nn_depthwise_3x3.h"

#if DK_DEPTHWISE_3X3 && defined(ARM_MATH_MVEI) /* cmsis_nn_depthwise_3x3_dsp.c without */

#include <string.h>

#define DK_DWM_BLOCK 4        /* channels per block: the four bytes of an input word */
#define DK_DWM_COLUMN 32      /* bytes between buffer columns: padded rows per column */
#define DK_DWM_MAX_COLUMNS 9  /* padded columns: output rows of up to 7 pixels */
#define DK_DWM_PLANE (DK_DWM_MAX_COLUMNS * DK_DWM_COLUMN) /* bytes per channel */
/* A column's last group of four rows reads up to 3 rows past the padded map. */
#define DK_DWM_BUF_BYTES (DK_DWM_BLOCK * DK_DWM_PLANE + 4)
/* One channel's sums: columns of DK_DWM_COLUMN, as the buffer's. */
#define DK_DWM_SUMS ((DK_DWM_MAX_COLUMNS - 2) * DK_DWM_COLUMN)

int dk_depthwise_conv_3x3_s8_applies(const cmsis_nn_dw_conv_params *dw_conv_params,
                                     const cmsis_nn_dims *input_dims,
                                     const cmsis_nn_dims *filter_dims,
                                     const cmsis_nn_dims *output_dims) {
  return dk_depthwise_conv_3x3_s8_shape(dw_conv_params, input_dims, filter_dims, output_dims) &&
         input_dims->h + 2 * dw_conv_params->padding.h <= DK_DWM_COLUMN &&
         input_dims->w + 2 * dw_conv_params->padding.w <= DK_DWM_MAX_COLUMNS;
}

/* The sums of `groups` groups of four rows of 3 (dk_dwm_columns3) or 2 (dk_dwm_columns2)
 * adjacent output columns of one channel: init + sum of x w over the padded window. `p` is the
 * first column's buffer column, `s` its sums (the next columns' DK_DWM_COLUMN words on), `w`
 * the channel's weights (tap ky * 3 + kx). Each buffer column's three loads serve the up to
 * three output columns that read it: per group of four rows, 15 loads, 27 multiplies and 3
 * stores for 3 columns (12, 18 and 2 for 2), the first multiply of a column a VMLAS that adds
 * init. In assembly: GCC 12 spills the weights from the core registers and moves the sums
 * between vector registers. The loads' immediate offsets reach +-127 bytes: from the middle
 * column (2 on). */
#define DK_DWM_ASM_OPERANDS                                                                    \
  : [p] "+r"(p), [s] "+r"(s), [n] "+r"(groups)                                                 \
  : [w0] "r"(w[0]), [init] "r"(init), [w1] "r"(w[1]), [w2] "r"(w[2]), [w3] "r"(w[3]),         \
    [w4] "r"(w[4]), [w5] "r"(w[5]), [w6] "r"(w[6]), [w7] "r"(w[7]), [w8] "r"(w[8])            \
  : "q0", "q1", "q2", "q3", "q4", "q5", "q6", "memory", "cc"

static __attribute__((noinline)) void dk_dwm_columns3(const int8_t *p, int32_t *s,
                                                       const int32_t *w, int32_t groups,
                                                       const int32_t init) {
  p += 2 * DK_DWM_COLUMN;
  __asm__ volatile(
      "vdup.32 q6, %[w0]\n"
      "1:\n"
      "vldrb.s32 q0, [%[p], #-64]\n"
      "vmlas.s32 q0, q6, %[init]\n"
      "vldrb.s32 q3, [%[p], #-63]\n"
      "vmla.s32 q0, q3, %[w3]\n"
      "vldrb.s32 q4, [%[p], #-62]\n"
      "vmla.s32 q0, q4, %[w6]\n"
      "vldrb.s32 q1, [%[p], #-32]\n"
      "vmla.s32 q0, q1, %[w1]\n"
      "vmlas.s32 q1, q6, %[init]\n"
      "vldrb.s32 q5, [%[p], #-31]\n"
      "vmla.s32 q1, q5, %[w3]\n"
      "vmla.s32 q0, q5, %[w4]\n"
      "vldrb.s32 q3, [%[p], #-30]\n"
      "vmla.s32 q1, q3, %[w6]\n"
      "vmla.s32 q0, q3, %[w7]\n"
      "vldrb.s32 q2, [%[p], #0]\n"
      "vmla.s32 q1, q2, %[w1]\n"
      "vmla.s32 q0, q2, %[w2]\n"
      "vmlas.s32 q2, q6, %[init]\n"
      "vldrb.s32 q4, [%[p], #1]\n"
      "vmla.s32 q2, q4, %[w3]\n"
      "vmla.s32 q1, q4, %[w4]\n"
      "vmla.s32 q0, q4, %[w5]\n"
      "vldrb.s32 q5, [%[p], #2]\n"
      "vmla.s32 q2, q5, %[w6]\n"
      "vmla.s32 q1, q5, %[w7]\n"
      "vmla.s32 q0, q5, %[w8]\n"
      "vldrb.s32 q3, [%[p], #32]\n"
      "vmla.s32 q2, q3, %[w1]\n"
      "vmla.s32 q1, q3, %[w2]\n"
      "vldrb.s32 q4, [%[p], #33]\n"
      "vmla.s32 q2, q4, %[w4]\n"
      "vmla.s32 q1, q4, %[w5]\n"
      "vldrb.s32 q5, [%[p], #34]\n"
      "vmla.s32 q2, q5, %[w7]\n"
      "vmla.s32 q1, q5, %[w8]\n"
      "vldrb.s32 q3, [%[p], #64]\n"
      "vmla.s32 q2, q3, %[w2]\n"
      "vldrb.s32 q4, [%[p], #65]\n"
      "vmla.s32 q2, q4, %[w5]\n"
      "vldrb.s32 q5, [%[p], #66]\n"
      "vmla.s32 q2, q5, %[w8]\n"
      "adds %[p], #4\n"
      "vstrw.32 q2, [%[s], #256]\n"
      "vstrw.32 q1, [%[s], #128]\n"
      "subs %[n], #1\n"
      "vstrw.32 q0, [%[s]], #16\n"
      "bne 1b\n" DK_DWM_ASM_OPERANDS);
}

static __attribute__((noinline)) void dk_dwm_columns2(const int8_t *p, int32_t *s,
                                                       const int32_t *w, int32_t groups,
                                                       const int32_t init) {
  p += 2 * DK_DWM_COLUMN;
  __asm__ volatile(
      "vdup.32 q6, %[w0]\n"
      "1:\n"
      "vldrb.s32 q0, [%[p], #-64]\n"
      "vmlas.s32 q0, q6, %[init]\n"
      "vldrb.s32 q3, [%[p], #-63]\n"
      "vmla.s32 q0, q3, %[w3]\n"
      "vldrb.s32 q4, [%[p], #-62]\n"
      "vmla.s32 q0, q4, %[w6]\n"
      "vldrb.s32 q1, [%[p], #-32]\n"
      "vmla.s32 q0, q1, %[w1]\n"
      "vmlas.s32 q1, q6, %[init]\n"
      "vldrb.s32 q5, [%[p], #-31]\n"
      "vmla.s32 q1, q5, %[w3]\n"
      "vmla.s32 q0, q5, %[w4]\n"
      "vldrb.s32 q3, [%[p], #-30]\n"
      "vmla.s32 q1, q3, %[w6]\n"
      "vmla.s32 q0, q3, %[w7]\n"
      "vldrb.s32 q4, [%[p], #0]\n"
      "vmla.s32 q1, q4, %[w1]\n"
      "vmla.s32 q0, q4, %[w2]\n"
      "vldrb.s32 q5, [%[p], #1]\n"
      "vmla.s32 q1, q5, %[w4]\n"
      "vmla.s32 q0, q5, %[w5]\n"
      "vldrb.s32 q3, [%[p], #2]\n"
      "vmla.s32 q1, q3, %[w7]\n"
      "vmla.s32 q0, q3, %[w8]\n"
      "vldrb.s32 q4, [%[p], #32]\n"
      "vmla.s32 q1, q4, %[w2]\n"
      "vldrb.s32 q5, [%[p], #33]\n"
      "vmla.s32 q1, q5, %[w5]\n"
      "vldrb.s32 q3, [%[p], #34]\n"
      "vmla.s32 q1, q3, %[w8]\n"
      "adds %[p], #4\n"
      "vstrw.32 q1, [%[s], #128]\n"
      "subs %[n], #1\n"
      "vstrw.32 q0, [%[s]], #16\n"
      "bne 1b\n" DK_DWM_ASM_OPERANDS);
}

/* An output vector from its sum: arm_requantize_mve with the channel's multiplier and shift,
 * the output offset and the clamp. Fast (the shift a right shift, as in most layers): its left
 * shift of 0 left out, and its rounding fixup (the remainder of a negative value,
 * (v & -exponent) >> 31) is v >> 31. */
static inline __attribute__((always_inline)) int32x4_t dk_dwm_requantize(
    int32x4_t v, const int32_t mult, const int32_t shift, const int32_t output_offset,
    const int32x4_t lo, const int32x4_t hi, const int fast) {
  if (fast) {
    v = vqrdmulhq_n_s32(v, mult);
    v = vrshlq_n_s32(vqaddq_s32(v, vshrq_n_s32(v, 31)), shift);
  } else {
    v = arm_requantize_mve(v, mult, shift);
  }
  return vminq_s32(vmaxq_s32(vaddq_n_s32(v, output_offset), lo), hi);
}

/* The outputs of the channel's columns from their sums, each column's `groups` groups of four
 * rows scattered to four output rows, its last group's predicated on `tail`. */
static inline __attribute__((always_inline)) void dk_dwm_outputs(
    const int32_t *sums, int8_t *out, const int32_t channels, const int32_t out_w,
    const int32_t groups, const mve_pred16_t tail, const int32_t mult, const int32_t shift,
    const uint32x4_t out_rows, const int32_t out_step, const int32_t output_offset,
    const int32x4_t lo, const int32x4_t hi, const int fast) {
  for (int32_t x = 0; x < out_w; ++x, out += channels, sums += DK_DWM_COLUMN) {
    const int32_t *v = sums;
    int8_t *o = out;
    for (int32_t n = groups - 1; n > 0; --n, v += 4, o += out_step) {
      vstrbq_scatter_offset_s32(o, out_rows, dk_dwm_requantize(vldrwq_s32(v), mult, shift,
                                                               output_offset, lo, hi, fast));
    }
    vstrbq_scatter_offset_p_s32(
        o, out_rows, dk_dwm_requantize(vldrwq_s32(v), mult, shift, output_offset, lo, hi, fast),
        tail);
  }
}

/* What the channels of a layer share. */
typedef struct dk_dwm_layer {
  int32_t channels, out_h, out_w, groups, out_step, input_offset, output_offset;
  uint32x4_t out_rows; /* byte offsets of four output rows */
  int32x4_t lo, hi;    /* the activation's range */
  mve_pred16_t tail;   /* the rows of a column's last group */
} dk_dwm_layer_t;

/* One channel: its sums from its plane `buf` of the buffer, then its outputs from `out` on.
 * `f` is its first weight (weights `channels` bytes apart). */
static __attribute__((noinline)) void dk_dwm_channel(const dk_dwm_layer_t *l, const int8_t *buf,
                                                     int8_t *out, const int8_t *f,
                                                     const int32_t bias, const int32_t mult,
                                                     const int32_t shift, int32_t *sums) {
  const int32_t C = l->channels, groups = l->groups, out_w = l->out_w;
  int32_t w[9];
  int32_t sum_w = 0;
  for (int32_t tap = 0; tap < 9; ++tap) {
    w[tap] = f[tap * C];
    sum_w += w[tap];
  }
  /* bias + input_offset x (sum of the weights) + sum of x w over the padded window: the
   * padding's x is -input_offset, so this is bias + sum of (x + input_offset) w over the taps
   * on the map, CMSIS-NN's sum. */
  const int32_t init = (int32_t)((uint32_t)bias + (uint32_t)l->input_offset * (uint32_t)sum_w);
  /* Columns 3 at a time, the last 2 or 4 two at a time (a map one column wide: 2, the second
   * one's sums, from the buffer's padding or its next plane, unused). */
  int32_t x = 0;
  for (; out_w - x >= 5 || out_w - x == 3; x += 3) {
    dk_dwm_columns3(buf + x * DK_DWM_COLUMN, sums + x * DK_DWM_COLUMN, w, groups, init);
  }
  for (; x < out_w; x += 2) {
    dk_dwm_columns2(buf + x * DK_DWM_COLUMN, sums + x * DK_DWM_COLUMN, w, groups, init);
  }
  if (shift < 0) {
    dk_dwm_outputs(sums, out, C, out_w, groups, l->tail, mult, shift, l->out_rows, l->out_step,
                   l->output_offset, l->lo, l->hi, 1);
  } else {
    dk_dwm_outputs(sums, out, C, out_w, groups, l->tail, mult, shift, l->out_rows, l->out_step,
                   l->output_offset, l->lo, l->hi, 0);
  }
}

/* A block's four channels into their planes of the buffer: a gather of one input word (the
 * four channels) from each of four rows, then its bytes to the four planes; the last group of
 * a column predicated on its rows. */
static inline __attribute__((always_inline)) void dk_dwm_put(const int8_t *src, int8_t *dst,
                                                             const uint32x4_t in_rows,
                                                             const mve_pred16_t rows) {
  const int32x4_t v = vldrwq_gather_offset_z_s32((const int32_t *)src, in_rows, rows);
  vstrbq_p_s32(dst, v, rows);
  vstrbq_p_s32(dst + DK_DWM_PLANE, vshrq_n_s32(v, 8), rows);
  vstrbq_p_s32(dst + 2 * DK_DWM_PLANE, vshrq_n_s32(v, 16), rows);
  vstrbq_p_s32(dst + 3 * DK_DWM_PLANE, vshrq_n_s32(v, 24), rows);
}

static __attribute__((noinline)) void dk_dwm_fill(const int8_t *in, int8_t *interior,
                                                  const int32_t channels, const int32_t in_h,
                                                  const int32_t in_w, const uint32x4_t in_rows,
                                                  const int32_t in_step) {
  const int32_t full = (in_h - 1) / 4; /* groups of four rows before the last */
  const mve_pred16_t last = vctp32q((uint32_t)(in_h - 4 * full));
  for (int32_t x = 0; x < in_w; ++x, in += channels, interior += DK_DWM_COLUMN) {
    const int8_t *src = in;
    int8_t *dst = interior;
    for (int32_t g = full; g > 0; --g, src += in_step, dst += 4) {
      const int32x4_t v = vldrwq_gather_offset_s32((const int32_t *)src, in_rows);
      vstrbq_s32(dst, v);
      vstrbq_s32(dst + DK_DWM_PLANE, vshrq_n_s32(v, 8));
      vstrbq_s32(dst + 2 * DK_DWM_PLANE, vshrq_n_s32(v, 16));
      vstrbq_s32(dst + 3 * DK_DWM_PLANE, vshrq_n_s32(v, 24));
    }
    dk_dwm_put(src, dst, in_rows, last);
  }
}

/* The sums, then the buffer: the scratch the layer takes. */
#define DK_DWM_SCRATCH_BYTES (DK_DWM_SUMS * 4 + DK_DWM_BUF_BYTES)

/* The layer with `scratch` (DK_DWM_SCRATCH_BYTES, 4-byte aligned) for its sums and buffer. */
static __attribute__((noinline)) void dk_dwm_run(
    const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const int8_t *filter_data, const int32_t *bias_data,
    const cmsis_nn_dims *output_dims, int8_t *output_data, int32_t *scratch) {
  int32_t *const sums = scratch;
  int8_t *const buf = (int8_t *)(scratch + DK_DWM_SUMS);
  const int32_t C = input_dims->c, H = input_dims->h, W = input_dims->w;
  const int32_t pad_top = dw_conv_params->padding.h, pad_left = dw_conv_params->padding.w;
  const int32_t in_row = W * C;
  dk_dwm_layer_t l;
  l.channels = C;
  l.out_h = output_dims->h;
  l.out_w = output_dims->w;
  l.groups = (l.out_h + 3) / 4;
  l.out_step = 4 * l.out_w * C;
  l.input_offset = dw_conv_params->input_offset;
  l.output_offset = dw_conv_params->output_offset;
  /* Byte offsets of four rows: of the input (gathers) and of the output (scatters). */
  const uint32x4_t in_rows = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)in_row);
  l.out_rows = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)(l.out_w * C));
  l.lo = vdupq_n_s32(dw_conv_params->activation.min);
  l.hi = vdupq_n_s32(dw_conv_params->activation.max);
  l.tail = vctp32q((uint32_t)(l.out_h - 4 * (l.groups - 1)));

  /* The padding, kept: each block writes only the map's own rows and columns. */
  memset(buf, (int8_t)-l.input_offset, DK_DWM_BUF_BYTES);
  for (int32_t g = 0; g < C; g += DK_DWM_BLOCK) {
    dk_dwm_fill(input_data + g, buf + pad_left * DK_DWM_COLUMN + pad_top, C, H, W, in_rows,
                4 * in_row);
    for (int32_t k = 0; k < DK_DWM_BLOCK; ++k) {
      const int32_t c = g + k;
      dk_dwm_channel(&l, buf + k * DK_DWM_PLANE, output_data + c, filter_data + c,
                     bias_data != NULL ? bias_data[c] : 0, quant_params->multiplier[c],
                     quant_params->shift[c], sums);
    }
  }
}

/* The layer with its scratch on the stack. */
static __attribute__((noinline)) void dk_dwm_run_on_stack(
    const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const int8_t *filter_data, const int32_t *bias_data,
    const cmsis_nn_dims *output_dims, int8_t *output_data) {
  int32_t scratch[DK_DWM_SCRATCH_BYTES / 4] __attribute__((aligned(8)));
  dk_dwm_run(dw_conv_params, quant_params, input_dims, input_data, filter_data, bias_data,
             output_dims, output_data, scratch);
}

void dk_depthwise_conv_3x3_s8(const cmsis_nn_context *ctx,
                              const cmsis_nn_dw_conv_params *dw_conv_params,
                              const cmsis_nn_per_channel_quant_params *quant_params,
                              const cmsis_nn_dims *input_dims, const int8_t *input_data,
                              const int8_t *filter_data, const int32_t *bias_data,
                              const cmsis_nn_dims *output_dims, int8_t *output_data) {
  if (ctx != NULL && ctx->buf != NULL && ctx->size >= DK_DWM_SCRATCH_BYTES &&
      ((uintptr_t)ctx->buf & 3u) == 0) {
    dk_dwm_run(dw_conv_params, quant_params, input_dims, input_data, filter_data, bias_data,
               output_dims, output_data, (int32_t *)ctx->buf);
  } else {
    dk_dwm_run_on_stack(dw_conv_params, quant_params, input_dims, input_data, filter_data,
                        bias_data, output_dims, output_data);
  }
}

#endif /* DK_DEPTHWISE_3X3 && ARM_MATH_MVEI */
