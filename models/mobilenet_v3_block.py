"""One MobileNetV3 bottleneck block on a 1x16x12x12 feature map: 1x1 expand conv to 48 channels
-> BatchNorm -> hardswish, depthwise 3x3 -> BatchNorm -> hardswish, squeeze-excite (global
average pool -> 1x1 conv 48->12 -> ReLU -> 1x1 conv 12->48 -> hardsigmoid, the result
multiplied into the feature map), 1x1 project conv back to 16 channels -> BatchNorm, and the
residual add of the block's input.

The block of Howard et al. 2019 ("Searching for MobileNetV3"), small enough for a unit test's
export. It is here for the shapes of program it lowers to: the squeeze-excite's 1x1 gate is
broadcast over the 12x12 map, the hardswish is `x * hardsigmoid(x)` (an operator whose input is
read twice), and the block's input is read again by the residual add after four layers.

Weights are seeded random with BatchNorm statistics estimated from synthetic feature maps (as
training would), so every layer is well scaled and int8 calibration sees realistic ranges.
The example input is a smooth seeded feature map (sums of sinusoids plus a little noise).
"""

from __future__ import annotations

import math

import torch
from torch import nn

CHANNELS, EXPANDED, SQUEEZED, SIZE = 16, 48, 12, 12

# Device vs host reference. fp32: the portable kernels, as the host pybindings run them. int8:
# the output step is about 0.02 over a range near 5; 0.08 is about four steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.08},
}


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.relu = nn.ReLU()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


class Bottleneck(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(CHANNELS, EXPANDED, 1, bias=False),
                                    nn.BatchNorm2d(EXPANDED), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(EXPANDED, EXPANDED, 3, padding=1, groups=EXPANDED, bias=False),
            nn.BatchNorm2d(EXPANDED), nn.Hardswish())
        self.se = SqueezeExcite(EXPANDED, SQUEEZED)
        self.project = nn.Sequential(nn.Conv2d(EXPANDED, CHANNELS, 1, bias=False),
                                     nn.BatchNorm2d(CHANNELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.depthwise(self.expand(x))))


def feature_map(seed: int) -> torch.Tensor:
    """A deterministic 1x16x12x12 map: per channel a seeded sum of two sinusoids, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32),
                            torch.arange(SIZE, dtype=torch.float32), indexing="ij")
    channels = []
    for _ in range(CHANNELS):
        fx, fy, phase = (torch.rand(3, generator=gen) * torch.tensor([0.8, 0.8, 2 * math.pi]))
        channels.append(torch.sin(fx * xs + phase) + torch.cos(fy * ys - phase))
    x = torch.stack(channels).unsqueeze(0)
    return x + 0.1 * torch.randn(x.shape, generator=gen)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = Bottleneck()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.momentum = None  # cumulative average over the statistics batches
    net.train()
    with torch.no_grad():
        for seed in range(100, 108):
            net(feature_map(seed))
    return net.eval()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (feature_map(1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs()] + [(feature_map(10 + i),) for i in range(5)]
