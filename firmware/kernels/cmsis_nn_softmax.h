/*
 * cmsis_nn_softmax.h: CMSIS-NN's int8 softmax with each distinct exponential computed once per
 * call (cmsis_nn_softmax.c says why). The cortex_m kernels call it in place of arm_softmax_s8
 * (cmake/executorch-runtime/dk_cmsis_nn_checked.h renames their call).
 */
#ifndef DK_CMSIS_NN_SOFTMAX_H
#define DK_CMSIS_NN_SOFTMAX_H

#include "arm_nnfunctions.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Of arm_softmax_s8's declared type, so a signature that differs does not compile. The same
 * int8 results as CMSIS-NN's scalar arm_nn_softmax_common_s8, bit for bit. */
__typeof__(arm_softmax_s8) dk_arm_softmax_s8;

#ifdef __cplusplus
}
#endif

#endif /* DK_CMSIS_NN_SOFTMAX_H */
