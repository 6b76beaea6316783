"""Deep autoencoder anomaly detection (MLPerf Tiny AD): 1x640 log-mel frames -> 640, 0.26 M MACs.

The architecture is the MLPerf Tiny v1 reference (the DCASE 2020 task 2 baseline): input 640
values (5 frames x 128 log-mel bands), four Linear 128 -> BatchNorm -> ReLU, a bottleneck
Linear 8 -> BatchNorm -> ReLU, four Linear 128 -> BatchNorm -> ReLU and a Linear back to 640.
The anomaly score is the reconstruction error, computed outside the model.

Weights are seeded random, but deterministic. The BatchNorm statistics are estimated once
from synthetic spectra, so activations are as well scaled as in a trained network and int8
calibration sees realistic ranges. Each BatchNorm is then folded into the Linear before it
(at inference it is an affine map per output): there is no int8 kernel for a BatchNorm after
a Linear, so unfolded it would run in float between a dequantize and a quantize.

The example input is a synthetic machine sound: 5 consecutive log-mel frames of 128 bands,
a noise floor falling with frequency, a few stationary harmonics of a motor's rotation, a
slow amplitude wobble between frames, and seeded noise, in log-energy units as the reference
feature extraction produces (roughly -40 to +10). Calibration uses other machines (speeds).

A trained checkpoint (a state_dict of the unfolded module, `DeepAutoEncoder`) loads through
`model()`: set `CHECKPOINT` below, or the environment variable
DEPLOYKIT_DEEP_AUTOENCODER_CHECKPOINT, to the .pt file; the BatchNorms are folded after
loading.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

FRAMES, BANDS = 5, 128
INPUTS = FRAMES * BANDS
HIDDEN = (128, 128, 128, 128, 8, 128, 128, 128, 128)
CHECKPOINT = os.environ.get("DEPLOYKIT_DEEP_AUTOENCODER_CHECKPOINT", "")

# Device vs host reference. The output is a 640-value reconstruction in log-energy units
# (range about 60), so one int8 output step is about 0.3-0.5; 1.0 allows two steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-3},
    "cortex_m_int8": {"atol": 1.0},
    "ethos_u_int8": {"atol": 1.0},
}


class DeepAutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = INPUTS
        for width in HIDDEN:
            layers += [nn.Linear(cin, width), nn.BatchNorm1d(width), nn.ReLU()]
            cin = width
        self.layers = nn.Sequential(*layers)
        self.output = nn.Linear(cin, INPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.layers(x))


def fold_batchnorms(net: DeepAutoEncoder) -> nn.Module:
    """The same network at inference with every BatchNorm folded into the Linear before it."""
    layers: list[nn.Module] = []
    modules = list(net.layers)
    for linear, bn, relu in zip(modules[0::3], modules[1::3], modules[2::3], strict=True):
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        folded = nn.Linear(linear.in_features, linear.out_features)
        with torch.no_grad():
            folded.weight.copy_(linear.weight * scale[:, None])
            folded.bias.copy_((linear.bias - bn.running_mean) * scale + bn.bias)
        layers += [folded, relu]
    return nn.Sequential(*layers, net.output).eval()


def spectrum(seed: int = 0) -> torch.Tensor:
    """A deterministic 1x640 machine-sound feature vector (5 log-mel frames of 128 bands)."""
    gen = torch.Generator().manual_seed(seed)
    u = [float(v) for v in torch.rand(4, generator=gen)]
    band = torch.arange(BANDS, dtype=torch.float32)
    floor = -10.0 - 25.0 * band / BANDS  # noise floor falling with frequency
    fundamental = 6.0 + 10.0 * u[0]  # the rotation's first harmonic, in bands
    harmonics = torch.zeros(BANDS)
    for h in range(1, 6):
        harmonics += (18.0 / h) * torch.exp(-0.5 * ((band - h * fundamental) / 1.5) ** 2)
    frames = []
    for f in range(FRAMES):
        wobble = 1.0 + 0.15 * math.sin(2.0 * math.pi * (u[1] + f / FRAMES))
        frames.append(floor + wobble * harmonics + 2.0 * u[2])
    out = torch.stack(frames) + 1.5 * torch.randn(FRAMES, BANDS, generator=gen)
    return out.reshape(1, INPUTS).contiguous()


def _init(net: DeepAutoEncoder) -> None:
    """Seeded weights, then BatchNorm statistics from synthetic spectra."""
    for m in net.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.uniform_(m.bias, -0.1, 0.1)
        elif isinstance(m, nn.BatchNorm1d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.momentum = None
    net.train()
    with torch.no_grad():
        for i in range(4):
            net(torch.cat([spectrum(seed=100 + 16 * i + j) for j in range(16)]))
    net.eval()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = DeepAutoEncoder()
    if CHECKPOINT:
        net.load_state_dict(torch.load(CHECKPOINT, map_location="cpu", weights_only=True))
    else:
        _init(net)
    return fold_batchnorms(net.eval())


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (spectrum(seed=1),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((spectrum(seed=10 + i),) for i in range(7))]
