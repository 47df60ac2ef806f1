"""BEiT (Bao, Dong, Piao and Wei, 2022, "BEiT: BERT Pre-Training of Image Transformers"), for images: a Vision
Transformer sees an image with block-wise masked patches (a learnt mask token in their place), and a linear head
predicts, at each masked patch, its visual token. The paper's tokens are DALL-E's discrete VAE's codes, whose weights
are a download; solo's stand-in tokenizer (`PixelTokenizer`) needs none: each patch's token is the nearest of
`vocab_size` fixed random directions to its pixels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.backbones.vit import grid_shape, patchify
from solo.data.views.masks import BEiTMask
from solo.losses import masked_token_cross_entropy
from solo.methods.base import register_method
from solo.methods.masked_image import MaskTokenViT
from solo.schema import AT_LEAST_ONE, FRACTION, ruled


class PixelTokenizer(nn.Module):
    """Each patch of an image as one of `vocab` tokens: the index of the largest of its pixels' (patchify's order, as
    the views give them) dot products with `vocab` fixed directions, drawn from a standard normal by a generator
    seeded with `seed` (the same on every rank and in every run: a buffer rebuilt, not saved). A patch's token depends
    on the direction of its pixel vector only (any positive scale of it gives the same token): its pattern and its
    brightness against the data's mean. (B, 3, H, W) -> (B, N) int64, no gradient."""

    def __init__(self, pixels: int, vocab: int, patch: int, seed: int = 0):
        super().__init__()
        self.patch = patch
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("directions", torch.randn(pixels, vocab, generator=generator), persistent=False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.autocast(images.device.type, enabled=False):
            patches = patchify(images, self.patch).to(self.directions.dtype)
            return (patches @ self.directions).argmax(-1)


@dataclass
class BEiTConfig:
    name: str = "beit"
    mask_ratio: float = ruled(0.4, FRACTION)  # the share of each image's patches hidden (the code: 75 of 196)
    min_mask_block: int = ruled(16, AT_LEAST_ONE)  # patches per masked block, at least (min_mask_patches_per_block)
    vocab_size: int = ruled(8192, AT_LEAST_ONE)  # the tokenizer's tokens (DALL-E's 8192)


@register_method("beit", schema=BEiTConfig)
class BEiT(MaskTokenViT):
    """One view per image and its block-wise mask (solo.data.views.masks.BEiTMask, drawn per sample). `predict` runs
    the backbone on every patch, the hidden ones' embeddings replaced by the mask token, its final norm, and the linear
    head to each patch's `vocab_size` logits; `pixel_loss`: the cross-entropy against the tokenizer's token of each
    hidden patch, averaged over every hidden patch of the global batch (solo.losses.masked_token_cross_entropy; the
    code's over its GPU's)."""

    augmentations = {"digits": "one_view_digits", "natural": "beit"}

    def __init__(self, backbone, feature_dim: int, cfg: BEiTConfig):
        # BEiT's truncated normals (std 0.02) are cut at +- one std: the mask token's and the head's.
        super().__init__(backbone, feature_dim, cfg.vocab_size, mask_token_bound=0.02)
        nn.init.trunc_normal_(self.head.weight, std=0.02, a=-0.02, b=0.02)
        nn.init.zeros_(self.head.bias)
        self.cfg = cfg
        self.tokenizer = PixelTokenizer(
            self.patch**2 * backbone.patch_embed.proj.in_channels, cfg.vocab_size, self.patch
        )

    def mask_generator(self) -> BEiTMask:
        return BEiTMask(grid_shape(self.backbone), self.cfg.mask_ratio, self.cfg.min_mask_block)

    def patch_targets(self, images: torch.Tensor) -> torch.Tensor:
        return self.tokenizer(images)

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_token_cross_entropy(prediction, target, mask)
