"""DS-CNN keyword spotting (MLPerf Tiny KWS): 1x1x49x10 MFCCs -> 12 classes, 2.66 M MACs.

The architecture is the MLPerf Tiny v1 reference (the "DS-CNN small" of Zhang et al. 2017,
Hello Edge): a 10x4 stride-2 conv to 64 channels, four depthwise-separable blocks (depthwise
3x3 -> BatchNorm -> ReLU -> pointwise 1x1 to 64 -> BatchNorm -> ReLU), a global average pool
and a 12-way Linear. Dropout is left out: it is the identity at inference.

Weights are seeded random, so the logits carry no meaning, but they are deterministic. The
BatchNorm statistics are estimated once from synthetic MFCCs, so activations are as well
scaled as in a trained network and int8 calibration sees realistic ranges. The example input
is a synthetic MFCC map of one spoken word: 49 frames of 10 coefficients, a log-energy
coefficient c0 that rises over the word and falls back to the noise floor, higher
coefficients whose spread shrinks with the index, formant-like slow modulation, and a little
seeded noise. Calibration uses other words (positions, lengths, pitches).

A trained checkpoint (a state_dict of this module, e.g. from a PyTorch port of the reference
training) loads through `model()`: set `CHECKPOINT` below, or the environment variable
DEPLOYKIT_DS_CNN_CHECKPOINT, to the .pt file; the seeded weights are then replaced.

The global average pool is AdaptiveAvgPool2d(1): pooling to 1x1 before the flatten keeps the
int8 graph channels-last end to end (no NHWC->NCHW copy in a portable kernel).
"""

from __future__ import annotations

import os

import torch
from _seeded_cnn import trained_or_seeded
from torch import nn

FRAMES, COEFFS, CLASSES = 49, 10, 12
CHECKPOINT = os.environ.get("DEPLOYKIT_DS_CNN_CHECKPOINT", "")

# Device vs host reference. fp32: the portable kernels, margin for float reassociation.
# int8 and Ethos-U int8: the device matches the integer reference bit-exactly; the output
# step of the seeded network is about 0.01-0.02, so 0.05 allows a few steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
    "ethos_u_int8": {"atol": 0.05},
}


def conv_bn_relu(
    cin: int,
    cout: int,
    kernel: int | tuple[int, int],
    stride: int,
    padding: int | tuple[int, int],
    groups: int = 1,
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class DsCnn(nn.Module):
    def __init__(self, channels: int = 64, blocks: int = 4, classes: int = CLASSES) -> None:
        super().__init__()
        # (5, 1) padding gives the reference's 25x5 map from 49x10 at stride 2.
        layers = [conv_bn_relu(1, channels, (10, 4), 2, (5, 1))]
        for _ in range(blocks):
            layers.append(conv_bn_relu(channels, channels, 3, 1, 1, groups=channels))
            layers.append(conv_bn_relu(channels, channels, 1, 1, 0))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def mfcc(seed: int = 0) -> torch.Tensor:
    """A deterministic 1x1x49x10 MFCC-like map of one word. `seed` moves the word, changes its
    length and pitch, and the noise."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(4, generator=gen)
    t = torch.arange(FRAMES, dtype=torch.float32)
    centre = 12.0 + 25.0 * float(u[0])
    width = 5.0 + 6.0 * float(u[1])
    envelope = torch.exp(-0.5 * ((t - centre) / width) ** 2)  # the word's loudness
    k = torch.arange(COEFFS, dtype=torch.float32)
    pitch = 0.15 + 0.25 * float(u[2])
    # c0: log energy from a noise floor of about -30 to +15 during the word.
    c0 = -30.0 + 45.0 * envelope
    # c1..c9: spectral shape, larger while the word is spoken, decaying with the index.
    shape = torch.cos(pitch * t[:, None] * (1.0 + k[None, :]) + 6.28 * float(u[3]) * k[None, :])
    rest = (3.0 + 12.0 * envelope[:, None]) * shape / (1.0 + 0.5 * k[None, :])
    out = torch.cat([c0[:, None], rest[:, 1:]], dim=1)
    out = out + 1.5 * torch.randn(out.shape, generator=gen)
    return out.reshape(1, 1, FRAMES, COEFFS).contiguous()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    batches = (torch.cat([mfcc(seed=100 + 8 * i + j) for j in range(8)]) for i in range(4))
    return trained_or_seeded(DsCnn(), CHECKPOINT, batches)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (mfcc(seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((mfcc(seed=10 + i),) for i in range(7))]
