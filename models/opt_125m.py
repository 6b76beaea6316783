"""OPT-125M (the architecture of facebook/opt-125m) from transformers' OPTConfig: 12 decoder
layers, hidden size 768, 12 heads, FFN 3072, vocabulary 50,272; one forward pass over 128
tokens returning the logits, as in Arm's ExecuTorch lab on the Raspberry Pi 5.

The weights are seeded random: nothing can be downloaded here, so the logits carry no meaning,
but the work per inference (and so the timing) is that of the real model. `bench/opt_bench.py
--checkpoint DIR` loads a local Hugging Face checkpoint instead. The example input is a fixed
pseudo-random token sequence. No calibration inputs: xnnpack_int8 quantizes its activations
dynamically.
"""

from __future__ import annotations

import torch

SEQ_LEN = 128
# The seeded weights give logits of magnitude ~1; XNNPACK's x86 (host) and NEON (device)
# kernels sum 768-long dot products in different orders.
TOLERANCE = {
    "xnnpack_fp32": {"atol": 1e-3, "rtol": 1e-3},
    "portable_fp32": {"atol": 1e-4, "rtol": 1e-4},
}

CONFIG = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "ffn_dim": 3072,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
}


class OffsetPositions(torch.nn.Module):
    """OPT's learned position embedding, looked up at positions that already carry its offset
    of 2. OPT adds the offset inside as an int64 constant, which PT2E's prepare step turns
    into a float one (the lookup then gets float indices): the positions come from one arange
    instead. The same weights and the same rows as OPT's own module."""

    def __init__(self, learned: torch.nn.Embedding) -> None:
        super().__init__()
        self.weight = learned.weight

    def forward(
        self,
        attention_mask: torch.Tensor | None = None,
        past_key_values_length: int = 0,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return torch.nn.functional.embedding(position_ids, self.weight)


class OptLogits(torch.nn.Module):
    """OPTForCausalLM without the cache and the output dict: token ids in, logits out."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        lm.model.decoder.embed_positions = OffsetPositions(lm.model.decoder.embed_positions)
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        positions = torch.arange(2, seq + 2, dtype=torch.long).unsqueeze(0)  # offset 2
        return self.lm(
            input_ids=input_ids, position_ids=positions, use_cache=False, return_dict=False
        )[0]


def build(config: dict, checkpoint: str | None = None) -> torch.nn.Module:
    """The model for `config` with weights seeded at 0, or loaded from a local checkpoint."""
    from transformers import OPTConfig, OPTForCausalLM

    if checkpoint:
        lm = OPTForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa")
    else:
        torch.manual_seed(0)
        lm = OPTForCausalLM(OPTConfig(**config, attn_implementation="sdpa"))
    return OptLogits(lm.float()).eval()


def tokens(vocab_size: int, seq_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(2, vocab_size, (1, seq_len), generator=g, dtype=torch.long)


def model() -> torch.nn.Module:
    return build(CONFIG)


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (tokens(CONFIG["vocab_size"], SEQ_LEN),)
