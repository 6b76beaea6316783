"""Weights for the MLPerf Tiny CNNs (ds_cnn, mobilenet_v1_025, resnet8): a trained checkpoint
when one is given, else seeded weights with BatchNorm statistics estimated from synthetic
inputs, as training would, so that every layer is well scaled and int8 calibration sees
realistic ranges (seeded weights alone make activations vanish or explode over 10 to 27
layers). Not a model file: deploykit lists only files without a leading underscore."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn


def trained_or_seeded(net: nn.Module, checkpoint: str,
                      statistics_batches: Iterable[torch.Tensor]) -> nn.Module:
    """`net` with the state_dict at `checkpoint`, or seeded (the caller seeds torch) with
    its BatchNorm statistics averaged over `statistics_batches` (consumed only then)."""
    if checkpoint:
        net.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
        return net.eval()
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.momentum = None  # cumulative average over the statistics batches
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(m.in_features))
            nn.init.zeros_(m.bias)
    net.train()
    with torch.no_grad():
        for batch in statistics_batches:
            net(batch)
    return net.eval()
