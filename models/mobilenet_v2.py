"""MobileNetV2 (width 1.0) on a 1x3x224x224 image, written out here (torchvision does not import
beside this torch).

The architecture is the paper's (Sandler et al. 2018): a stride-2 3x3 stem conv to 32 channels,
17 inverted-residual blocks (expand 1x1 -> depthwise 3x3 -> project 1x1, ReLU6, residual add
when shape allows), a 1x1 conv to 1280 channels, global average pool and a 1000-way Linear.

Weights are seeded random, so the logits carry no meaning, but they are deterministic. The
BatchNorm running statistics are not left at 0/1: they are estimated once from a few synthetic
pictures (cumulative average, no gradients), so every layer's activations are well scaled, as
in a trained network, and int8 quantization sees realistic ranges.

The example input is a synthetic 224x224 RGB picture (colour gradients, a few discs and a bar,
a little seeded noise), normalised with the ImageNet mean/std. Calibration uses it and one more
picture of the same kind (other shapes, positions and noise): each calibration pass costs about
3 s on 2 cores, so two keep the Ethos-U export under a minute. Add pictures for better ranges.
"""

from __future__ import annotations

import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIZE = 224

# (expansion t, output channels c, repeats n, first stride s), from the paper's Table 2.
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=False),
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),  # linear bottleneck
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, extra: dict[int, nn.Module] | None = None) -> None:
        """`extra` inserts a module after the feature block of that index (see mobilenet_v2_lrn)."""
        super().__init__()
        cin = 32
        blocks: list[nn.Module] = [conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            for i in range(n):
                blocks.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        blocks.append(conv_bn_relu6(cin, 1280, 1, 1))
        for index, module in sorted((extra or {}).items(), reverse=True):
            blocks.insert(index + 1, module)
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def _init(net: nn.Module) -> None:
    """Seeded weights as torchvision initialises them, then BatchNorm statistics from
    synthetic pictures so activations stay well scaled through all 52 layers."""
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.momentum = None  # cumulative average over the statistics batches
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    net.train()
    with torch.no_grad():
        for i in range(3):
            net(torch.cat([picture(seed=100 + 4 * i + k) for k in range(4)]))
    net.eval()


def build(extra: dict[int, nn.Module] | None = None) -> nn.Module:
    torch.manual_seed(0)
    net = MobileNetV2(extra=extra)
    _init(net)
    return net.eval()


def model() -> torch.nn.Module:
    return build()


def picture(seed: int = 0) -> torch.Tensor:
    """A deterministic 1x3x224x224 picture, ImageNet-normalised. `seed` moves the shapes and
    changes the noise."""
    gen = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.linspace(0.0, 1.0, SIZE), torch.linspace(0.0, 1.0, SIZE),
                            indexing="ij")
    angle = float(torch.rand((), generator=gen)) * 3.14159
    ramp = (xs * torch.cos(torch.tensor(angle)) + ys * torch.sin(torch.tensor(angle)) + 1.0) / 2.5
    img = torch.stack([0.8 * ramp, 0.6 * (1.0 - ys) + 0.2, 0.3 + 0.4 * xs * ys])
    for _ in range(3):  # discs of random colour
        cx, cy, r = (float(v) for v in torch.rand(3, generator=gen))
        colour = torch.rand(3, 1, 1, generator=gen)
        mask = (((xs - cx) ** 2 + (ys - cy) ** 2).sqrt() < 0.08 + 0.2 * r).float()
        img = img * (1.0 - mask) + colour * mask
    y0 = float(torch.rand((), generator=gen)) * 0.8  # a dark horizontal bar
    bar = ((ys > y0) & (ys < y0 + 0.06)).float()
    img = img * (1.0 - 0.8 * bar)
    img = (img + 0.03 * torch.randn(img.shape, generator=gen)).clamp(0.0, 1.0)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((img - mean) / std).unsqueeze(0).contiguous()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (picture(seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), (picture(seed=11),)]
