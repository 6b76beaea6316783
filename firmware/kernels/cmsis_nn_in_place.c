/*
 * cmsis_nn_in_place.c: CMSIS-NN convolutions written over their own input, in bands of output
 * rows (cmsis_nn_in_place.h says why and how the scratch is laid out).
 *
 * With stride 1 down the rows, output row r reads input rows from r - pad_top on, so once rows
 * [0, r) are computed, input rows below r - pad_top are dead and the output rows there can be
 * copied into place: the last pad_top rows of a band wait in the ring while the next band is
 * computed. Each band is one call of the CMSIS-NN wrapper on the input rows it reads, with the
 * top padding that remains at the map's top edge and the map's bottom edge as the sub-map's, so
 * each output row is the same arithmetic as in the whole-layer call. The export makes a band at
 * least pad_top rows or the whole map (tools/deploykit/flows/in_place.py), and checks with
 * CMSIS-NN's own get_buffer_size that no band's kernel asks for more scratch than the whole
 * layer's.
 */
#include "cmsis_nn_in_place.h"

#include "arm_nnsupportfunctions.h" /* arm_memcpy_s8: vector copies on MVE, memcpy elsewhere */
#include "cmsis_nn_depthwise_3x3.h"

/* 0: the program has no convolution in place (deploykit sets it from the .pte), and an in-place
 * call is refused (ARM_CMSIS_NN_ARG_ERROR, in the execute_error record) rather than run. */
#ifndef DK_CMSIS_NN_IN_PLACE
#define DK_CMSIS_NN_IN_PLACE 1
#endif

typedef struct dk_layer {
  const void *params; /* a cmsis_nn_conv_params or a cmsis_nn_dw_conv_params */
  const cmsis_nn_per_channel_quant_params *quant;
  const cmsis_nn_dims *input_dims, *filter_dims, *bias_dims, *output_dims;
  const int8_t *input, *filter;
  const int32_t *bias;
  int32_t pad_top;
  int32_t reach; /* input rows a window spans below its top row: (kernel_h - 1) x dilation */
} dk_layer_t;

/* One band of a layer: output rows [first_row, first_row + rows) into `out`. One function per
 * kind, so that a program without depthwise layers links no depthwise kernel. */
typedef arm_cmsis_nn_status (*dk_band_fn)(const dk_layer_t *layer,
                                          const cmsis_nn_context *kernel_ctx, int32_t first_row,
                                          int32_t rows, int8_t *out);

/* A band's input rows and top padding: the whole layer's own when the band is the whole map
 * (whatever its stride). */
static const int8_t *dk_band_input(const dk_layer_t *layer, int32_t first_row, int32_t rows,
                                   cmsis_nn_dims *input_dims, cmsis_nn_dims *output_dims,
                                   int32_t *pad_top) {
  *input_dims = *layer->input_dims;
  *output_dims = *layer->output_dims;
  *pad_top = layer->pad_top;
  if (first_row == 0 && rows == output_dims->h) {
    return layer->input;
  }
  const int32_t top = first_row - layer->pad_top;
  int32_t last = top + rows - 1 + layer->reach;
  if (last > input_dims->h - 1) last = input_dims->h - 1;
  const int32_t first_in = top > 0 ? top : 0;
  input_dims->h = last - first_in + 1;
  output_dims->h = rows;
  *pad_top = top < 0 ? -top : 0;
  return layer->input + first_in * input_dims->w * input_dims->c;
}

/* The CMSIS-NN kernels the program's layers take: DK_CMSIS_NN_CONV_<KERNEL> and
 * DK_CMSIS_NN_DW_<KERNEL>, set from the .pte (tools/deploykit/readers/cmsis_nn_kernels.py).
 * A call goes to the first of them, in the wrapper's order, whose domain holds the layer and
 * whose scratch fits in the one the program gives, so the kernels no layer takes are not
 * linked (a wrapper picks at run time and links them all). The first is the wrapper's own
 * choice; a band can prefer another kernel than its layer (less top padding, a single row),
 * and the one its layer takes still holds it. No such kernel: ARM_CMSIS_NN_ARG_ERROR. Without
 * DK_CMSIS_NN_<KIND>_SELECTED the wrapper picks. */
/* A program with no layer of a kind refuses every call of it. */
#define DK_UNUSED_KERNEL_ARGUMENTS                                                               \
  ((void)ctx, (void)params, (void)quant, (void)input_dims, (void)input, (void)filter_dims,       \
   (void)filter, (void)bias_dims, (void)bias, (void)output_dims, (void)output)

#ifdef DK_CMSIS_NN_CONV_SELECTED
static arm_cmsis_nn_status dk_convolve_kernel(
    const cmsis_nn_context *ctx, const cmsis_nn_conv_params *params,
    const cmsis_nn_per_channel_quant_params *quant, const cmsis_nn_dims *input_dims,
    const int8_t *input, const cmsis_nn_dims *filter_dims, const int8_t *filter,
    const cmsis_nn_dims *bias_dims, const int32_t *bias, const cmsis_nn_dims *output_dims,
    int8_t *output) {
  if (arm_nn_is_convolve_1x1(params, input_dims, filter_dims)) {
#if DK_CMSIS_NN_CONV_1X1_FAST
    if (arm_nn_is_convolve_1x1_fast(params)) {
      return arm_convolve_1x1_s8_fast(ctx, params, quant, input_dims, input, filter_dims,
                                      filter, bias_dims, bias, output_dims, output);
    }
#endif
#if DK_CMSIS_NN_CONV_1X1
    if (!arm_nn_is_convolve_1x1_fast(params)) {
      return arm_convolve_1x1_s8(ctx, params, quant, input_dims, input, filter_dims, filter,
                                 bias_dims, bias, output_dims, output);
    }
#endif
  }
#if DK_CMSIS_NN_CONV_1_X_N
  else if (arm_nn_is_convolve_1_x_n(params, input_dims, filter_dims)) {
    return arm_convolve_1_x_n_s8(ctx, params, quant, input_dims, input, filter_dims, filter,
                                 bias_dims, bias, output_dims, output);
  }
#endif
#if DK_CMSIS_NN_CONV_GENERIC
  if (arm_convolve_s8_get_buffer_size(input_dims, filter_dims) <= ctx->size) {
    return arm_convolve_s8(ctx, params, quant, input_dims, input, filter_dims, filter, bias_dims,
                           bias, NULL, output_dims, output);
  }
#endif
  DK_UNUSED_KERNEL_ARGUMENTS;
  return ARM_CMSIS_NN_ARG_ERROR;
}
#else
#define dk_convolve_kernel arm_convolve_wrapper_s8
#endif

/* The only call sites of the CMSIS-NN kernels (or wrappers), so that LTO compiles them as it
 * would without this file. */
static arm_cmsis_nn_status dk_conv_band(const dk_layer_t *layer,
                                        const cmsis_nn_context *kernel_ctx, int32_t first_row,
                                        int32_t rows, int8_t *out) {
  cmsis_nn_dims input_dims, output_dims;
  cmsis_nn_conv_params params = *(const cmsis_nn_conv_params *)layer->params;
  const int8_t *input =
      dk_band_input(layer, first_row, rows, &input_dims, &output_dims, &params.padding.h);
  return dk_convolve_kernel(kernel_ctx, &params, layer->quant, &input_dims, input,
                            layer->filter_dims, layer->filter, layer->bias_dims, layer->bias,
                            &output_dims, out);
}

#ifdef DK_CMSIS_NN_DW_SELECTED
/* The domain of the wrapper's kernels for one channel per input channel. */
static inline int dk_dw_plain(const cmsis_nn_dw_conv_params *params,
                              const cmsis_nn_dims *input_dims) {
  return params->ch_mult == 1 && input_dims->n == 1 && params->dilation.w == 1 &&
         params->dilation.h == 1;
}

static arm_cmsis_nn_status dk_depthwise_kernel(
    const cmsis_nn_context *ctx, const cmsis_nn_dw_conv_params *params,
    const cmsis_nn_per_channel_quant_params *quant, const cmsis_nn_dims *input_dims,
    const int8_t *input, const cmsis_nn_dims *filter_dims, const int8_t *filter,
    const cmsis_nn_dims *bias_dims, const int32_t *bias, const cmsis_nn_dims *output_dims,
    int8_t *output) {
#if !defined(ARM_MATH_MVEI) && DK_CMSIS_NN_DW_3X3 /* the wrapper takes it only without MVE */
  if (dk_dw_plain(params, input_dims) && filter_dims->w == 3 && filter_dims->h == 3 &&
      params->padding.h <= 1 && params->padding.w <= 1) {
    return arm_depthwise_conv_3x3_s8(ctx, params, quant, input_dims, input, filter_dims, filter,
                                     bias_dims, bias, output_dims, output);
  }
#endif
#if DK_CMSIS_NN_DW_OPT
  if (dk_dw_plain(params, input_dims) &&
      arm_depthwise_conv_s8_opt_get_buffer_size(input_dims, filter_dims) <= ctx->size) {
    return arm_depthwise_conv_s8_opt(ctx, params, quant, input_dims, input, filter_dims, filter,
                                     bias_dims, bias, output_dims, output);
  }
#endif
#if DK_CMSIS_NN_DW_GENERIC
  return arm_depthwise_conv_s8(ctx, params, quant, input_dims, input, filter_dims, filter,
                               bias_dims, bias, output_dims, output);
#else
  DK_UNUSED_KERNEL_ARGUMENTS;
  return ARM_CMSIS_NN_ARG_ERROR;
#endif
}
#else
#define dk_depthwise_kernel arm_depthwise_conv_wrapper_s8
#endif

static arm_cmsis_nn_status dk_dw_band(const dk_layer_t *layer,
                                      const cmsis_nn_context *kernel_ctx, int32_t first_row,
                                      int32_t rows, int8_t *out) {
  cmsis_nn_dims input_dims, output_dims;
  cmsis_nn_dw_conv_params params = *(const cmsis_nn_dw_conv_params *)layer->params;
  const int8_t *input =
      dk_band_input(layer, first_row, rows, &input_dims, &output_dims, &params.padding.h);
  return dk_depthwise_kernel(kernel_ctx, &params, layer->quant, &input_dims, input,
                             layer->filter_dims, layer->filter, layer->bias_dims, layer->bias,
                             &output_dims, out);
}

/* The ring after the kernel's scratch: a waiting area of pad_top rows, then the band being
 * computed. Every row is copied once to its place, and a band's last pad_top rows once more, to
 * the waiting area. */
static arm_cmsis_nn_status dk_run_in_bands(const dk_layer_t *layer, dk_band_fn band_fn,
                                           const cmsis_nn_context *ctx, int32_t kernel_bytes,
                                           int32_t stride_h, int8_t *data) {
  const cmsis_nn_dims *in = layer->input_dims, *out = layer->output_dims;
  const int32_t row = in->w * in->c;
  if (stride_h != 1 || in->n != 1 || in->h != out->h || in->w != out->w || in->c != out->c ||
      kernel_bytes < 0 || ctx->buf == NULL || row <= 0) {
    return ARM_CMSIS_NN_ARG_ERROR;
  }
  const int32_t band = (ctx->size - kernel_bytes) / row - layer->pad_top;
  if (band < 1 || (band < layer->pad_top && band < out->h)) {
    return ARM_CMSIS_NN_ARG_ERROR;
  }
  const cmsis_nn_context kernel_ctx = {ctx->buf, kernel_bytes};
  int8_t *const waiting_area = (int8_t *)ctx->buf + kernel_bytes;
  int8_t *const band_area = waiting_area + layer->pad_top * row;
  int32_t waiting = 0; /* rows in the waiting area: [start - waiting, start) */
  for (int32_t start = 0; start < out->h;) {
    const int32_t rows = band < out->h - start ? band : out->h - start;
    const arm_cmsis_nn_status status = band_fn(layer, &kernel_ctx, start, rows, band_area);
    if (status != ARM_CMSIS_NN_SUCCESS) {
      return status;
    }
    const int32_t next = start + rows;
    /* Input rows below `dead` are read by no output row from `next` on: with rows >= pad_top,
     * all the waiting ones and the band's but its last pad_top (none after the last band). */
    const int32_t done = (next == out->h ? next : next - layer->pad_top) - start;
    arm_memcpy_s8(data + (start - waiting) * row, waiting_area, waiting * row);
    arm_memcpy_s8(data + start * row, band_area, done * row);
    waiting = rows - done;
    arm_memcpy_s8(waiting_area, band_area + done * row, waiting * row);
    start = next;
  }
  return ARM_CMSIS_NN_SUCCESS;
}

arm_cmsis_nn_status dk_convolve_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_conv_params *conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
  const dk_layer_t layer = {conv_params, quant_params, input_dims, filter_dims, bias_dims,
                            output_dims, input_data, filter_data, bias_data,
                            conv_params->padding.h,
                            (filter_dims->h - 1) * conv_params->dilation.h};
  if ((const int8_t *)output_data != input_data) { /* the whole layer in one band */
    return dk_conv_band(&layer, ctx, 0, output_dims->h, output_data);
  }
  if (!DK_CMSIS_NN_IN_PLACE) {
    return ARM_CMSIS_NN_ARG_ERROR;
  }
  return dk_run_in_bands(&layer, dk_conv_band, ctx,
                         arm_convolve_wrapper_s8_get_buffer_size(conv_params, input_dims,
                                                                 filter_dims, output_dims),
                         conv_params->stride.h, output_data);
}

arm_cmsis_nn_status dk_depthwise_conv_wrapper_s8(
    const cmsis_nn_context *ctx, const cmsis_nn_dw_conv_params *dw_conv_params,
    const cmsis_nn_per_channel_quant_params *quant_params, const cmsis_nn_dims *input_dims,
    const int8_t *input_data, const cmsis_nn_dims *filter_dims, const int8_t *filter_data,
    const cmsis_nn_dims *bias_dims, const int32_t *bias_data, const cmsis_nn_dims *output_dims,
    int8_t *output_data) {
#if DK_DEPTHWISE_3X3
  /* With MVE or the DSP extension, a layer of its domain, in place or not, in one call of
   * deploykit's own kernel (cmsis_nn_depthwise_3x3.h): CMSIS-NN's results, the ring of an
   * in-place layer as its buffer when it is large enough. */
  if (dk_depthwise_conv_3x3_s8_applies(dw_conv_params, input_dims, filter_dims, output_dims)) {
    dk_depthwise_conv_3x3_s8(ctx, dw_conv_params, quant_params, input_dims, input_data,
                             filter_data, bias_data, output_dims, output_data);
    return ARM_CMSIS_NN_SUCCESS;
  }
#endif
  const dk_layer_t layer = {dw_conv_params, quant_params, input_dims, filter_dims, bias_dims,
                            output_dims, input_data, filter_data, bias_data,
                            dw_conv_params->padding.h,
                            (filter_dims->h - 1) * dw_conv_params->dilation.h};
  if ((const int8_t *)output_data != input_data) { /* the whole layer in one band */
    return dk_dw_band(&layer, ctx, 0, output_dims->h, output_data);
  }
  if (!DK_CMSIS_NN_IN_PLACE || dw_conv_params->ch_mult != 1) {
    return ARM_CMSIS_NN_ARG_ERROR;
  }
  return dk_run_in_bands(&layer, dk_dw_band, ctx,
                         arm_depthwise_conv_wrapper_s8_get_buffer_size(
                             dw_conv_params, input_dims, filter_dims, output_dims),
                         dw_conv_params->stride.h, output_data);
}
