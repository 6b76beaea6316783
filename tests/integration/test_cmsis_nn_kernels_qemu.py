"""The firmware links only the CMSIS-NN kernels its layers take (readers/cmsis_nn_kernels.py,
firmware/kernels/cmsis_nn_in_place.c), on both QEMU boards:
- its image is smaller than one that calls CMSIS-NN's wrappers, which link every kernel they
  could pick, and its outputs are those of the wrappers' firmware, which equal the host's;
- with the generic depthwise kernel alone (whose domain holds every depthwise layer, with no
  scratch) the outputs are the same bytes;
- a layer whose kernel is left out is refused with ARM_CMSIS_NN_ARG_ERROR, named in the
  execute_error record, not run wrong: with no depthwise kernel, and with the generic
  convolution alone, whose im2col scratch the pointwise layer's program does not give.

Needs the ExecuTorch and CMSIS-NN sources (`deploykit setup`); CI has no GitHub, so these skip
there with the reason. About two minutes per board on 2 cores with the runtimes in the cache.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from deploykit import api
from deploykit.pipeline.chains import FirmwareVariant, build_firmware
from deploykit.pipeline.target import resolve_target
from deploykit.readers.boards import load_board
from deploykit.readers.sizes import size_report
from deploykit.run.runners import runner_for_board
from deploykit.util.errors import ExitCode
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

# A 3x3 convolution from 3 channels and one strided (generic), a pointwise one (1x1 fast), a 3x3
# depthwise one (3x3 kernel on the M33, opt on the M55) and a strided depthwise one.
LAYERS = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.pw = nn.Conv2d(16, 24, 1)
            self.dw2 = nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24)
            self.down = nn.Conv2d(24, 16, 3, stride=2, padding=1)
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = torch.relu(self.pw(torch.relu(self.dw(x))))
            x = torch.relu(self.down(torch.relu(self.dw2(x))))
            return self.head(nn.functional.avg_pool2d(x, 3).flatten(1))

    def model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        g = torch.Generator().manual_seed(1)
        return (torch.rand(1, 3, 12, 10, generator=g),)
""")

WRAPPERS = {"DK_CMSIS_NN_CONVOLUTION": "wrapper", "DK_CMSIS_NN_DEPTHWISE": "wrapper"}
DEPTHWISE_GENERIC = {"DK_CMSIS_NN_DEPTHWISE": "generic"}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmsis_nn_kernels") / "layers.py"
    path.write_text(LAYERS)
    return path


def _variant_run(board_name: str, model_file, out, directory: str, definitions: dict):
    board = load_board(board_name)
    target = resolve_target(board, flow="cortex_m_int8", profile="size")
    built = build_firmware(target, str(model_file), out, None, lambda _msg: None,
                           variant=FirmwareVariant(directory, definitions))
    result = runner_for_board(board).run(built.firmware.elf, out / f"run-{directory}",
                                         timeout_s=60, check=False)
    return built.firmware.elf, result


def _code(elf) -> int:
    return size_report(elf.with_suffix(".map"), elf).code_excluding_model()


def _outputs(result) -> list[np.ndarray]:
    return [t.data for _, t in sorted(result.records.tensors.items())]


@pytest.mark.parametrize("board", ["qemu-an505", "qemu-an547"])
def test_only_the_kernels_the_layers_take_are_linked(tmp_path, model_file, board):
    report = api.run(board, str(model_file), flow="cortex_m_int8", profile="size", out=tmp_path,
                     timeout=300, project=False)
    assert report.passed, report.summary()
    assert all(o.max_abs_error == 0.0 for o in report.verdict.outputs), report.summary()
    selected = tmp_path / "firmware" / "dk_runner.elf"
    assert "DK_CMSIS_NN_CONV_SELECTED=1" in (tmp_path / "firmware" / "build.ninja").read_text()

    wrappers_elf, wrappers = _variant_run(board, model_file, tmp_path, "firmware-wrappers",
                                          WRAPPERS)
    assert wrappers.outcome().exit_code == ExitCode.OK, wrappers.outcome().cause
    _, generic = _variant_run(board, model_file, tmp_path, "firmware-generic", DEPTHWISE_GENERIC)
    assert generic.outcome().exit_code == ExitCode.OK, generic.outcome().cause
    selected_run = runner_for_board(load_board(board)).run(selected, tmp_path / "run-selected",
                                                           timeout_s=60)
    # The same bytes out of all three, and the wrappers' firmware carries the kernels no layer
    # of this model takes.
    expected = _outputs(wrappers)
    assert expected
    for got in (_outputs(selected_run), _outputs(generic)):
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert _code(selected) < _code(wrappers_elf) - 1000, (_code(selected), _code(wrappers_elf))


@pytest.mark.parametrize(("directory", "definitions", "call"), [
    ("firmware-no-depthwise", {"DK_CMSIS_NN_DEPTHWISE": "none"}, "arm_depthwise_conv_wrapper_s8"),
    ("firmware-generic-conv", {"DK_CMSIS_NN_CONVOLUTION": "generic"}, "arm_convolve_wrapper_s8"),
])
def test_a_layer_whose_kernel_is_left_out_is_refused(tmp_path, model_file, directory,
                                                     definitions, call):
    _, result = _variant_run("qemu-an547", model_file, tmp_path, directory, definitions)
    (failure,) = result.records.execute_errors
    assert failure.kernel_message == f"{call} returned ARM_CMSIS_NN_ARG_ERROR"
    assert result.outcome().exit_code == ExitCode.DEVICE_ERROR
