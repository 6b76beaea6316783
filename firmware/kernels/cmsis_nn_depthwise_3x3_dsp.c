/*
 * cmsis_nn_depthwise_3x3_dsp.c: a direct int8 3x3 depthwise convolution for the DSP extension
 * (no MVE), with the results of CMSIS-NN's arm_depthwise_conv_wrapper_s8 bit for bit.
 *
 * CMSIS-NN's arm_depthwise_conv_3x3_s8 walks the output pixel by pixel, four channels at a time,
 * one multiply per MAC and a requantization with its shifts and masks per output (8.4
 * instructions per MAC on DS-CNN's 3x3 layers on qemu-an505). This one takes a block of four
 * channels at a time, and in it one channel and one output column at a time:
 *
 * - The block's input is copied once to a stack buffer as int16 (x + input_offset), 0 where
 *   the window leaves the map (padding), in columns: one 32-bit word holds two vertically
 *   adjacent taps of one channel. A channel's 3x3 weights are six such pairs, (w[0][kx],
 *   w[1][kx]) and (w[1][kx], w[2][kx]); two vertically adjacent outputs read the words
 *   (y, y+1) and (y+2, y+3) of each window column and take SMLAD + SMLABT and SMLATB + SMLAD
 *   of them: 4 multiplies and 2 loads for 6 MACs. A column's three window columns are a fixed
 *   distance apart in the buffer (immediate offsets), so the loop holds the six weights in
 *   registers. The same (x + input_offset) x w products as CMSIS-NN's, the padding taps adding
 *   0: the same int32 sums.
 * - The sums of a column go to a small array, then are requantized with the channel's
 *   constants, set up once per block: when the shift is a right shift of 1..22 and the bias is
 *   below 2^29 (the sum then fits in 30 bits), the weights and bias are doubled, so that SMMULR
 *   (rounded high word) of the doubled sum is arm_nn_doubling_high_mult_no_sat, and CMSIS-NN's
 *   rounding division by 2^e (remainder against a threshold one higher for a negative value)
 *   plus the output offset is (v + 2^(e-1) + (offset << e) - (v < 0)) >> e, exactly; with
 *   the whole int8 range as activation, SSAT is the clamp. Other channels use
 *   arm_nn_requantize itself.
 * - A layer written over its own input: a block reads and writes only its own four channels,
 *   and the buffer holds the block's input rows before their outputs are written. A map of
 *   more than 26 rows goes in strips of rows, a strip's last input rows kept in the buffer
 *   for the next one.
 *
 * tests/integration/test_depthwise_3x3_dsp_qemu.py runs layers inside and outside this domain
 * on qemu-an505 and qemu-an547 against the host's reference (CMSIS-NN's own C code).
 */
#include "cmsis_nn_depthwise_3x3.h"

#if DK_DEPTHWISE_3X3 && !defined(ARM_MATH_MVEI) /* cmsis_nn_depthwise_3x3_mve.c with MVE */

#include <arm_acle.h>
#include <string.h>

/* The buffer: per buffer column (output column + 2) and channel of the block, 28 rows of
 * int16 (14 words, pairs of rows): a column's three window columns are 56 words apart, so each
 * is loaded at an immediate offset. Up to 2 KB: rows of up to 7 output pixels, strips of up to
 * 26 output rows (DS-CNN's 25x5 map in one strip: 1,568 B, which its in-place ring holds). */
#define DK_DW3_BLOCK 4
#define DK_DW3_PAIRS 14
#define DK_DW3_COLUMN (DK_DW3_BLOCK * DK_DW3_PAIRS) /* words between buffer columns */
#define DK_DW3_MAX_COLUMNS 9
#define DK_DW3_BUF_WORDS (DK_DW3_MAX_COLUMNS * DK_DW3_COLUMN)
#define DK_DW3_MAX_ROWS (2 * (DK_DW3_PAIRS - 1)) /* output rows per strip */

static inline int32_t dk_dw3_read_s8x4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* (a.lo, b.lo) and (a.hi, b.hi) as int16 pairs. */
static inline int32_t dk_dw3_pack_lo(int32_t a, int32_t b) {
  int32_t r;
  __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
static inline int32_t dk_dw3_pack_hi(int32_t a, int32_t b) {
  int32_t r;
  __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(b), "r"(a));
  return r;
}
static inline int32_t dk_dw3_sxtab16_ror8(int32_t a, int32_t b) {
  int32_t r;
  __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
/* The rounded high word of a x b: (a x b + 2^31) >> 32. */
static inline int32_t dk_dw3_smmulr(int32_t a, int32_t b) {
  int32_t r;
  __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

/* The four channels' words of one pair of rows at one column, from the two rows' 4 bytes (0
 * for a row off the map). */
static inline void dk_dw3_put(int32_t *dst, int32_t u, int32_t v, int32_t off2, int valid_u,
                              int valid_v) {
  const int32_t pu = valid_u ? __sxtab16(off2, u) : 0;
  const int32_t qu = valid_u ? dk_dw3_sxtab16_ror8(off2, u) : 0;
  const int32_t pv = valid_v ? __sxtab16(off2, v) : 0;
  const int32_t qv = valid_v ? dk_dw3_sxtab16_ror8(off2, v) : 0;
  dst[0] = dk_dw3_pack_lo(pu, pv);
  dst[DK_DW3_PAIRS] = dk_dw3_pack_lo(qu, qv);
  dst[2 * DK_DW3_PAIRS] = dk_dw3_pack_hi(pu, pv);
  dst[3 * DK_DW3_PAIRS] = dk_dw3_pack_hi(qu, qv);
}

typedef struct dk_dw3_channel {
  int32_t w[6]; /* (w0, w1) and (w1, w2) of window columns 0, 1, 2, doubled when fast */
  int32_t bias, mult, shift, round;
  int mode; /* DK_DW3_* */
} dk_dw3_channel_t;

#define DK_DW3_EXACT 0 /* arm_nn_requantize, offset, clamp */
#define DK_DW3_FAST 1  /* SMMULR of the doubled sum, one rounding shift, clamp */
#define DK_DW3_FAST_FULL 2 /* the same with the whole int8 range: SSAT */

/* Two words at q and q + 4 bytes (LDRD; GCC loads them one by one). */
#define DK_DW3_LOAD2(a, b, q, words)                                                            \
  __asm__("ldrd %0, %1, [%2, %3]" : "=r"(a), "=r"(b) : "r"(q), "i"(4 * (words)) : "memory")

/* The sums of `rows` output rows of `cols` output columns of one channel, column by column
 * (`rows` apart in `sums`): `q` is the channel's words in buffer column 0; a window's three
 * columns are DK_DW3_COLUMN words apart. Two rows at a time: words (y, y+1) and (y+2, y+3) of
 * each window column. */
static void dk_dw3_sums(const int32_t *w, const int32_t bias, const int32_t *q,
                        const int32_t rows, const int32_t cols, int32_t *sums) {
  const int32_t w00 = w[0], w01 = w[1], w10 = w[2], w11 = w[3], w20 = w[4], w21 = w[5];
  for (int32_t x = 0; x < cols; ++x, q += DK_DW3_COLUMN) {
    const int32_t *p = q;
    for (const int32_t *const end = q + (rows >> 1); p < end; ++p, sums += 2) {
      int32_t a0, b0, a1, b1, a2, b2;
      DK_DW3_LOAD2(a0, b0, p, 0);
      DK_DW3_LOAD2(a1, b1, p, DK_DW3_COLUMN);
      DK_DW3_LOAD2(a2, b2, p, 2 * DK_DW3_COLUMN);
      int32_t s0 = __smlad(a0, w00, bias);
      int32_t s1 = __smlatb(a0, w00, bias);
      s0 = __smlabt(b0, w01, s0);
      s1 = __smlad(b0, w01, s1);
      s0 = __smlad(a1, w10, s0);
      s1 = __smlatb(a1, w10, s1);
      s0 = __smlabt(b1, w11, s0);
      s1 = __smlad(b1, w11, s1);
      s0 = __smlad(a2, w20, s0);
      s1 = __smlatb(a2, w20, s1);
      s0 = __smlabt(b2, w21, s0);
      s1 = __smlad(b2, w21, s1);
      sums[0] = s0;
      sums[1] = s1;
    }
    if (rows & 1) {
      int32_t s0 = __smlad(p[0], w00, bias);
      s0 = __smlabt(p[1], w01, s0);
      s0 = __smlad(p[DK_DW3_COLUMN], w10, s0);
      s0 = __smlabt(p[DK_DW3_COLUMN + 1], w11, s0);
      s0 = __smlad(p[2 * DK_DW3_COLUMN], w20, s0);
      s0 = __smlabt(p[2 * DK_DW3_COLUMN + 1], w21, s0);
      *sums++ = s0;
    }
  }
}

/* ((a x b + 2^31) >> 32) + c. */
static inline int32_t dk_dw3_smmlar(int32_t a, int32_t b, int32_t c) {
  int32_t r;
  __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

/* One output from its sum. Fast: `sum` is doubled, `shift` is e and `round` 2^(e-1) +
 * (output_offset << e); round(sum x mult / 2^32) has the sign of the sum or is 0 (mult > 0),
 * and with v = 0 the sum's sign does not change the result, so the sum's sign stands for v's. */
static inline __attribute__((always_inline)) int32_t dk_dw3_output(
    const int32_t sum, const int32_t mult, const int32_t shift, const int32_t round,
    const int32_t output_offset, const int32_t act_min, const int32_t act_max, const int mode) {
  int32_t t;
  if (mode == DK_DW3_EXACT) {
    t = arm_nn_requantize(sum, mult, shift) + output_offset;
  } else {
    t = (dk_dw3_smmlar(sum, mult, round) + (sum >> 31)) >> shift;
  }
  if (mode == DK_DW3_FAST_FULL) {
    return __ssat(t, 8);
  }
  t = t < act_min ? act_min : t;
  return t > act_max ? act_max : t;
}

/* `cols` columns of `rows` outputs from their sums (column by column): rows `stride` bytes
 * apart, columns `step`. */
static inline __attribute__((always_inline)) void dk_dw3_store(
    const int32_t *sums, const int32_t rows, const int32_t cols, int8_t *out,
    const int32_t stride, const int32_t step, const dk_dw3_channel_t *ch,
    const int32_t output_offset, const int32_t act_min, const int32_t act_max, const int mode) {
  const int32_t mult = ch->mult, shift = ch->shift, round = ch->round;
  for (int32_t x = 0; x < cols; ++x, out += step) {
    int8_t *o = out;
    for (int32_t y = rows >> 1; y > 0; --y, sums += 2, o += 2 * stride) {
      const int32_t s0 = sums[0], s1 = sums[1];
      o[0] = (int8_t)dk_dw3_output(s0, mult, shift, round, output_offset, act_min, act_max,
                                   mode);
      o[stride] = (int8_t)dk_dw3_output(s1, mult, shift, round, output_offset, act_min,
                                        act_max, mode);
    }
    if (rows & 1) {
      *o = (int8_t)dk_dw3_output(*sums++, mult, shift, round, output_offset, act_min, act_max,
                                 mode);
    }
  }
}

int dk_depthwise_conv_3x3_s8_applies(const cmsis_nn_dw_conv_params *dw_conv_params,
                                     const cmsis_nn_dims *input_dims,
                                     const cmsis_nn_dims *filter_dims,
                                     const cmsis_nn_dims *output_dims) {
  return dk_depthwise_conv_3x3_s8_shape(dw_conv_params, input_dims, filter_dims, output_dims) &&
         output_dims->w + 2 <= DK_DW3_MAX_COLUMNS;
}

/* The layer with `buf` (DK_DW3_COLUMN words per buffer column) as the buffer. */
static __attribute__((noinline)) void dk_dw3_run(
    const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const int8_t *filter_data, const int32_t *bias_data,
    const cmsis_nn_dims *output_dims, int8_t *output_data, int32_t *buf) {
  int32_t sums[(DK_DW3_MAX_COLUMNS - 2) * DK_DW3_MAX_ROWS] __attribute__((aligned(8)));
  const int32_t C = input_dims->c, H = input_dims->h, W = input_dims->w;
  const int32_t Ho = output_dims->h, Wo = output_dims->w;
  const int32_t pad_top = dw_conv_params->padding.h, pad_left = dw_conv_params->padding.w;
  const int32_t Wp = Wo + 2;
  /* Buffer column x holds input column x - pad_left. */
  const int32_t first_x = pad_left, end_x = W + pad_left < Wp ? W + pad_left : Wp;
  const int32_t off = dw_conv_params->input_offset;
  const int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) | ((uint32_t)off << 16));
  const int32_t out_off = dw_conv_params->output_offset;
  const int32_t act_min = dw_conv_params->activation.min;
  const int32_t act_max = dw_conv_params->activation.max;
  const int32_t ostride = Wo * C, in_row = W * C;

  memset(buf, 0, sizeof(int32_t) * (size_t)(Wp * DK_DW3_COLUMN)); /* padding stays 0 */

  for (int32_t g = 0; g < C; g += DK_DW3_BLOCK) {
    dk_dw3_channel_t chans[DK_DW3_BLOCK];
    for (int32_t c = 0; c < DK_DW3_BLOCK; ++c) {
      dk_dw3_channel_t *ch = &chans[c];
      const int32_t shift = quant_params->shift[g + c];
      const int32_t bias = bias_data ? bias_data[g + c] : 0;
#if defined(CMSIS_NN_USE_SINGLE_ROUNDING)
      const int fast = 0;
#else
      const int fast = shift <= -1 && shift >= -22 && bias < (1 << 29) && bias > -(1 << 29) &&
                       quant_params->multiplier[g + c] > 0;
#endif
      const int32_t scale = fast ? 2 : 1;
      const int8_t *f = filter_data + g + c;
      for (int32_t kx = 0; kx < 3; ++kx) {
        const int32_t w0 = f[kx * C] * scale, w1 = f[(3 + kx) * C] * scale;
        const int32_t w2 = f[(6 + kx) * C] * scale;
        ch->w[2 * kx] = (int32_t)(((uint32_t)w0 & 0xFFFFu) | ((uint32_t)w1 << 16));
        ch->w[2 * kx + 1] = (int32_t)(((uint32_t)w1 & 0xFFFFu) | ((uint32_t)w2 << 16));
      }
      ch->bias = bias * scale;
      ch->mult = quant_params->multiplier[g + c];
      if (fast) {
        const int32_t e = -shift;
        ch->shift = e;
        ch->round = (int32_t)((1u << (e - 1)) + ((uint32_t)out_off << e));
        ch->mode = act_min == -128 && act_max == 127 ? DK_DW3_FAST_FULL : DK_DW3_FAST;
      } else {
        ch->shift = shift;
        ch->round = 0;
        ch->mode = DK_DW3_EXACT;
      }
    }
    for (int32_t r0 = 0; r0 < Ho; r0 += DK_DW3_MAX_ROWS) {
      const int32_t rows = Ho - r0 < DK_DW3_MAX_ROWS ? Ho - r0 : DK_DW3_MAX_ROWS;
      const int32_t pairs = (rows + 1) / 2 + 1;
      int32_t k0 = 0;
      if (r0 > 0) { /* the previous strip's last pair of rows: maybe written over since */
        for (int32_t i = 0; i < Wp * DK_DW3_BLOCK; ++i) {
          buf[i * DK_DW3_PAIRS] = buf[i * DK_DW3_PAIRS + DK_DW3_MAX_ROWS / 2];
        }
        k0 = 1;
      }
      /* Pairs [lo, hi) have both rows on the map; the others one or none. */
      int32_t lo = k0, hi;
      while (lo < pairs && r0 + 2 * lo - pad_top < 0) ++lo;
      for (hi = lo; hi < pairs && r0 + 2 * hi - pad_top + 1 < H; ++hi) {
      }
      for (int32_t x = first_x; x < end_x; ++x) {
        const int8_t *in = input_data + (x - pad_left) * C + g;
        int32_t *d = buf + x * DK_DW3_COLUMN;
        for (int32_t k = k0; k < pairs; ++k) {
          if (k == lo) {
            const int8_t *u = in + (r0 + 2 * lo - pad_top) * in_row;
            for (int32_t *dk = d + lo, *const end = d + hi; dk < end; ++dk, u += 2 * in_row) {
              dk_dw3_put(dk, dk_dw3_read_s8x4(u), dk_dw3_read_s8x4(u + in_row), off2, 1, 1);
            }
            k = hi;
            if (k >= pairs) break;
          }
          const int32_t iy = r0 + 2 * k - pad_top; /* input rows iy, iy + 1 */
          const int valid_u = iy >= 0 && iy < H, valid_v = iy + 1 >= 0 && iy + 1 < H;
          dk_dw3_put(d + k, valid_u ? dk_dw3_read_s8x4(in + iy * in_row) : 0,
                     valid_v ? dk_dw3_read_s8x4(in + (iy + 1) * in_row) : 0, off2, valid_u,
                     valid_v);
        }
      }
      for (int32_t c = 0; c < DK_DW3_BLOCK; ++c) {
        const dk_dw3_channel_t *ch = &chans[c];
        int8_t *o = output_data + r0 * ostride + g + c;
        dk_dw3_sums(ch->w, ch->bias, buf + c * DK_DW3_PAIRS, rows, Wo, sums);
        if (ch->mode == DK_DW3_FAST_FULL) {
          dk_dw3_store(sums, rows, Wo, o, ostride, C, ch, out_off, act_min, act_max,
                       DK_DW3_FAST_FULL);
        } else if (ch->mode == DK_DW3_FAST) {
          dk_dw3_store(sums, rows, Wo, o, ostride, C, ch, out_off, act_min, act_max,
                       DK_DW3_FAST);
        } else {
          dk_dw3_store(sums, rows, Wo, o, ostride, C, ch, out_off, act_min, act_max,
                       DK_DW3_EXACT);
        }
      }
    }
  }
}

/* The layer with its buffer on the stack. */
static __attribute__((noinline)) void dk_dw3_run_on_stack(
    const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const int8_t *filter_data, const int32_t *bias_data,
    const cmsis_nn_dims *output_dims, int8_t *output_data) {
  int32_t buf[DK_DW3_BUF_WORDS] __attribute__((aligned(8)));
  dk_dw3_run(dw_conv_params, quant_params, input_dims, input_data, filter_data, bias_data,
             output_dims, output_data, buf);
}

void dk_depthwise_conv_3x3_s8(const cmsis_nn_context *ctx,
                              const cmsis_nn_dw_conv_params *dw_conv_params,
                              const cmsis_nn_per_channel_quant_params *quant_params,
                              const cmsis_nn_dims *input_dims, const int8_t *input_data,
                              const int8_t *filter_data, const int32_t *bias_data,
                              const cmsis_nn_dims *output_dims, int8_t *output_data) {
  const int32_t need = (output_dims->w + 2) * DK_DW3_COLUMN * (int32_t)sizeof(int32_t);
  if (ctx != NULL && ctx->buf != NULL && ctx->size >= need && ((uintptr_t)ctx->buf & 3u) == 0) {
    dk_dw3_run(dw_conv_params, quant_params, input_dims, input_data, filter_data, bias_data,
               output_dims, output_data, (int32_t *)ctx->buf);
  } else {
    dk_dw3_run_on_stack(dw_conv_params, quant_params, input_dims, input_data, filter_data,
                        bias_data, output_dims, output_data);
  }
}

#endif /* DK_DEPTHWISE_3X3 && !ARM_MATH_MVEI */
