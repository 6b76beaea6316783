"""ExecuTorch programs deploykit did not make: written here with ExecuTorch's own Python API
only (no deploykit import), as a user of ExecuTorch would write them, for the tests of a .pte
as the model (tests/unit/test_foreign_program.py,
tests/integration/test_foreign_program_on_boards.py).

- `portable`: `to_edge_transform_and_lower(...).to_executorch()` with no partitioner (float32,
  portable kernels);
- `xnnpack`: the same with the XNNPACK partitioner (a Cortex-A board's delegate);
- `cortex_m`: quantized with ExecuTorch's CortexMQuantizer and lowered by its CortexMPassManager,
  as examples/arm/cortex_m_mv2_example.ipynb does (cortex_m:: operators, CMSIS-NN; channels-last
  inputs, as the notebook's).

`python tests/foreign_programs.py DIR` writes all three into DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


class SmallNet(nn.Module):
    """A conv, a pool, a linear: the operators every flow has kernels for."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv(x)))
        return self.fc(torch.flatten(x, 1))


def small_net() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(7)
    net = SmallNet().eval()
    return net, (torch.rand(1, 3, 8, 8) * 2 - 1,)


def portable(path: Path) -> Path:
    from executorch.exir import to_edge_transform_and_lower

    net, inputs = small_net()
    program = to_edge_transform_and_lower(torch.export.export(net, inputs)).to_executorch()
    path.write_bytes(program.buffer)
    return path


def xnnpack(path: Path) -> Path:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    net, inputs = small_net()
    program = to_edge_transform_and_lower(torch.export.export(net, inputs),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(program.buffer)
    return path


def cortex_m(path: Path) -> Path:
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    net, inputs = small_net()
    # CMSIS-NN works on channels-last tensors: the notebook's inputs are in that memory format.
    inputs = tuple(t.to(memory_format=torch.channels_last) for t in inputs)
    graph_module = torch.export.export(net, inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph_module, CortexMQuantizer())
    for k in range(8):  # calibration
        prepared(*[torch.sin(t * (k + 1)) for t in inputs])
    quantized = torch.export.export(convert_pt2e(prepared), inputs)
    config = EdgeCompileConfig(preserve_ops=[torch.ops.aten.linear.default],
                               _check_ir_validity=False)
    edge = to_edge(quantized, compile_config=config)
    edge._edge_programs["forward"] = CortexMPassManager(edge.exported_program()).transform()
    program = edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=False))
    path.write_bytes(program.buffer)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for make in (portable, xnnpack, cortex_m):
        print(make(out / f"{make.__name__}.pte"))
