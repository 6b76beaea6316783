"""MobileNetV1 x0.25 visual wake words (MLPerf Tiny VWW): 1x3x96x96 image -> 2 classes, 7.5 M MACs.

The architecture is the MLPerf Tiny v1 reference: MobileNetV1 (Howard et al. 2017) at width
0.25, a stride-2 3x3 stem conv to 8 channels, 13 depthwise-separable blocks (depthwise 3x3 ->
BatchNorm -> ReLU -> pointwise 1x1 -> BatchNorm -> ReLU) widening 8 -> 256 channels with
stride 2 at 16, 32, 64 and 128 channels and at 256, a global average pool and a 2-way Linear
(person / no person).

Weights are seeded random, so the logits carry no meaning, but they are deterministic. The
BatchNorm statistics are estimated once from synthetic pictures, so activations are as well
scaled as in a trained network and int8 calibration sees realistic ranges. The example input
is a synthetic 96x96 RGB scene in [0, 1] as the reference preprocessing makes it (pixels /
255): a wall-and-floor background, a person-like figure (head disc, torso and legs), an
object, and a little seeded noise. Calibration uses other scenes, with and without a figure.

A trained checkpoint (a state_dict of this module) loads through `model()`: set `CHECKPOINT`
below, or the environment variable DEPLOYKIT_MOBILENET_V1_025_CHECKPOINT, to the .pt file.
"""

from __future__ import annotations

import os

import torch
from _seeded_cnn import trained_or_seeded
from torch import nn

SIZE, CLASSES = 96, 2
CHECKPOINT = os.environ.get("DEPLOYKIT_MOBILENET_V1_025_CHECKPOINT", "")

# (output channels, stride) of the 13 depthwise-separable blocks at width 0.25.
BLOCKS = (
    (16, 1),
    (32, 2),
    (32, 1),
    (64, 2),
    (64, 1),
    (128, 2),
    (128, 1),
    (128, 1),
    (128, 1),
    (128, 1),
    (128, 1),
    (256, 2),
    (256, 1),
)

# Device vs host reference (see ds_cnn.py): the output step of the 2-way head is small, so
# 0.05 allows a few steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
    "ethos_u_int8": {"atol": 0.05},
}


def conv_bn_relu(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class MobileNetV1(nn.Module):
    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        cin = 8
        layers = [conv_bn_relu(3, cin, 3, 2)]
        for cout, stride in BLOCKS:
            layers.append(conv_bn_relu(cin, cin, 3, stride, groups=cin))  # depthwise
            layers.append(conv_bn_relu(cin, cout, 1, 1))  # pointwise
            cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def scene(seed: int = 0, person: bool = True) -> torch.Tensor:
    """A deterministic 1x3x96x96 scene in [0, 1]. `seed` moves things and changes colours."""
    gen = torch.Generator().manual_seed(seed)
    u = [float(v) for v in torch.rand(10, generator=gen)]
    ys, xs = torch.meshgrid(
        torch.linspace(0.0, 1.0, SIZE), torch.linspace(0.0, 1.0, SIZE), indexing="ij"
    )
    horizon = 0.55 + 0.2 * u[0]
    wall = torch.tensor([0.55 + 0.3 * u[1], 0.5 + 0.3 * u[2], 0.45 + 0.3 * u[3]]).view(3, 1, 1)
    floor = torch.tensor([0.35, 0.25 + 0.2 * u[4], 0.2]).view(3, 1, 1)
    img = torch.where(ys < horizon, wall * (0.8 + 0.2 * xs), floor * (0.7 + 0.3 * ys))

    def paint(mask: torch.Tensor, colour: tuple[float, float, float]) -> None:
        nonlocal img
        m = mask.float()
        img = img * (1.0 - m) + torch.tensor(colour).view(3, 1, 1) * m

    # An object: a box standing on the floor.
    bx = 0.1 + 0.7 * u[5]
    paint((abs(xs - bx) < 0.08) & (ys > horizon - 0.1) & (ys < horizon + 0.1), (0.2, 0.3, 0.6))
    if person:
        cx, scale = 0.2 + 0.6 * u[6], 0.7 + 0.5 * u[7]
        top = 0.15 + 0.1 * u[8]
        head = 0.06 * scale
        paint(((xs - cx) ** 2 + (ys - top - head) ** 2).sqrt() < head, (0.85, 0.65, 0.5))
        torso_top, torso_bottom = top + 2 * head, top + 2 * head + 0.3 * scale
        shirt = (0.7 * u[9], 0.2, 1.0 - 0.7 * u[9])
        paint((abs(xs - cx) < 0.08 * scale) & (ys > torso_top) & (ys < torso_bottom), shirt)
        legs = (
            (abs(abs(xs - cx) - 0.04 * scale) < 0.025 * scale)
            & (ys > torso_bottom)
            & (ys < torso_bottom + 0.3 * scale)
        )
        paint(legs, (0.15, 0.15, 0.25))
    img = (img + 0.03 * torch.randn(img.shape, generator=gen)).clamp(0.0, 1.0)
    return img.unsqueeze(0).contiguous()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    batches = (torch.cat([scene(seed=100 + 8 * i + j, person=j % 2 == 0) for j in range(8)])
               for i in range(3))
    return trained_or_seeded(MobileNetV1(), CHECKPOINT, batches)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (scene(seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((scene(seed=10 + i, person=i % 2 == 0),) for i in range(5))]
