"""deploykit's 3x3 depthwise kernel for MVE (firmware/kernels/cmsis_nn_depthwise_3x3_mve.c)
against CMSIS-NN's arm_depthwise_conv_wrapper_s8 on random layers, both compiled for the M55
and run bare-metal on qemu-system-arm's mps3-an547 (semihosting): the same bytes for every
layer its domain check accepts.

The layers are test_depthwise_3x3_dsp_host.py's (its driver, with the MVE kernel's names and
maps of 1 to 40 rows): 4 to 68 channels, padding 0, 1 and (1, 0), with and without bias,
per-channel shifts from left shifts to right shifts past 22 and some negative multipliers,
biases up to 2^31, activation ranges full, ReLU-like and narrow, written over the input or
not, with its scratch in the context's buffer, on the stack, or with no context. The layers it
refuses (more than 32 padded rows or 9 padded columns) are counted and left to CMSIS-NN.

Needs arm-none-eabi-gcc, qemu-system-arm and CMSIS-NN's sources from the workspace (`deploykit
setup`); seconds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.readers.sources import load_workspace
from tests.integration.test_depthwise_3x3_dsp_host import DRIVER as DSP_DRIVER
from tests.markers import requires_qemu, requires_sources, requires_toolchain

REPO = Path(__file__).resolve().parents[2]

pytestmark = [requires_toolchain, requires_sources, requires_qemu, pytest.mark.timeout(300)]

# The DSP kernel's driver with the MVE kernel's guard and its maps' heights (the two share
# their declarations, cmsis_nn_depthwise_3x3.h).
REPLACEMENTS = [
    ("#if !DK_DEPTHWISE_3X3 || defined(ARM_MATH_MVEI)", "#if !defined(ARM_MATH_MVEI)"),
    ("the kernel needs the DSP extension and no MVE", "the kernel needs MVE"),
    ("H = 1 + rnd() % 75", "H = 1 + rnd() % 40"),
]

# A vector table at 0 (the board's ITCM) whose reset enables the FPU and MVE, then newlib's
# semihosting start-up (rdimon).
VECTORS = r"""
#include <stdint.h>
extern void _start(void);
static void dk_reset(void) {
  *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20; /* CPACR: CP10, CP11 */
  __asm__ volatile("dsb\n isb");
  _start();
}
static void dk_fault(void) {
  for (;;) {
  }
}
__attribute__((section(".vectors"), used)) const void *const dk_vectors[16] = {
    (void *)0x20070000u, (void *)dk_reset, (void *)dk_fault, (void *)dk_fault,
    (void *)dk_fault, (void *)dk_fault, (void *)dk_fault};

/* The wrapper's one-input-channel path (a regular convolution), which no layer here takes. */
#include "arm_nnfunctions.h"
arm_cmsis_nn_status arm_convolve_wrapper_s8(const cmsis_nn_context *a,
                                            const cmsis_nn_conv_params *b,
                                            const cmsis_nn_per_channel_quant_params *c,
                                            const cmsis_nn_dims *d, const int8_t *e,
                                            const cmsis_nn_dims *f, const int8_t *g,
                                            const cmsis_nn_dims *h, const int32_t *i,
                                            const cmsis_nn_dims *j, int8_t *k) {
  (void)a, (void)b, (void)c, (void)d, (void)e, (void)f, (void)g, (void)h, (void)i, (void)j;
  (void)k;
  return ARM_CMSIS_NN_ARG_ERROR;
}
int32_t arm_convolve_wrapper_s8_get_buffer_size(const cmsis_nn_conv_params *a,
                                                const cmsis_nn_dims *b, const cmsis_nn_dims *c,
                                                const cmsis_nn_dims *d) {
  (void)a, (void)b, (void)c, (void)d;
  return 0;
}
arm_cmsis_nn_status arm_transpose_s8(const int8_t *a, int8_t *b, const cmsis_nn_dims *c,
                                     const cmsis_nn_dims *d,
                                     const cmsis_nn_transpose_params *e) {
  (void)a, (void)b, (void)c, (void)d, (void)e;
  return ARM_CMSIS_NN_ARG_ERROR;
}
"""

CMSIS_NN_SOURCES = [
    "Source/ConvolutionFunctions/arm_depthwise_conv_wrapper_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_s8_opt.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_3x3_s8.c",
    "Source/ConvolutionFunctions/arm_depthwise_conv_get_buffer_sizes_s8.c",
    "Source/NNSupportFunctions/arm_nn_depthwise_conv_nt_t_s8.c",
    "Source/NNSupportFunctions/arm_q7_to_q15_with_offset.c",
]


def driver() -> str:
    text = DSP_DRIVER
    for old, new in REPLACEMENTS:
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_the_mve_kernel_equals_cmsis_nn_on_random_layers(tmp_path):
    ws = load_workspace()
    if not ws.has("cmsis-nn"):
        pytest.skip("the workspace has no CMSIS-NN sources (cmsis-nn): run `deploykit setup`")
    cmsis_nn = Path(ws.path_of("cmsis-nn"))
    kernels = REPO / "firmware" / "kernels"
    (tmp_path / "driver.c").write_text(driver())
    (tmp_path / "vectors.c").write_text(VECTORS)
    elf = tmp_path / "driver.elf"
    subprocess.run(
        ["arm-none-eabi-gcc", "-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard", "-O2",
         "-Wall", "-Wextra", "-Werror", "--specs=rdimon.specs", "-ffunction-sections",
         "-fdata-sections", "-Wl,--gc-sections", "-Wl,--undefined=dk_vectors",
         "-Wl,--section-start=.vectors=0x0",
         f"-I{cmsis_nn / 'Include'}", f"-I{kernels}", str(tmp_path / "driver.c"),
         str(tmp_path / "vectors.c"), str(kernels / "cmsis_nn_depthwise_3x3_mve.c"),
         *(str(cmsis_nn / s) for s in CMSIS_NN_SOURCES), "-o", str(elf)],
        check=True, capture_output=True, text=True)
    run = subprocess.run([shutil.which("qemu-system-arm"), "-M", "mps3-an547", "-nographic",
                          "-semihosting", "-kernel", str(elf)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    # Semihosting's exit keeps no status on AArch32: the driver's last line says it.
    ran, refused, failed = (int(w) for w in run.stdout.split()[-5::2])
    assert failed == 0, run.stdout
    assert ran > 1000 and refused > 100, run.stdout  # both sides of the domain check
