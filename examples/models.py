"""The models the examples train, their generated data and one training loop for all of them.

    mlp          a small MLP classifying Gaussian inputs by a fixed random linear teacher (odd sizes: no
                 DDP bucket is a multiple of anything)
    transformer  a causal nn.TransformerEncoder language model, about 55 M parameters at its defaults,
                 on token sequences whose next token follows from the ones before
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

INPUTS, CLASSES = 37, 10


@dataclass
class Steps:
    losses: list[float]  # this rank's loss before each step
    step_seconds: list[float]


def mlp(hidden: int = 255) -> nn.Module:
    return nn.Sequential(
        nn.Linear(INPUTS, hidden), nn.GELU(),
        nn.Linear(hidden, hidden // 2), nn.GELU(),
        nn.Linear(hidden // 2, CLASSES),
    )


class TransformerLM(nn.Module):
    """Token and position embeddings, `layers` pre-norm encoder layers under a causal mask, a head.
    Defaults: 32768 tokens, width 512, 7 layers of 8 heads, feed-forward 2048: about 55.7 M parameters."""

    def __init__(self, vocab: int = 32768, width: int = 512, layers: int = 7, heads: int = 8, context: int = 256):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of every position of every sequence, (batch x length, vocab). The head runs on the
        positions as rows: on (batch, length, width) nn.Linear returns a view, on which FSDP2 warns that
        an in-place op would skip its hooks."""
        length = tokens.shape[1]
        h = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device, dtype=h.dtype)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h).flatten(0, 1))


def make_model(name: str, dtype: torch.dtype, device: torch.device, **sizes: int) -> nn.Module:
    """The same initial parameters on every rank (DDP broadcasts rank 0's anyway; FSDP needs them)."""
    torch.manual_seed(1234)
    model = mlp(**sizes) if name == "mlp" else TransformerLM(**sizes)
    return model.to(device=device, dtype=dtype)


def make_batch(model: nn.Module, step: int, rank: int, batch: int, dtype: torch.dtype, device: torch.device):
    """Rank `rank`'s batch of step `step`, and its loss function's targets."""
    data = torch.Generator().manual_seed(step * 100_003 + rank)
    if isinstance(model, TransformerLM):
        length = model.position.num_embeddings
        start = torch.randint(0, model.vocab, (batch, 1), generator=data)
        stride = torch.randint(1, 17, (batch, 1), generator=data)
        tokens = (start + stride * torch.arange(length + 1)) % model.vocab  # learnable: a fixed stride per row
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    teacher = torch.randn(INPUTS, CLASSES, generator=torch.Generator().manual_seed(99))
    x = torch.randn(batch, INPUTS, generator=data)
    return x.to(device=device, dtype=dtype), (x @ teacher).argmax(dim=1).to(device)


def run_steps(module: nn.Module, model: nn.Module, steps: int, rank: int, batch: int, dtype: torch.dtype,
              device: torch.device) -> Steps:
    """`steps` steps of module (the model, or its DDP/FSDP wrapper) on this rank's batches: AdamW for the
    transformer (as language models are trained), SGD with momentum for the mlp."""
    if isinstance(model, TransformerLM):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    losses, step_seconds = [], []
    for step in range(steps):
        x, y = make_batch(model, step, rank, batch, dtype, device)
        start = time.perf_counter()
        optimizer.zero_grad()
        output = module(x).float()
        loss = nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    return Steps(losses, step_seconds)
