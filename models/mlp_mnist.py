"""MLP for 28x28 MNIST-style digits: Linear 784-32-16-10 with ReLU.

The weights are seeded random (no training data is fetched), so the logits carry no meaning,
but they are deterministic. The example input is a synthetic handwritten-looking "7", drawn
from line strokes, lightly blurred and noised, and normalised with the MNIST mean/std, so its
values span the range a real digit would. Calibration uses a few other digits (0, 1, 4, 7)
at small shifts.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

# Device vs host reference. fp32: same portable kernels as the host pybindings (bit-exact seen),
# margin for float reassociation. int8: the cortex_m ops' integer reference matched the PT2E
# reference bit-exactly at export; the output step is about 0.0025, so 0.01 is ~4 steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-5},
    "cortex_m_int8": {"atol": 0.01},
}

# Digit strokes as polylines in pixel coordinates (x, y) of a 28x28 canvas.
_DIGITS: dict[str, list[list[tuple[float, float]]]] = {
    "7": [[(7.0, 7.0), (21.0, 7.0), (12.0, 23.0)], [(11.0, 15.0), (18.0, 15.0)]],
    "1": [[(11.0, 8.0), (14.5, 5.0), (14.5, 23.0)], [(11.0, 23.0), (18.0, 23.0)]],
    "4": [[(17.0, 5.0), (7.0, 17.0), (21.0, 17.0)], [(17.0, 9.0), (17.0, 23.0)]],
    "0": [[(14.0 + 6.0 * math.cos(k * math.pi / 6), 14.0 + 9.0 * math.sin(k * math.pi / 6))
           for k in range(13)]],
}


class MlpMnist(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 10)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return MlpMnist().eval()


def _segment_distance(px: torch.Tensor, py: torch.Tensor, a: tuple[float, float],
                      b: tuple[float, float]) -> torch.Tensor:
    ax, ay = a
    bx, by = b
    dx, dy = bx - ax, by - ay
    length2 = max(dx * dx + dy * dy, 1e-9)
    t = (((px - ax) * dx + (py - ay) * dy) / length2).clamp(0.0, 1.0)
    return torch.hypot(px - (ax + t * dx), py - (ay + t * dy))


def draw_digit(digit: str, shift: tuple[float, float] = (0.0, 0.0), thickness: float = 0.9,
               noise_seed: int = 0) -> torch.Tensor:
    """Render `digit` as a normalised 1x784 float tensor (MNIST layout and statistics)."""
    ys, xs = torch.meshgrid(torch.arange(28, dtype=torch.float32),
                            torch.arange(28, dtype=torch.float32), indexing="ij")
    dist = torch.full((28, 28), float("inf"))
    for stroke in _DIGITS[digit]:
        for a, b in zip(stroke[:-1], stroke[1:], strict=True):
            a2 = (a[0] + shift[0], a[1] + shift[1])
            b2 = (b[0] + shift[0], b[1] + shift[1])
            dist = torch.minimum(dist, _segment_distance(xs, ys, a2, b2))
    ink = (1.0 - (dist - thickness).clamp(min=0.0)).clamp(0.0, 1.0)  # 1-pixel soft edge
    gen = torch.Generator().manual_seed(noise_seed)
    ink = (ink + 0.05 * torch.rand(28, 28, generator=gen) * (ink > 0)).clamp(0.0, 1.0)
    return ((ink - MNIST_MEAN) / MNIST_STD).reshape(1, 784)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (draw_digit("7", noise_seed=7),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    samples = [example_inputs()]
    for i, (digit, shift) in enumerate([("0", (0.0, 0.0)), ("1", (-2.0, 1.0)),
                                        ("4", (1.0, -1.0)), ("7", (2.0, 2.0)),
                                        ("0", (-1.5, 1.0)), ("4", (-2.0, 0.0))]):
        samples.append((draw_digit(digit, shift=shift, noise_seed=100 + i),))
    return samples
