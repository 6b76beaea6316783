"""A small OPT (transformers' OPTConfig, the OPT-125M architecture scaled down: 2 decoder
layers, hidden size 64, 4 heads, FFN 256, vocabulary 512) over 32 tokens, with seeded random
weights: the same operators as models/opt_125m.py in seconds, for tests and quick runs."""

from __future__ import annotations

import torch
from opt_125m import build, tokens

SEQ_LEN = 32
TOLERANCE = {
    "xnnpack_fp32": {"atol": 1e-4, "rtol": 1e-4},
    "portable_fp32": {"atol": 1e-5, "rtol": 1e-5},
}
CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_dim": 256,
    "vocab_size": 512,
    "max_position_embeddings": 128,
}


def model() -> torch.nn.Module:
    return build(CONFIG)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (tokens(CONFIG["vocab_size"], SEQ_LEN),)
