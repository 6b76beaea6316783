"""Tiny CNN on a 1x3x8x8 image: conv 3->8 3x3 -> ReLU -> conv 8->16 3x3 -> ReLU -> 2x2 max pool
-> global average pool -> flatten -> Linear 16->10.

The smallest model that exercises conv, both pooling kernels and linear. Weights are seeded
random. The example input is a synthetic 8x8 RGB picture (a horizontal red gradient, a
vertical green gradient, a blue disc off-centre, plus a little seeded noise) scaled to
[-1, 1]; calibration uses the same kind of picture with other disc positions and noise.

Why global average pooling before the flatten: in the int8 flow activations are channels-last,
so flattening a 4x4 map needs an NHWC->NCHW copy (dim_order_ops::_clone_dim_order, a portable
kernel); after pooling to 1x1 there is nothing to reorder and the int8 graph is all cortex_m.
AdaptiveAvgPool2d(1) rather than AvgPool2d(4), which adds a no-op cortex_m::pad in 1.4.1.
"""

from __future__ import annotations

import torch
from torch import nn

# Device vs host reference. fp32: same portable kernels as the host pybindings (bit-exact seen),
# margin for float reassociation. int8: the cortex_m ops' integer reference matched the PT2E
# reference bit-exactly at export; the output step is about 0.0028, so 0.01 is ~3 steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-5},
    "cortex_m_int8": {"atol": 0.01},
}


class TinyCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.conv1(x))
        x = self.relu2(self.conv2(x))
        x = self.gap(self.pool(x))
        return self.fc(torch.flatten(x, 1))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyCnn().eval()


def picture(disc_center: tuple[float, float] = (5.0, 2.5), noise_seed: int = 0) -> torch.Tensor:
    """A deterministic 1x3x8x8 RGB picture in [-1, 1]."""
    ys, xs = torch.meshgrid(torch.arange(8, dtype=torch.float32),
                            torch.arange(8, dtype=torch.float32), indexing="ij")
    red = xs / 7.0
    green = 1.0 - ys / 7.0
    cx, cy = disc_center
    blue = (2.5 - torch.hypot(xs - cx, ys - cy)).clamp(0.0, 1.0)
    img = torch.stack([red, green, blue]).unsqueeze(0)
    gen = torch.Generator().manual_seed(noise_seed)
    img = img + 0.08 * torch.randn(img.shape, generator=gen)
    return (img * 2.0 - 1.0).clamp(-1.0, 1.0)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (picture(noise_seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    samples = [example_inputs()]
    for i, center in enumerate([(2.0, 2.0), (6.0, 6.0), (1.0, 5.5), (4.0, 4.0), (3.5, 0.5)]):
        samples.append((picture(disc_center=center, noise_seed=10 + i),))
    return samples
