"""AIM (El-Nouby et al., 2024): a Vision Transformer reads an image's patches in raster order under prefix-causal
attention (a prefix of random length attended both ways, causal after it); an MLP head maps each position's output to
the next patch's pixels, normalised per patch, and the loss is their squared error after the prefix."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.backbones.vit import (
    embed_patches,
    grid_shape,
    num_patches,
    pool_patch_tokens,
    prefix_tokens,
    run_blocks,
    sincos_positions,
)
from solo.data.views.masks import PrefixMask
from solo.losses import next_patch_mse
from solo.methods.base import register_method
from solo.methods.masked_image import PixelReconstruction
from solo.schema import AT_LEAST_ONE, ruled


@dataclass
class AIMConfig:
    name: str = "aim"
    head_width: int = ruled(2048, AT_LEAST_ONE)
    head_depth: int = ruled(12, AT_LEAST_ONE)  # residual MLP blocks of the head, each token on its own
    norm_pix_loss: bool = True  # targets: each patch's pixels standardised by the patch's mean and variance


class AIMHead(nn.Module):
    """Each token on its own: fixed 2-D sine-cosine positions added (AIM adds them before the head too), widened to
    `head_width`, `head_depth` pre-norm residual MLP blocks (expansion 4), a final norm, a linear map to pixels."""

    def __init__(self, in_dim: int, cfg: AIMConfig, grid: tuple[int, int], pixels: int):
        super().__init__()
        width = cfg.head_width
        self.register_buffer("positions", sincos_positions(in_dim, grid)[None], persistent=False)
        self.embed = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(_layer_norm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(cfg.head_depth)
        )
        self.norm = _layer_norm(width)
        self.predict = nn.Linear(width, pixels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens + self.positions.to(tokens.dtype))
        for block in self.blocks:
            x = x + block(x)
        return self.predict(self.norm(x))


def _layer_norm(width: int) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps=1e-6)


def prefix_causal(predicted: torch.Tensor, extra: int) -> torch.Tensor:
    """(B, L, L), L = extra + N, True where query i attends to key j: j <= i, or j in the prefix, which is the `extra`
    tokens before the patches (class, registers) and the patches that `predicted` (B, N) leaves False. Within the
    prefix attention goes both ways; after it, each patch sees the prefix and the patches before it."""
    in_prefix = ~torch.cat([predicted.new_zeros(len(predicted), extra), predicted], dim=1)
    length = in_prefix.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=predicted.device).tril()
    return causal | in_prefix[:, None, :]


@register_method("aim", schema=AIMConfig)
class AIM(PixelReconstruction):
    """One view per image and its prefix (solo.data.views.masks.PrefixMask: a length drawn per sample, `batch["mask"]`
    True at the patches predicted). `predict` runs the backbone on every patch, raster order, under prefix-causal
    attention, and the head on each patch position; when an online probe reads them, also the backbone on the whole
    image as validation sees it, under plain bidirectional attention (`BatchSpec.probe_image`), without a graph. `pixel_loss` is the
    loss: the squared error of each predicted patch, averaged over every predicted patch of the global batch
    (solo.losses.next_patch_mse). The backbone's pooled feature becomes the mean patch token."""

    augmentations = {"digits": "one_view_digits", "natural": "aim"}

    pool = "mean"

    def __init__(self, backbone, feature_dim: int, cfg: AIMConfig):
        super().__init__(backbone, feature_dim)
        pool_patch_tokens(backbone)
        self.cfg = cfg
        self.normalise_targets = cfg.norm_pix_loss
        self.head = AIMHead(backbone.embed_dim, cfg, grid_shape(backbone), self.patch**2 * 3)

    def mask_generator(self) -> PrefixMask:
        return PrefixMask(num_patches(self.backbone))

    def predict(self, batch: dict) -> torch.Tensor:
        images, predicted = batch["views"][0], batch["mask"]
        vit = self.backbone
        extra = vit.num_prefix_tokens
        tokens = torch.cat([prefix_tokens(vit, len(images)), embed_patches(vit, images)], 1)
        return self.head(run_blocks(vit, tokens, prefix_causal(predicted, extra))[:, extra:])

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return next_patch_mse(prediction, target, mask)
