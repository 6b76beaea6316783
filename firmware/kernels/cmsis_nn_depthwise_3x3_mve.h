/*
 * cmsis_nn_depthwise_3x3_mve.h: an int8 3x3 depthwise convolution for Cortex-M cores with MVE
 * (the M55, M85), with the results of CMSIS-NN's arm_depthwise_conv_wrapper_s8 bit for bit
 * (cmsis_nn_depthwise_3x3_mve.c says how). It also runs a layer written over its own input
 * (output_data == input_data) in one call, so dk_depthwise_conv_wrapper_s8 (cmsis_nn_in_place.c)
 * calls it for the layers of its domain, in place or not, instead of CMSIS-NN's
 * arm_depthwise_conv_s8_opt (in bands of rows when in place).
 */
#ifndef DK_CMSIS_NN_DEPTHWISE_3X3_MVE_H
#define DK_CMSIS_NN_DEPTHWISE_3X3_MVE_H

#include "arm_nnfunctions.h"
#include "arm_nnsupportfunctions.h" /* ARM_MATH_MVEI */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ARM_MATH_MVEI)
#define DK_DEPTHWISE_3X3_MVE 1

/* 1 when dk_depthwise_conv_3x3_mve_s8 runs this layer: batch 1, channel multiplier 1, a
 * multiple of 4 channels, a 3x3 filter, dilation 1, stride 1, padding 0 or 1 on each axis, and
 * a padded input map of at most 32 rows by 9 columns (output rows of up to 7 pixels): DS-CNN's
 * 25x5 maps, keyword-spotting shapes. readers/cmsis_nn_kernels.py mirrors it
 * (dk_mve_3x3_applies). */
int dk_depthwise_conv_3x3_mve_s8_applies(const cmsis_nn_dw_conv_params *dw_conv_params,
                                         const cmsis_nn_dims *input_dims,
                                         const cmsis_nn_dims *filter_dims,
                                         const cmsis_nn_dims *output_dims);

/* arm_depthwise_conv_wrapper_s8's results for a layer in that domain, output_data ==
 * input_data allowed, in one call. Its scratch (a channel's sums, 0.9 KB, and four channels of
 * the padded map, 1.1 KB) is ctx's buffer when that is large enough (an in-place layer's ring),
 * else on the stack. bias_data may be NULL. */
void dk_depthwise_conv_3x3_mve_s8(const cmsis_nn_context *ctx,
                                  const cmsis_nn_dw_conv_params *dw_conv_params,
                                  const cmsis_nn_per_channel_quant_params *quant_params,
                                  const cmsis_nn_dims *input_dims, const int8_t *input_data,
                                  const int8_t *filter_data, const int32_t *bias_data,
                                  const cmsis_nn_dims *output_dims, int8_t *output_data);

#else
#define DK_DEPTHWISE_3X3_MVE 0
#endif

#ifdef __cplusplus
}
#endif

#endif /* DK_CMSIS_NN_DEPTHWISE_3X3_MVE_H */
