"""GRU keyword spotter: nn.GRU(10, 24) over 49 frames of 10 MFCC-like features, then Linear.

The shape of the small recurrent keyword-spotting models (49 frames of 10 MFCCs, as in the
Speech Commands front end). The weights are seeded random (no training data is fetched), so
the logits carry no meaning, but they are deterministic. The example input and the calibration
inputs are smooth synthetic feature tracks (sums of slow sines plus a little noise), in the
range MFCC features have after per-feature normalisation.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FRAMES = 49
FEATURES = 10
HIDDEN = 24
KEYWORDS = 12

# int8: a GRU's recurrent state is requantized 49 times; the output step is ~0.005, so a few
# steps of drift between the device's CMSIS-NN arithmetic and the host's integer reference
# are allowed.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
}


class GruKws(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(FEATURES, HIDDEN, batch_first=True)
        self.classifier = nn.Linear(HIDDEN, KEYWORDS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.classifier(out[:, -1, :])


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return GruKws().eval()


def features(seed: int) -> torch.Tensor:
    """A [1, 49, 10] track: per feature, two slow sines with seeded phases, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(FRAMES, dtype=torch.float32).unsqueeze(1)
    freq = 0.05 + 0.25 * torch.rand(1, FEATURES, generator=gen)
    phase = 2 * math.pi * torch.rand(2, FEATURES, generator=gen)
    track = torch.sin(freq * t + phase[0]) + 0.5 * torch.sin(2.3 * freq * t + phase[1])
    return (track + 0.1 * torch.randn(FRAMES, FEATURES, generator=gen)).unsqueeze(0)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (features(7),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((features(100 + i),) for i in range(7))]
