/*
 * cmsis_nn_add.h: CMSIS-NN's int8 elementwise add with each input's rescaling looked up in a
 * table filled once per call (cmsis_nn_add.c says why and when). The checked add of the
 * cortex_m kernels (firmware/runner/kernel_status.c) calls it in place of
 * arm_elementwise_add_s8.
 */
#ifndef DK_CMSIS_NN_ADD_H
#define DK_CMSIS_NN_ADD_H

#include "arm_nnfunctions.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Of arm_elementwise_add_s8's declared type, so a signature that differs does not compile. The
 * same int8 results as CMSIS-NN's, bit for bit. */
__typeof__(arm_elementwise_add_s8) dk_elementwise_add_s8;

#ifdef __cplusplus
}
#endif

#endif /* DK_CMSIS_NN_ADD_H */
