"""MobileNetV2 with a LocalResponseNorm after inverted-residual block 10: a layer the Ethos-U
cannot run whole, so the graph splits into two NPU delegates with the LRN remnant on the CPU.

Same network, seeded weights, example input and calibration pictures as `mobilenet_v2` (this
file imports that one, so keep the two side by side). `nn.LocalResponseNorm(size=5)` goes after
feature block 10 (14x14x64 activations). torch decomposes it into square -> 3-D average pool
over channels -> scale/add/pow -> divide; `aten::avg_pool3d` has no Ethos-U lowering, so it
stays on the CPU (a portable kernel) between the two delegates. An earlier placement works the
same but makes the CPU part large (PyTorch's own avg_pool3d took ~1 s per 56x56x24 image).
"""

from __future__ import annotations

import torch
from mobilenet_v2 import build, calibration_inputs, example_inputs
from torch import nn

LRN_AFTER_BLOCK = 10

__all__ = ["calibration_inputs", "example_inputs", "model"]


def model() -> torch.nn.Module:
    return build(extra={LRN_AFTER_BLOCK: nn.LocalResponseNorm(size=5)})
