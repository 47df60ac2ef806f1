"""CLIP's text tower: a small pre-LayerNorm Transformer pooled at the end-of-text token."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from solo.text.tokenizer import EOT

# False inside token_checks_deferred: scoped to the block (and thread), not the process.
_token_checks: ContextVar[bool] = ContextVar("solo_text_token_checks", default=True)


@contextmanager
def token_checks_deferred():
    """Skip TextTransformer's checks of the token ids' values inside the block: they read the ids on the host, on a
    GPU a synchronisation. The training step skips them (solo.losses._checks.host_reads_deferred), where the ids
    come from the tower's own tokenizer, which makes every row as the checks want it."""
    token = _token_checks.set(False)
    try:
        yield
    finally:
        _token_checks.reset(token)


class TextTransformer(nn.Module):
    """Token + learned positional embeddings -> `depth` pre-LayerNorm Transformer blocks -> final LayerNorm,
    pooled at the end-of-text token (CLIP's text tower). Returns (batch, width).

    `tokens` is (batch, length) with length <= context_length, laid out as the tokenizer makes it:
    SOT, bytes, EOT, then padding. Everything after the first EOT is ignored, whatever its ids:
    causal=True because no position before the EOT can see it, causal=False because it is masked out
    as keys. So the output does not depend on how much padding follows. Ids out of the vocabulary and rows
    without an EOT raise ValueError, except inside token_checks_deferred (the training step).
    """

    def __init__(
        self, *, vocab_size: int, context_length: int, width: int, depth: int, heads: int, causal: bool = True
    ):
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("context_length", context_length),
            ("width", width),
            ("depth", depth),
            ("heads", heads),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if width % heads:
            raise ValueError(f"width ({width}) must be divisible by heads ({heads})")
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.width = width
        self.causal = causal

        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        # enable_nested_tensor=False: the nested-tensor path does not apply to norm_first layers anyway (and warns).
        self.transformer = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.ln_final = nn.LayerNorm(width)

        # CLIP's initialisation for the embeddings (torch's N(0, 1) default for nn.Embedding is far larger);
        # the Transformer blocks and LayerNorms keep torch's defaults.
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)

    def _check_ids(self, tokens: torch.Tensor) -> None:
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size}), got range [{int(tokens.min())}, {int(tokens.max())}]"
            )
        missing = ~(tokens == EOT).any(dim=1)
        if missing.any():
            row = int(missing.nonzero()[0, 0])
            raise ValueError(f"row {row} has no end-of-text token (id {EOT})")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        length = tokens.shape[1]
        if length > self.context_length:
            raise ValueError(f"sequence length {length} exceeds context_length {self.context_length}")
        if _token_checks.get():
            self._check_ids(tokens)
        # First EOT per row; tokens.argmax would find the largest id, and EOT=2 is one of the smallest.
        eot = (tokens == EOT).int().argmax(dim=1)

        x = self.token_embedding(tokens) + self.positional_embedding[:length]
        positions = torch.arange(length, device=tokens.device)
        if self.causal:
            # True = may not attend: each position sees itself and earlier ones only.
            mask = positions[None, :] > positions[:, None]
            x = self.transformer(x, mask=mask, is_causal=True)
        else:
            # Mask keys after the EOT by position, not by `tokens == PAD`, so whatever follows the EOT is ignored.
            # SOT..EOT always stay visible, so no query row is fully masked (which would give NaN).
            padding = positions[None, :] > eot[:, None]
            x = self.transformer(x, src_key_padding_mask=padding)
        pooled = x[torch.arange(x.shape[0], device=x.device), eot]
        # LayerNorm is per position, so normalising only the pooled rows equals normalising all and then pooling.
        return self.ln_final(pooled)
