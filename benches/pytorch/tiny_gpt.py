"""The `transformer` example's TinyGpt and its reversed-digits batches, built in PyTorch.

`ddp_overlap.py` and `transformer_ddp.py` compare ddp-burn against this one model, so it is
written once here; they import it after their own check that torch is installed (Python puts
a script's folder on `sys.path`, so `python3 benches/pytorch/<script>.py` finds it).
"""

import torch
from torch import nn

VOCAB = 12
BOS, SEP = 10, 11


class TinyGpt(nn.Module):
    """Token and position embeddings (2 * digits + 2 positions), `layers` pre-norm encoder
    layers (feed-forward 4 x width, GELU, no dropout) with a causal mask, a final LayerNorm
    and a linear head."""

    def __init__(self, digits: int, d_model: int, heads: int, layers: int):
        super().__init__()
        self.token = nn.Embedding(VOCAB, d_model)
        self.position = nn.Embedding(2 * digits + 2, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model,
                heads,
                4 * d_model,
                dropout=0.0,
                activation="gelu",
                norm_first=True,
                batch_first=True,
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens):
        seq = tokens.shape[1]
        positions = torch.arange(seq, device=tokens.device).unsqueeze(0)
        x = self.token(tokens) + self.position(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def reversed_digits_batch(batch: int, digits: int, generator, device="cpu"):
    """`batch` sequences `BOS d1..dn SEP dn..d1` on `device`, as (inputs, next-token targets)."""
    numbers = torch.randint(0, 10, (batch, digits), generator=generator)
    bos = torch.full((batch, 1), BOS)
    sep = torch.full((batch, 1), SEP)
    seqs = torch.cat([bos, numbers, sep, numbers.flip(1)], dim=1).to(device)
    return seqs[:, :-1], seqs[:, 1:]
