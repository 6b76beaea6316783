/*
 * cmsis_nn_in_place.h: a CMSIS-NN convolution or depthwise convolution whose output is its
 * own input (the same memory), run in bands of output rows.
 *
 * deploykit's export writes a stride-1 layer whose output has its input's shape over that
 * input when the input dies there (tools/deploykit/flows/in_place.py), so the two are one
 * tensor of the program. An output row needs the input rows around it, so the kernel writes
 * each band of rows into a ring after its own scratch, and a row is copied to its place once
 * no later row reads the input under it. The scratch the program gives is the kernel's own
 * (its get_buffer_size for the whole layer) followed by the ring of (band + top padding) rows;
 * the band is found from the scratch's size, so the export alone chooses it.
 *
 * The checked CMSIS-NN calls (firmware/runner/kernel_status.c) call these in place of CMSIS-NN's
 * wrappers, with the same arguments: the wrapper itself, once, when output and input differ
 * (one call site of the wrapper, so LTO compiles the kernels as it does without this file);
 * the bands when output_data == input_data (a 3x3 depthwise layer in the domain of
 * deploykit's own dk_depthwise_conv_3x3_s8, cmsis_nn_depthwise_3x3.h, runs that kernel once
 * instead, in place or not).
 * ARM_CMSIS_NN_ARG_ERROR when an in-place layer is
 * not one this runs (a stride down the rows, another output shape, a scratch with no room for
 * a band of one row).
 */
#ifndef DK_CMSIS_NN_IN_PLACE_H
#define DK_CMSIS_NN_IN_PLACE_H

#include "arm_nnfunctions.h"

#ifdef __cplusplus
extern "C" {
#endif

arm_cmsis_nn_status dk_convolve_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_conv_params *conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data);

arm_cmsis_nn_status dk_depthwise_conv_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data);

#ifdef __cplusplus
}
#endif

#endif /* DK_CMSIS_NN_IN_PLACE_H */
