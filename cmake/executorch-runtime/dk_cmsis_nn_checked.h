/*
 * dk_cmsis_nn_checked.h: forced into ExecuTorch's cortex_m kernels (-include, CMakeLists.txt of
 * this runtime project), so that their CMSIS-NN calls go through deploykit's checked versions
 * (firmware/runner/kernel_status.c), which keep the function and status of a call that
 * refuses for the execute_error record (docs/protocol.md), and so that a few calls go to
 * deploykit's faster versions with the same results instead (dk_<f>, firmware/kernels). The
 * renaming also renames the functions' declarations in arm_nnfunctions.h as the kernels see
 * them, so each dk_checked_<f> or dk_<f> is declared with <f>'s exact type. CMSIS-NN itself is
 * compiled without it.
 *
 * A link-time --wrap cannot do this: in an LTO link both the kernels and CMSIS-NN are IR, and
 * the compiler binds their calls before the linker could redirect them.
 */
#ifndef DK_CMSIS_NN_CHECKED_H
#define DK_CMSIS_NN_CHECKED_H

#define arm_convolve_wrapper_s8 dk_checked_arm_convolve_wrapper_s8
#define arm_depthwise_conv_wrapper_s8 dk_checked_arm_depthwise_conv_wrapper_s8
#define arm_transpose_conv_wrapper_s8 dk_checked_arm_transpose_conv_wrapper_s8
#define arm_fully_connected_s8 dk_checked_arm_fully_connected_s8
#define arm_batch_matmul_s8 dk_checked_arm_batch_matmul_s8
#define arm_avgpool_s8 dk_checked_arm_avgpool_s8
#define arm_max_pool_s8 dk_checked_arm_max_pool_s8
#define arm_elementwise_add_s8 dk_checked_arm_elementwise_add_s8
#define arm_elementwise_mul_s8 dk_checked_arm_elementwise_mul_s8
#define arm_maximum_s8 dk_checked_arm_maximum_s8
#define arm_minimum_s8 dk_checked_arm_minimum_s8
#define arm_pad_s8 dk_checked_arm_pad_s8
#define arm_transpose_s8 dk_checked_arm_transpose_s8

/* Faster versions, equal bit for bit (ExecuTorchRuntime.cmake compiles them with
 * kernel_status.c). arm_softmax_s8: each distinct exp once per call instead of twice per
 * element (firmware/kernels/cmsis_nn_softmax.c). */
#define arm_softmax_s8 dk_arm_softmax_s8

#endif /* DK_CMSIS_NN_CHECKED_H */
