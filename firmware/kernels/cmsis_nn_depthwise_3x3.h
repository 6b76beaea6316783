/*
 * cmsis_nn_depthwise_3x3.h: deploykit's int8 3x3 depthwise convolution, one implementation per
 * Cortex-M vector extension: cmsis_nn_depthwise_3x3_mve.c with MVE (the M55, M85) and
 * cmsis_nn_depthwise_3x3_dsp.c with the DSP extension and no MVE (the M33, M4, M7); each file
 * says how it works. Either gives CMSIS-NN's arm_depthwise_conv_wrapper_s8 results bit for bit
 * and runs a layer written over its own input (output_data == input_data) in one call, so
 * dk_depthwise_conv_wrapper_s8 (cmsis_nn_in_place.c) calls it for the layers of its domain, in
 * place or not, instead of CMSIS-NN's kernel (in bands of rows when in place).
 */
#ifndef DK_CMSIS_NN_DEPTHWISE_3X3_H
#define DK_CMSIS_NN_DEPTHWISE_3X3_H

#include "arm_nnfunctions.h"
#include "arm_nnsupportfunctions.h" /* ARM_MATH_DSP, ARM_MATH_MVEI */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ARM_MATH_MVEI) || defined(ARM_MATH_DSP)
#define DK_DEPTHWISE_3X3 1

/* The part of the domain both implementations share: batch 1, channel multiplier 1, a
 * multiple of 4 channels, a 3x3 filter, dilation 1, stride 1, padding 0 or 1 on each axis. */
static inline int dk_depthwise_conv_3x3_s8_shape(const cmsis_nn_dw_conv_params *p,
                                                 const cmsis_nn_dims *in,
                                                 const cmsis_nn_dims *filter,
                                                 const cmsis_nn_dims *out) {
  return p->ch_mult == 1 && in->n == 1 && out->n == 1 && in->c == out->c && in->c >= 4 &&
         in->c % 4 == 0 && filter->h == 3 && filter->w == 3 && p->dilation.h == 1 &&
         p->dilation.w == 1 && p->stride.h == 1 && p->stride.w == 1 && p->padding.h >= 0 &&
         p->padding.h <= 1 && p->padding.w >= 0 && p->padding.w <= 1 && in->h >= 1 &&
         in->w >= 1 && out->h == in->h + 2 * p->padding.h - 2 &&
         out->w == in->w + 2 * p->padding.w - 2 && out->h >= 1 && out->w >= 1;
}

/* 1 when dk_depthwise_conv_3x3_s8 runs this layer: batch 1, channel multiplier 1, a multiple
 * of 4 channels, a 3x3 filter, dilation 1, stride 1, padding 0 or 1 on each axis, and a small
 * map: with MVE a padded input of at most 32 rows by 9 columns, with DSP output rows of at
 * most 7 pixels (its buffer holds 4 channels of 9 input columns by 28 rows). DS-CNN's 25x5
 * maps, keyword-spotting shapes. readers/cmsis_nn_kernels.py mirrors both (dk_mve_3x3_applies,
 * dk_dsp_3x3_applies). */
int dk_depthwise_conv_3x3_s8_applies(const cmsis_nn_dw_conv_params *dw_conv_params,
                                     const cmsis_nn_dims *input_dims,
                                     const cmsis_nn_dims *filter_dims,
                                     const cmsis_nn_dims *output_dims);

/* arm_depthwise_conv_wrapper_s8's results for a layer in that domain, output_data ==
 * input_data allowed, in one call. Its scratch is ctx's buffer when that is large enough (an
 * in-place layer's ring), else on the stack: with MVE a channel's sums (0.9 KB) and four
 * channels of the padded map (1.1 KB); with DSP a buffer of (output width + 2) x 224 B, and
 * its sums take another 0.7 KB of stack. bias_data may be NULL. */
void dk_depthwise_conv_3x3_s8(const cmsis_nn_context *ctx,
                              const cmsis_nn_dw_conv_params *dw_conv_params,
                              const cmsis_nn_per_channel_quant_params *quant_params,
                              const cmsis_nn_dims *input_dims, const int8_t *input_data,
                              const int8_t *filter_data, const int32_t *bias_data,
                              const cmsis_nn_dims *output_dims, int8_t *output_data);

#else
#define DK_DEPTHWISE_3X3 0
#endif

#ifdef __cplusplus
}
#endif

#endif /* DK_CMSIS_NN_DEPTHWISE_3X3_H */
