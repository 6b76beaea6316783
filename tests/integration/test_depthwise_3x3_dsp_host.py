"""deploykit's 3x3 depthwise kernel for the DSP extension (firmware/kernels/
cmsis_nn_depthwise_3x3_dsp.c) against CMSIS-NN's arm_depthwise_conv_wrapper_s8 on random
layers, both compiled for Thumb-2 with the DSP extension and run under qemu-arm (user mode,
semihosting): the same bytes for every layer its domain check accepts.

The layers: 4 to 68 channels, maps of 1 to 75 rows (strips of rows past 26) and 1 to 45
columns, padding 0, 1 and (1, 0), with and without bias, per-channel shifts from left shifts
to right shifts past 22 and some negative multipliers (the exact requantization path), biases
up to 2^31 (the same), activation ranges full, ReLU-like and narrow, written over the input or
not, with its buffer in the context's scratch, on the stack, or with no context. The layers it
refuses (columns past 7 output pixels) are counted and left to CMSIS-NN.

Needs arm-none-eabi-gcc, qemu-arm and CMSIS-NN's sources from the workspace (`deploykit
setup`); a few seconds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.readers.sources import load_workspace
from tests.markers import requires_sources, requires_toolchain

REPO = Path(__file__).resolve().parents[2]
QEMU_ARM = shutil.which("qemu-arm")

pytestmark = [
    requires_toolchain,
    requires_sources,
    pytest.mark.skipif(QEMU_ARM is None,
                       reason="qemu-arm (user mode) not installed (apt-get install qemu-user)"),
    pytest.mark.timeout(300),  # one compile and a few thousand layers: seconds
]

CMSIS_NN_SOURCES = [
    "Source/ConvolutionFunctions/arm_depthwise_conv_wrapper_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_3x3_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_s8_opt.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_get_buffer_sizes_s8.c",
    "Source/NNSupportFunctions/arm_q7_to_q15_with_offset.c",
]

DRIVER = r"""
#include <stdio.h>
#include <string.h>

#include "arm_nnfunctions.h"
#include "cmsis_nn_depthwise_3x3.h"

#if !DK_DEPTHWISE_3X3 || defined(ARM_MATH_MVEI)
#error "the kernel needs the DSP extension and no MVE"
#endif

static uint32_t seed = 12345;
static int32_t rnd(void) {
  seed = seed * 1103515245u + 12345u;
  return (int32_t)(seed >> 8);
}

static int8_t input[40000], output[40000 + 64], expected[40000], filter[9 * 68];
static int32_t bias[68], mult[68], shift[68];
static int8_t scratch[65536] __attribute__((aligned(8)));

int main(void) {
  int ran = 0, refused = 0, failed = 0;
  for (int it = 0; it < 3000; ++it) {
    const int32_t C = 4 * (1 + rnd() % 17), H = 1 + rnd() % 75;
    const int32_t W = 1 + rnd() % ((it % 3) ? 9 : 45);
    int32_t ph = rnd() % 2, pw = rnd() % 2, Ho = H + 2 * ph - 2, Wo = W + 2 * pw - 2;
    if (it % 5 == 0) { /* padding (1, 0) */
      ph = 1;
      pw = 0;
      Ho = H;
      Wo = W - 2;
    }
    if (Ho < 1 || Wo < 1 || H * W * C > 40000) continue;
    for (int32_t i = 0; i < H * W * C; ++i) input[i] = (int8_t)rnd();
    for (int32_t i = 0; i < 9 * C; ++i) filter[i] = (int8_t)rnd();
    for (int32_t c = 0; c < C; ++c) {
      const int32_t k = rnd() % 8, s = rnd() % 10;
      bias[c] = k == 0 ? rnd() : (k == 1 ? rnd() % 2000000000 : rnd() % 100000);
      mult[c] = (int32_t)(0x40000000u + ((uint32_t)rnd() & 0x3fffffffu));
      if (rnd() % 20 == 0) mult[c] = -mult[c];
      shift[c] = s == 0 ? 1 + rnd() % 3 : (s == 1 ? 0 : (s == 2 ? -(23 + rnd() % 6)
                                                                   : -(1 + rnd() % 14)));
    }
    cmsis_nn_dw_conv_params p;
    memset(&p, 0, sizeof p);
    p.input_offset = -(rnd() % 256 - 128);
    p.output_offset = rnd() % 256 - 128;
    p.ch_mult = 1;
    p.stride.h = p.stride.w = 1;
    p.padding.h = ph;
    p.padding.w = pw;
    p.dilation.h = p.dilation.w = 1;
    const int32_t act = rnd() % 3;
    p.activation.min = act == 0 ? -128 : (act == 1 ? p.output_offset : -100);
    p.activation.max = act == 2 ? 100 : 127;
    if (p.activation.min > p.activation.max) p.activation.min = -128;
    const cmsis_nn_per_channel_quant_params q = {mult, shift};
    const cmsis_nn_dims in_dims = {1, H, W, C}, f_dims = {1, 3, 3, C}, b_dims = {1, 1, 1, C};
    const cmsis_nn_dims out_dims = {1, Ho, Wo, C};
    const int32_t *b = (it % 7 == 3) ? NULL : bias;
    cmsis_nn_context ctx = {scratch, sizeof scratch};
    if (arm_depthwise_conv_wrapper_s8(&ctx, &p, &q, &in_dims, input, &f_dims, filter, &b_dims,
                                      b, &out_dims, expected) != ARM_CMSIS_NN_SUCCESS) {
      printf("CMSIS-NN refused layer %d\n", it);
      return 2;
    }
    if (!dk_depthwise_conv_3x3_s8_applies(&p, &in_dims, &f_dims, &out_dims)) {
      ++refused;
      continue;
    }
    ++ran;
    /* Its buffer: the scratch, the stack (a scratch too small), or no context. */
    cmsis_nn_context given = {scratch, (it & 2) ? 0 : (int32_t)sizeof scratch};
    const cmsis_nn_context *use = (it % 7 == 5) ? NULL : &given;
    const int in_place = Ho == H && Wo == W && (it & 1);
    const int32_t n = Ho * Wo * C;
    if (in_place) {
      memcpy(output, input, (size_t)(H * W * C));
      dk_depthwise_conv_3x3_s8(use, &p, &q, &in_dims, output, filter, b, &out_dims, output);
    } else {
      memset(output, 0x5a, sizeof output);
      dk_depthwise_conv_3x3_s8(use, &p, &q, &in_dims, input, filter, b, &out_dims, output);
    }
    int bad = memcmp(output, expected, (size_t)n) != 0;
    for (int32_t i = n; !in_place && i < n + 64; ++i) bad |= output[i] != 0x5a;
    if (bad) {
      printf("layer %d differs: C %ld, %ldx%ld, padding %ld,%ld, in place %d\n", it, (long)C,
             (long)H, (long)W, (long)ph, (long)pw, in_place);
    }
    failed += bad;
  }
  printf("ran %d refused %d failed %d\n", ran, refused, failed);
  return failed != 0;
}
"""


def test_the_dsp_kernel_equals_cmsis_nn_on_random_layers(tmp_path):
    ws = load_workspace()
    if not ws.has("cmsis-nn"):
        pytest.skip("the workspace has no CMSIS-NN sources (cmsis-nn): run `deploykit setup`")
    cmsis_nn = Path(ws.path_of("cmsis-nn"))
    kernels = REPO / "firmware" / "kernels"
    driver = tmp_path / "driver.c"
    driver.write_text(DRIVER)
    elf = tmp_path / "driver.elf"
    subprocess.run(
        ["arm-none-eabi-gcc", "-march=armv7-a", "-mthumb", "-O2", "-Wall", "-Wextra", "-Werror",
         "--specs=rdimon.specs", "-ffunction-sections", "-Wl,--gc-sections",
         f"-I{cmsis_nn / 'Include'}", f"-I{kernels}", str(driver),
         str(kernels / "cmsis_nn_depthwise_3x3_dsp.c"),
         *(str(cmsis_nn / s) for s in CMSIS_NN_SOURCES), "-o", str(elf)],
        check=True, capture_output=True, text=True)
    run = subprocess.run([QEMU_ARM, "-cpu", "max", str(elf)], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    ran, refused = (int(w) for w in run.stdout.split()[-5:-2:2])
    assert ran > 1000 and refused > 100, run.stdout  # both sides of the domain check
