"""The bench's digits-sized CNN (issue #28's throughput goal): input 1x1x8x8 float32, 10 logits.
conv 1->8 3x3 -> ReLU -> conv 8->16 3x3 stride 2 -> ReLU -> a 4x4 convolution over the whole
16x4x4 map as the classifier -> flatten.

The shape of a classifier of 8x8 handwritten digits, with seeded random weights: what a sample
costs to stream and run does not depend on the weights. The 4x4 convolution instead of a Linear
after a flatten keeps the int8 program free of an NHWC->NCHW copy (the 1x1 result flattens with
nothing to reorder). Samples are synthetic 8x8 strokes in [0, 1], as digit scans scaled to it.
"""

from __future__ import annotations

import torch
from torch import nn

# Device vs host reference. fp32: the portable kernels the host pybindings run, margin for float
# reassociation. int8: the cortex_m ops' integer reference is what CMSIS-NN computes; 0.05 is a
# few output steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
}


class Digits8x8Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1)
        self.relu2 = nn.ReLU()
        self.fc = nn.Conv2d(16, 10, kernel_size=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return torch.flatten(self.fc(x), 1)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Digits8x8Cnn().eval()


def stroke(seed: int) -> torch.Tensor:
    """A 1x1x8x8 image in [0, 1]: a few seeded strokes between random points, blurred."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.zeros(8, 8)
    points = torch.randint(0, 8, (4, 2), generator=gen)
    for (y0, x0), (y1, x1) in zip(points[:-1].tolist(), points[1:].tolist(), strict=True):
        for t in torch.linspace(0.0, 1.0, 12).tolist():
            img[round(y0 + (y1 - y0) * t), round(x0 + (x1 - x0) * t)] = 1.0
    blurred = torch.nn.functional.avg_pool2d(img[None, None], 3, stride=1, padding=1)
    return (0.6 * img[None, None] + 0.8 * blurred).clamp(0.0, 1.0)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (stroke(0),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [(stroke(seed),) for seed in range(32)]
