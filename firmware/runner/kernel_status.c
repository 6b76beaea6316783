/*
 * kernel_status.c: the CMSIS-NN calls of ExecuTorch's cortex_m kernels, checked so that a
 * refusal is kept for the `execute_error` record (kernel_status.h).
 *
 * The runtime compiles the kernels with cmake/executorch-runtime/dk_cmsis_nn_checked.h forced
 * in, which renames each call of <f> to dk_checked_<f> (tests/unit/test_execute_error.py checks
 * that the two lists agree). dk_checked_<f> calls the library's <f> and keeps its name and
 * status when it is not ARM_CMSIS_NN_SUCCESS. Each is declared with the type of the library's
 * declaration, so a signature that differs does not compile. One the model's kernels do not
 * call is removed by --gc-sections (and LTO). A convolution whose output is its input (the
 * export wrote it in place: tools/deploykit/flows/in_place.py) runs in bands
 * (firmware/kernels/cmsis_nn_in_place.c); a refusal there is kept under the wrapper's name.
 */
#include "kernel_status.h"

dk_kernel_failure_t dk_kernel_failure;

#if DK_CMSIS_NN_STATUS /* a model with cortex_m kernels */
#include "arm_nnfunctions.h"
#include "cmsis_nn_add.h"
#include "cmsis_nn_in_place.h"

static arm_cmsis_nn_status dk_kept(arm_cmsis_nn_status status, const char *call) {
  if (status != ARM_CMSIS_NN_SUCCESS) {
    dk_kernel_failure.call = call;
    dk_kernel_failure.status = (int32_t)status;
  }
  return status;
}

/* The checked version of <f>, of <f>'s declared type. */
#define DK_CHECKED(f) __typeof__(f) dk_checked_##f

DK_CHECKED(arm_convolve_wrapper_s8);
arm_cmsis_nn_status dk_checked_arm_convolve_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_conv_params *conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
#ifdef DK_TEST_CMSIS_NN_NO_SCRATCH
  /* Test builds only (tests/integration/test_execute_error_qemu.py): the convolution gets no
   * scratch buffer, which a kernel that needs one refuses with ARM_CMSIS_NN_ARG_ERROR. */
  const cmsis_nn_context no_scratch = {0, 0};
  ctx = &no_scratch;
#endif
  return dk_kept(dk_convolve_wrapper_s8(ctx, conv_params, quant_params, input_dims,
                                         input_data, filter_dims, filter_data, bias_dims,
                                         bias_data, output_dims, output_data),
                 "arm_convolve_wrapper_s8");
}

DK_CHECKED(arm_depthwise_conv_wrapper_s8);
arm_cmsis_nn_status dk_checked_arm_depthwise_conv_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
  return dk_kept(dk_depthwise_conv_wrapper_s8(ctx, dw_conv_params, quant_params,
                                               input_dims, input_data, filter_dims,
                                               filter_data, bias_dims, bias_data,
                                               output_dims, output_data),
                 "arm_depthwise_conv_wrapper_s8");
}

DK_CHECKED(arm_transpose_conv_wrapper_s8);
arm_cmsis_nn_status dk_checked_arm_transpose_conv_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_context *output_ctx,
    const cmsis_nn_transpose_conv_params *transpose_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
  return dk_kept(arm_transpose_conv_wrapper_s8(ctx, output_ctx, transpose_conv_params,
                                               quant_params, input_dims, input_data,
                                               filter_dims, filter_data, bias_dims,
                                               bias_data, output_dims, output_data),
                 "arm_transpose_conv_wrapper_s8");
}

DK_CHECKED(arm_fully_connected_s8);
arm_cmsis_nn_status dk_checked_arm_fully_connected_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_fc_params *fc_params,
    const cmsis_nn_per_tensor_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
  return dk_kept(arm_fully_connected_s8(ctx, fc_params, quant_params, input_dims,
                                        input_data, filter_dims, filter_data, bias_dims,
                                        bias_data, output_dims, output_data),
                 "arm_fully_connected_s8");
}

DK_CHECKED(arm_batch_matmul_s8);
arm_cmsis_nn_status dk_checked_arm_batch_matmul_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_bmm_params *bmm_params,
    const cmsis_nn_per_tensor_quant_params *quant_params, const cmsis_nn_dims *input_lhs_dims,
    const int8_t *input_lhs, const cmsis_nn_dims *input_rhs_dims, const int8_t *input_rhs,
    const cmsis_nn_dims *output_dims, int8_t *output) {
  return dk_kept(arm_batch_matmul_s8(ctx, bmm_params, quant_params, input_lhs_dims,
                                     input_lhs, input_rhs_dims, input_rhs, output_dims,
                                     output),
                 "arm_batch_matmul_s8");
}

DK_CHECKED(arm_avgpool_s8);
arm_cmsis_nn_status dk_checked_arm_avgpool_s8(const cmsis_nn_context *ctx,
                                              const cmsis_nn_pool_params *pool_params,
                                              const cmsis_nn_dims *input_dims,
                                              const int8_t *input_data,
                                              const cmsis_nn_dims *filter_dims,
                                              const cmsis_nn_dims *output_dims,
                                              int8_t *output_data) {
  return dk_kept(arm_avgpool_s8(ctx, pool_params, input_dims, input_data, filter_dims,
                                output_dims, output_data),
                 "arm_avgpool_s8");
}

DK_CHECKED(arm_max_pool_s8);
arm_cmsis_nn_status dk_checked_arm_max_pool_s8(const cmsis_nn_context *ctx,
                                               const cmsis_nn_pool_params *pool_params,
                                               const cmsis_nn_dims *input_dims,
                                               const int8_t *input_data,
                                               const cmsis_nn_dims *filter_dims,
                                               const cmsis_nn_dims *output_dims,
                                               int8_t *output_data) {
  return dk_kept(arm_max_pool_s8(ctx, pool_params, input_dims, input_data, filter_dims,
                                 output_dims, output_data),
                 "arm_max_pool_s8");
}

DK_CHECKED(arm_elementwise_add_s8);
arm_cmsis_nn_status dk_checked_arm_elementwise_add_s8(
    const int8_t *input_1_vect, const int8_t *input_2_vect, const int32_t input_1_offset,
    const int32_t input_1_mult, const int32_t input_1_shift, const int32_t input_2_offset,
    const int32_t input_2_mult, const int32_t input_2_shift, const int32_t left_shift,
    int8_t *output, const int32_t out_offset, const int32_t out_mult, const int32_t out_shift,
    const int32_t out_activation_min, const int32_t out_activation_max,
    const int32_t block_size) {
  return dk_kept(dk_elementwise_add_s8(input_1_vect, input_2_vect, input_1_offset,
                                       input_1_mult, input_1_shift, input_2_offset,
                                       input_2_mult, input_2_shift, left_shift, output,
                                       out_offset, out_mult, out_shift, out_activation_min,
                                       out_activation_max, block_size),
                 "arm_elementwise_add_s8");
}

DK_CHECKED(arm_elementwise_mul_s8);
arm_cmsis_nn_status dk_checked_arm_elementwise_mul_s8(
    const int8_t *input_1_vect, const int8_t *input_2_vect, const int32_t input_1_offset,
    const int32_t input_2_offset, int8_t *output, const int32_t out_offset,
    const int32_t out_mult, const int32_t out_shift, const int32_t out_activation_min,
    const int32_t out_activation_max, const int32_t block_size) {
  return dk_kept(arm_elementwise_mul_s8(input_1_vect, input_2_vect, input_1_offset,
                                        input_2_offset, output, out_offset, out_mult,
                                        out_shift, out_activation_min,
                                        out_activation_max, block_size),
                 "arm_elementwise_mul_s8");
}

DK_CHECKED(arm_maximum_s8);
arm_cmsis_nn_status dk_checked_arm_maximum_s8(const cmsis_nn_context *ctx,
                                              const int8_t *input_1_data,
                                              const cmsis_nn_dims *input_1_dims,
                                              const int8_t *input_2_data,
                                              const cmsis_nn_dims *input_2_dims,
                                              int8_t *output_data,
                                              const cmsis_nn_dims *output_dims) {
  return dk_kept(arm_maximum_s8(ctx, input_1_data, input_1_dims, input_2_data,
                                input_2_dims, output_data, output_dims),
                 "arm_maximum_s8");
}

DK_CHECKED(arm_minimum_s8);
arm_cmsis_nn_status dk_checked_arm_minimum_s8(const cmsis_nn_context *ctx,
                                              const int8_t *input_1_data,
                                              const cmsis_nn_dims *input_1_dims,
                                              const int8_t *input_2_data,
                                              const cmsis_nn_dims *input_2_dims,
                                              int8_t *output_data,
                                              const cmsis_nn_dims *output_dims) {
  return dk_kept(arm_minimum_s8(ctx, input_1_data, input_1_dims, input_2_data,
                                input_2_dims, output_data, output_dims),
                 "arm_minimum_s8");
}

DK_CHECKED(arm_pad_s8);
arm_cmsis_nn_status dk_checked_arm_pad_s8(const int8_t *input, int8_t *output,
                                          const int8_t pad_value,
                                          const cmsis_nn_dims *input_size,
                                          const cmsis_nn_dims *pre_pad,
                                          const cmsis_nn_dims *post_pad) {
  return dk_kept(arm_pad_s8(input, output, pad_value, input_size, pre_pad, post_pad),
                 "arm_pad_s8");
}

DK_CHECKED(arm_transpose_s8);
arm_cmsis_nn_status dk_checked_arm_transpose_s8(
    const int8_t *input_data, int8_t *const output_data, const cmsis_nn_dims *const input_dims,
    const cmsis_nn_dims *const output_dims,
    const cmsis_nn_transpose_params *const transpose_params) {
  return dk_kept(arm_transpose_s8(input_data, output_data, input_dims, output_dims,
                                  transpose_params),
                 "arm_transpose_s8");
}
#endif /* DK_CMSIS_NN_STATUS */
