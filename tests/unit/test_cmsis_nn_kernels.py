"""The CMSIS-NN kernel each convolution and depthwise layer takes, as CMSIS-NN's wrappers pick
them (readers/cmsis_nn_kernels.py): the firmware links only the kernels a program's layers
take. The choices on real programs are checked in tests/integration/test_in_place_export.py,
and the firmware built from them in test_in_place_qemu.py and test_cmsis_nn_kernels_qemu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deploykit.readers.cmsis_nn_kernels import (
    CONV_KERNELS,
    DEPTHWISE_KERNELS,
    DEPTHWISE_OP,
    DK_DSP_3X3,
    DK_MVE_3X3,
    WRAPPER_ONLY,
    conv_kernel,
    definition_value,
    depthwise_kernel,
    program_kernels,
)


@pytest.mark.parametrize(("case", "input_sizes", "weight", "stride", "padding", "dilation",
                          "kernel"), [
    ("pointwise", [1, 16, 8, 8], [32, 1, 1, 16], [1, 1], [0, 0], [1, 1], "1x1_fast"),
    ("strided pointwise", [1, 16, 8, 8], [32, 1, 1, 16], [2, 2], [0, 0], [1, 1], "1x1"),
    ("padded pointwise", [1, 16, 8, 8], [32, 1, 1, 16], [1, 1], [1, 1], [1, 1], "generic"),
    ("grouped pointwise", [1, 16, 8, 8], [32, 1, 1, 8], [1, 1], [0, 0], [1, 1], "generic"),
    ("1xN on one row", [1, 16, 1, 49], [32, 1, 5, 16], [1, 1], [0, 2], [1, 1], "1_x_n"),
    ("1xN, 3 channels x stride 1", [1, 3, 1, 49], [8, 1, 5, 3], [1, 1], [0, 2], [1, 1],
     "generic"),
    ("1xN on two rows", [1, 16, 2, 49], [32, 1, 5, 16], [1, 1], [0, 2], [1, 1], "generic"),
    ("3x3", [1, 16, 8, 8], [32, 3, 3, 16], [1, 1], [1, 1], [1, 1], "generic"),
])
def test_the_convolution_kernel_is_the_wrappers(case, input_sizes, weight, stride, padding,
                                                dilation, kernel):
    assert conv_kernel(input_sizes, weight, stride, padding, dilation) == kernel, case


@pytest.mark.parametrize(("case", "input_sizes", "out_channels", "kernel_hw", "padding",
                          "dilation", "multiplier", "mve", "kernel"), [
    ("3x3 on MVE", [1, 64, 25, 5], 64, (3, 3), [1, 1], [1, 1], 1, True, DK_MVE_3X3),
    ("3x3 on MVE, rows of 10", [1, 64, 25, 10], 64, (3, 3), [1, 1], [1, 1], 1, True, "opt"),
    ("3x3 on DSP", [1, 64, 25, 5], 64, (3, 3), [1, 1], [1, 1], 1, False, "3x3"),
    ("3x3, padding 2, on DSP", [1, 64, 25, 5], 64, (3, 3), [2, 2], [1, 1], 1, False, "opt"),
    ("5x5 on DSP", [1, 64, 25, 5], 64, (5, 5), [2, 2], [1, 1], 1, False, "opt"),
    ("dilated", [1, 64, 25, 5], 64, (3, 3), [2, 2], [2, 2], 1, True, "generic"),
    ("multiplier 2", [1, 32, 25, 5], 64, (3, 3), [1, 1], [1, 1], 2, False, "generic"),
    ("batch 2", [2, 64, 25, 5], 64, (3, 3), [1, 1], [1, 1], 1, False, "generic"),
    ("one input channel on MVE", [1, 1, 49, 10], 64, (10, 4), [4, 1], [1, 1], 64, True,
     WRAPPER_ONLY),
    ("one input channel on DSP", [1, 1, 49, 10], 64, (10, 4), [4, 1], [1, 1], 64, False,
     "generic"),
])
def test_the_depthwise_kernel_is_the_wrappers(case, input_sizes, out_channels, kernel_hw,
                                              padding, dilation, multiplier, mve, kernel):
    assert depthwise_kernel(input_sizes, out_channels, kernel_hw, padding, dilation, multiplier,
                            mve) == kernel, case


@pytest.mark.parametrize(("case", "input_sizes", "padding", "stride", "mve", "dsp", "kernel"), [
    ("ds_cnn's 25x5 on the M33", [1, 64, 25, 5], [1, 1], [1, 1], False, True, DK_DSP_3X3),
    ("padding 0, one 7-pixel output row", [1, 4, 3, 9], [0, 0], [1, 1], False, True,
     DK_DSP_3X3),
    ("padding (1, 0)", [1, 12, 17, 9], [1, 0], [1, 1], False, True, DK_DSP_3X3),
    ("rows of 8 output pixels", [1, 64, 25, 8], [1, 1], [1, 1], False, True, "3x3"),
    ("13 channels", [1, 13, 25, 5], [1, 1], [1, 1], False, True, "3x3"),
    ("stride 2", [1, 64, 25, 5], [1, 1], [2, 2], False, True, "3x3"),
    ("no DSP (M0+, M23)", [1, 64, 25, 5], [1, 1], [1, 1], False, False, "3x3"),
    ("MVE (M55)", [1, 64, 25, 5], [1, 1], [1, 1], True, True, DK_MVE_3X3),
])
def test_deploykits_own_3x3_takes_the_dsp_layers_of_its_domain(case, input_sizes, padding,
                                                                stride, mve, dsp, kernel):
    """The layers firmware/kernels/cmsis_nn_depthwise_3x3_dsp.c runs link no CMSIS-NN kernel."""
    assert depthwise_kernel(input_sizes, input_sizes[1], (3, 3), padding, [1, 1], 1, mve,
                            stride, dsp) == kernel, case
    assert definition_value({DK_DSP_3X3}, DEPTHWISE_KERNELS) == "none"
    assert definition_value({DK_DSP_3X3, "opt"}, DEPTHWISE_KERNELS) == "opt"


@pytest.mark.parametrize(("case", "input_sizes", "padding", "stride", "kernel"), [
    ("ds_cnn's 25x5", [1, 64, 25, 5], [1, 1], [1, 1], DK_MVE_3X3),
    ("padding 0, 32 rows of 9", [1, 4, 32, 9], [0, 0], [1, 1], DK_MVE_3X3),
    ("padding (1, 0)", [1, 12, 17, 9], [1, 0], [1, 1], DK_MVE_3X3),
    ("33 padded rows", [1, 4, 31, 5], [1, 1], [1, 1], "opt"),
    ("10 padded columns", [1, 4, 20, 8], [1, 1], [1, 1], "opt"),
    ("13 channels", [1, 13, 25, 5], [1, 1], [1, 1], "opt"),
    ("stride 2", [1, 64, 25, 5], [1, 1], [2, 2], "opt"),
])
def test_deploykits_own_3x3_takes_the_mve_layers_of_its_domain(case, input_sizes, padding,
                                                                stride, kernel):
    """The layers firmware/kernels/cmsis_nn_depthwise_3x3_mve.c runs link no CMSIS-NN kernel."""
    assert depthwise_kernel(input_sizes, input_sizes[1], (3, 3), padding, [1, 1], 1, True,
                            stride, True) == kernel, case
    assert definition_value({DK_MVE_3X3}, DEPTHWISE_KERNELS) == "none"


def test_the_definition_lists_kernels_in_the_firmwares_order():
    assert definition_value({"generic", "1x1_fast"}, CONV_KERNELS) == "1x1_fast;generic"
    assert definition_value({"generic", "opt", "3x3"}, DEPTHWISE_KERNELS) == "3x3;opt;generic"
    assert definition_value(set(), DEPTHWISE_KERNELS) == "none"
    # A layer only the wrapper runs keeps the wrapper, and with it every kernel.
    assert definition_value({"opt", WRAPPER_ONLY}, DEPTHWISE_KERNELS) == "wrapper"


class KernelCall(SimpleNamespace):
    """An instruction of the program's schema by its type name, as the .pte reader tells them."""


def test_a_layer_of_unknown_arguments_keeps_the_wrapper():
    """A depthwise call whose arguments are not the layout of ExecuTorch v1.4.1's cortex_m
    operator (here: too few, a program made elsewhere) links every kernel instead of failing
    the build."""
    x = SimpleNamespace(val=SimpleNamespace(sizes=[1, 8, 5, 5]))
    call = SimpleNamespace(instr_args=KernelCall(op_index=0, args=[0, 0, 0]))
    plan = SimpleNamespace(operators=[SimpleNamespace(name=DEPTHWISE_OP, overload="")],
                           values=[x], chains=[SimpleNamespace(instructions=[call])])
    program = SimpleNamespace(execution_plan=[plan])
    assert program_kernels(program, mve=True) == (set(), {WRAPPER_ONLY})
