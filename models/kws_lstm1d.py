"""Keyword spotter with a one-dimensional front end and an LSTM (issue #32).

Conv1d(40, 32, k5, s2, p2) + BatchNorm + ReLU, a dilated depthwise Conv1d(32, k3, p2, d2) +
ReLU, LSTM(32, 48) and a linear head to 12 classes, over 50 frames of 40 filterbank-like
features. Seeded random weights; the inputs are smooth synthetic feature tracks.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FEATURES = 40
FRAMES = 50
KEYWORDS = 12

# int8: the LSTM stays float (mixed precision) but reads the requantized front end, so a few
# output steps of difference between device and host arithmetic are allowed.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
}


class KwsLstm1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(FEATURES, 32, 5, stride=2, padding=2)
        self.bn = nn.BatchNorm1d(32)
        self.dw = nn.Conv1d(32, 32, 3, padding=2, dilation=2, groups=32)
        self.lstm = nn.LSTM(32, 48, batch_first=True)
        self.head = nn.Linear(48, KEYWORDS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.dw(x))
        out, _ = self.lstm(x.transpose(1, 2))
        return self.head(out[:, -1, :])


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = KwsLstm1d()
    with torch.no_grad():  # non-trivial batch norm statistics, so that folding is exercised
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.5, 1.5)
    return m.eval()


def features(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(FRAMES, dtype=torch.float32).unsqueeze(0)
    freq = 0.05 + 0.25 * torch.rand(FEATURES, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(FEATURES, 1, generator=gen)
    track = torch.sin(freq * t + phase) + 0.1 * torch.randn(FEATURES, FRAMES, generator=gen)
    return track.unsqueeze(0)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (features(7),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((features(100 + i),) for i in range(7))]
