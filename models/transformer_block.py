"""Pre-norm transformer encoder block: LayerNorm, 4-head self-attention, LayerNorm, GELU MLP.

16 tokens of width 32 (a small keyword or sensor transformer's block), with residual
connections: x + MHA(LN(x)), then + MLP(LN(.)) with a 4x GELU hidden layer. The weights are
seeded random (no training data is fetched) and deterministic; the inputs are smooth seeded
token embeddings.
"""

from __future__ import annotations

import math

import torch
from torch import nn

TOKENS = 16
WIDTH = 32
HEADS = 4

# int8 with float attention (the mixed-precision fallback): a few output steps of drift
# between the device and the host's reference are allowed.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.05},
}


class SelfAttention(nn.Module):
    """Multi-head self-attention written out, as small transformers write it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // HEADS))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = SelfAttention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TransformerBlock().eval()


def tokens(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(TOKENS, dtype=torch.float32).unsqueeze(1)
    freq = 0.1 + 0.5 * torch.rand(1, WIDTH, generator=gen)
    phase = 2 * math.pi * torch.rand(1, WIDTH, generator=gen)
    x = torch.sin(freq * pos + phase) + 0.2 * torch.randn(TOKENS, WIDTH, generator=gen)
    return x.unsqueeze(0)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (tokens(7),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    return [example_inputs(), *((tokens(100 + i),) for i in range(7))]
