"""ResNet-8 CIFAR-10 image classification (MLPerf Tiny IC): 1x3x32x32 -> 10 classes, 12.5 M MACs.

The architecture is the MLPerf Tiny v1 reference: a 3x3 conv to 16 channels -> BatchNorm ->
ReLU, then three residual stacks of 16, 32 and 64 channels (the second and third start at
stride 2 with a 1x1 stride-2 conv on the shortcut), each two 3x3 conv -> BatchNorm with a ReLU
between and one after the residual add, then a global average pool and a 10-way Linear.

Weights are seeded random, so the logits carry no meaning, but they are deterministic. The
BatchNorm statistics are estimated once from synthetic pictures, so activations are as well
scaled as in a trained network and int8 calibration sees realistic ranges. The example input
is a synthetic 32x32 RGB picture in [0, 1], as the reference preprocessing (pixels / 255)
makes CIFAR-10 images: a sky gradient over ground, an object of random colour and shape in
the middle, and a little seeded noise. Calibration uses other such pictures.

A trained checkpoint (a state_dict of this module) loads through `model()`: set `CHECKPOINT`
below, or the environment variable DEPLOYKIT_RESNET8_CHECKPOINT, to the .pt file.
"""

from __future__ import annotations

import os

import torch
from _seeded_cnn import trained_or_seeded
from torch import nn

SIZE, CLASSES = 32, 10
CHECKPOINT = os.environ.get("DEPLOYKIT_RESNET8_CHECKPOINT", "")

# Device vs host reference (see ds_cnn.py).
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
    "ethos_u_int8": {"atol": 0.05},
}


class ResidualStack(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride, 0, bias=True)
            if stride != 1 or cin != cout
            else nn.Identity()
        )
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + self.shortcut(x))


class ResNet8(nn.Module):
    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.stacks = nn.Sequential(
            ResidualStack(16, 16, 1), ResidualStack(16, 32, 2), ResidualStack(32, 64, 2)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stacks(self.stem(x)))
        return self.classifier(torch.flatten(x, 1))


def picture(seed: int = 0) -> torch.Tensor:
    """A deterministic 1x3x32x32 CIFAR-like picture in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    u = [float(v) for v in torch.rand(9, generator=gen)]
    ys, xs = torch.meshgrid(
        torch.linspace(0.0, 1.0, SIZE), torch.linspace(0.0, 1.0, SIZE), indexing="ij"
    )
    horizon = 0.5 + 0.25 * u[0]
    sky = torch.stack([0.4 + 0.3 * ys, 0.6 + 0.2 * ys, torch.full_like(ys, 0.9)])
    ground = torch.stack([0.3 + 0.2 * u[1] + 0 * ys, 0.4 + 0.3 * u[2] + 0 * ys, 0.2 + 0 * ys])
    img = torch.where(ys < horizon, sky, ground)
    # The object: an ellipse of random colour, size and aspect around the middle.
    cx, cy = 0.35 + 0.3 * u[3], 0.35 + 0.3 * u[4]
    rx, ry = 0.15 + 0.15 * u[5], 0.1 + 0.15 * u[6]
    mask = ((((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2) < 1.0).float()
    colour = torch.tensor([u[7], 0.5 * u[8], 1.0 - u[7]]).view(3, 1, 1)
    shade = 0.75 + 0.25 * (1.0 - (ys - cy) / ry).clamp(0.0, 1.0)
    img = img * (1.0 - mask) + colour * shade * mask
    img = (img + 0.04 * torch.randn(img.shape, generator=gen)).clamp(0.0, 1.0)
    return img.unsqueeze(0).contiguous()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    batches = (torch.cat([picture(seed=100 + 8 * i + j) for j in range(8)]) for i in range(4))
    return trained_or_seeded(ResNet8(), CHECKPOINT, batches)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (picture(seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((picture(seed=10 + i),) for i in range(7))]
