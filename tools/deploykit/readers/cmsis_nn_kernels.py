"""Which of CMSIS-NN's convolution and depthwise kernels a program's layers take, read from its
`.pte`, so that the firmware links only those.

CMSIS-NN's wrappers (``arm_convolve_wrapper_s8``, ``arm_depthwise_conv_wrapper_s8``) pick a
kernel at run time from the layer's shape, so an image that calls them links every kernel they
could pick: for ds_cnn on the M55 the generic depthwise kernel (with its channel-multiplier-of-4
variant), the filter transpose of the one-input-channel path, the strided 1x1 and the 1xN
convolutions, none of which its layers run. The firmware's calls
(firmware/kernels/cmsis_nn_in_place.c) go to the kernels named here directly instead, each
within its own domain; a layer that only a kernel left out could run is refused with
``ARM_CMSIS_NN_ARG_ERROR`` (in the execute_error record), not run wrong.

The choices mirror the wrappers of CMSIS-NN as ExecuTorch v1.4.1 pins it
(``arm_convolve_wrapper_s8.c``, ``arm_depthwise_conv_wrapper_s8.c``) for the board CPU's path
(MVE or not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deploykit.readers.pte_reader import kernel_calls, load_program

CONV_OP = "cortex_m::quantized_conv2d.out"
DEPTHWISE_OP = "cortex_m::quantized_depthwise_conv2d.out"
# The kernels the firmware can call directly, in the order it tries them (the wrapper's).
CONV_KERNELS = ("1x1_fast", "1x1", "1_x_n", "generic")
DEPTHWISE_KERNELS = ("3x3", "opt", "generic")
# Not a CMSIS-NN kernel: the layers that deploykit's own 3x3 depthwise kernel runs on a core
# with the DSP extension and no MVE (firmware/kernels/cmsis_nn_depthwise_3x3_dsp.c, whose
# dk_depthwise_conv_3x3_s8_applies this mirrors), in place or not; they link no CMSIS-NN
# depthwise kernel.
DK_DSP_3X3 = "dk_dsp_3x3"
DK_DSP_3X3_MAX_WIDTH = 7  # output pixels per row: the kernel's buffer holds 9 columns
# The same on a core with MVE (firmware/kernels/cmsis_nn_depthwise_3x3_mve.c, whose
# dk_depthwise_conv_3x3_s8_applies dk_mve_3x3_applies mirrors): those layers link no CMSIS-NN
# depthwise kernel either.
DK_MVE_3X3 = "dk_mve_3x3"
DK_MVE_3X3_MAX_ROWS = 32  # padded input rows: the kernel's buffer holds columns of 32 bytes
DK_MVE_3X3_MAX_COLUMNS = 9  # padded input columns
# A layer only CMSIS-NN's wrapper runs (MVE: one input channel to several output channels,
# through a convolution private to the wrapper's file), or one whose arguments this reader does
# not know: the program keeps the wrapper.
WRAPPER_ONLY = "to_conv"


def conv_kernel(input_sizes: list[int], weight_sizes: list[int], stride: list[int],
                padding: list[int], dilation: list[int]) -> str:
    """The kernel ``arm_convolve_wrapper_s8`` picks for a layer (input NCHW, weight OHWI)."""
    _, channels, height, _ = input_sizes
    _, kernel_h, kernel_w, kernel_c = weight_sizes
    if (list(padding) == [0, 0] and (kernel_h, kernel_w) == (1, 1) and list(dilation) == [1, 1]
            and channels == kernel_c):
        return "1x1_fast" if list(stride) == [1, 1] else "1x1"
    if (height == 1 and dilation[1] == 1 and kernel_h == 1 and (stride[1] * channels) % 4 == 0
            and channels == kernel_c):
        return "1_x_n"
    return "generic"


def depthwise_kernel(input_sizes: list[int], output_channels: int, kernel_hw: tuple[int, int],
                     padding: list[int], dilation: list[int], multiplier: int, mve: bool,
                     stride: list[int] | None = None, dsp: bool = False) -> str:
    """The kernel ``arm_depthwise_conv_wrapper_s8`` picks for a layer (input NCHW sizes), or
    DK_DSP_3X3 (a core with `dsp` and no MVE) or DK_MVE_3X3 (a core with MVE) for a layer that
    deploykit's own kernel runs."""
    batch, channels = input_sizes[0], input_sizes[1]
    if mve and dk_mve_3x3_applies(input_sizes, output_channels, kernel_hw, padding, dilation,
                                  multiplier, stride or [1, 1]):
        return DK_MVE_3X3
    if (dsp and not mve and dk_dsp_3x3_applies(input_sizes, output_channels, kernel_hw, padding,
                                                dilation, multiplier, stride or [1, 1])):
        return DK_DSP_3X3
    # CONVERT_DW_CONV_WITH_ONE_INPUT_CH_AND_OUTPUT_CH_ABOVE_THRESHOLD is 1 with GCC.
    if mve and channels == 1 and output_channels > 1:
        return WRAPPER_ONLY
    if multiplier == 1 and batch == 1 and list(dilation) == [1, 1]:
        if not mve and kernel_hw == (3, 3) and padding[0] <= 1 and padding[1] <= 1:
            return "3x3"
        return "opt"
    return "generic"


def dk_dsp_3x3_applies(input_sizes: list[int], output_channels: int,
                       kernel_hw: tuple[int, int], padding: list[int], dilation: list[int],
                       multiplier: int, stride: list[int]) -> bool:
    """Whether the DSP dk_depthwise_conv_3x3_s8 runs a layer: batch 1, channel multiplier 1, a
    multiple of 4 channels, 3x3, stride and dilation 1, padding 0 or 1, output rows of at most
    DK_DSP_3X3_MAX_WIDTH pixels."""
    batch, channels, height, width = input_sizes
    out_h, out_w = height + 2 * padding[0] - 2, width + 2 * padding[1] - 2
    return (batch == 1 and multiplier == 1 and output_channels == channels and channels >= 4
            and channels % 4 == 0 and tuple(kernel_hw) == (3, 3) and list(dilation) == [1, 1]
            and list(stride) == [1, 1] and all(0 <= p <= 1 for p in padding)
            and out_h >= 1 and 1 <= out_w <= DK_DSP_3X3_MAX_WIDTH)


def dk_mve_3x3_applies(input_sizes: list[int], output_channels: int,
                       kernel_hw: tuple[int, int], padding: list[int], dilation: list[int],
                       multiplier: int, stride: list[int]) -> bool:
    """Whether the MVE dk_depthwise_conv_3x3_s8 runs a layer: batch 1, channel multiplier 1, a
    multiple of 4 channels, 3x3, stride and dilation 1, padding 0 or 1, a padded input map of
    at most DK_MVE_3X3_MAX_ROWS x DK_MVE_3X3_MAX_COLUMNS."""
    batch, channels, height, width = input_sizes
    out_h, out_w = height + 2 * padding[0] - 2, width + 2 * padding[1] - 2
    return (batch == 1 and multiplier == 1 and output_channels == channels and channels >= 4
            and channels % 4 == 0 and tuple(kernel_hw) == (3, 3) and list(dilation) == [1, 1]
            and list(stride) == [1, 1] and all(0 <= p <= 1 for p in padding)
            and out_h >= 1 and out_w >= 1
            and height + 2 * padding[0] <= DK_MVE_3X3_MAX_ROWS
            and width + 2 * padding[1] <= DK_MVE_3X3_MAX_COLUMNS)


def _ints(plan: Any, index: int) -> list[int]:
    """An IntList argument: its items are the indices of Int values."""
    return [int(plan.values[i].val.int_val) for i in plan.values[index].val.items]


def program_kernels(program: Any, mve: bool, dsp: bool = False) -> tuple[set[str], set[str]]:
    """The convolution kernels and the depthwise kernels the layers of every method of
    `program` take."""
    conv, depthwise = set(), set()
    for plan in program.execution_plan:
        for name, args in kernel_calls(plan):
            if name not in (CONV_OP, DEPTHWISE_OP):
                continue
            taken = conv if name == CONV_OP else depthwise
            try:
                taken.add(_layer_kernel(plan, name, args, mve, dsp))
            except (AttributeError, IndexError, TypeError, ValueError):
                # Not the argument layout of ExecuTorch v1.4.1's cortex_m operators (a program
                # made elsewhere): CMSIS-NN's wrapper picks, with every kernel linked.
                taken.add(WRAPPER_ONLY)
    return conv, depthwise


def _layer_kernel(plan: Any, name: str, args: list[int], mve: bool, dsp: bool) -> str:
    # (input, weight, bias, stride, padding, dilation, [depth_multiplier,] ..., out)
    x, weight, out = (plan.values[args[i]].val for i in (0, 1, -1))
    sizes = [int(s) for s in x.sizes]
    stride, padding, dilation = (_ints(plan, args[i]) for i in (3, 4, 5))
    if name == CONV_OP:
        return conv_kernel(sizes, [int(s) for s in weight.sizes], stride, padding, dilation)
    return depthwise_kernel(
        sizes, int(out.sizes[1]), (int(weight.sizes[1]), int(weight.sizes[2])), padding,
        dilation, int(plan.values[args[6]].val.int_val), mve, stride, dsp)


def kernel_definitions(pte_paths: list[Path], mve: bool, dsp: bool = False) -> dict[str, str]:
    """The firmware's DK_CMSIS_NN_CONVOLUTION and DK_CMSIS_NN_DEPTHWISE: the kernels these
    programs' layers take (";"-separated, "none" for no such layer or only deploykit's own),
    or "wrapper" when one needs the wrapper."""
    conv: set[str] = set()
    depthwise: set[str] = set()
    for path in pte_paths:
        c, d = program_kernels(load_program(path.read_bytes(), str(path)), mve, dsp)
        conv |= c
        depthwise |= d
    return {"DK_CMSIS_NN_CONVOLUTION": definition_value(conv, CONV_KERNELS),
            "DK_CMSIS_NN_DEPTHWISE": definition_value(depthwise, DEPTHWISE_KERNELS)}


def definition_value(taken: set[str], kernels: tuple[str, ...]) -> str:
    """The value of one definition: the kernels taken, in the firmware's order."""
    if WRAPPER_ONLY in taken:
        return "wrapper"
    return ";".join(k for k in kernels if k in taken) or "none"
