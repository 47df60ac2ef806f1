"""MaskFeat (Wei et al., 2022), for images: a Vision Transformer sees an image with block-wise masked patches (a learnt
mask token in their place), and a linear head predicts, at each masked patch, the histograms of oriented gradients
(HOG) of its pixels, per colour channel and cell, as the official code computes them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from solo.backbones import configured_patch_size
from solo.backbones.vit import grid_shape, patch_size
from solo.data.views.masks import BEiTMask
from solo.dtypes import full_precision
from solo.errors import ConfigError
from solo.losses import masked_patch_mse
from solo.methods.base import register_method
from solo.methods.masked_image import MaskTokenViT
from solo.schema import AT_LEAST_ONE, AUTO_OR_AT_LEAST_ONE, FRACTION, ruled


def hog_patches(images: torch.Tensor, patch: int, cell: int, bins: int = 9) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C x bins x (patch / cell)^2): each patch's HOG as MaskFeat's code computes it. Sobel
    gradients on the image padded by reflection; each pixel adds its gradient's magnitude to one of `bins` orientation
    bins, floor(atan2(gx, gy) / pi x bins) mod bins (the code's argument order: unsigned orientations, 180 / bins
    degrees each); the histograms summed over cells of `cell` x `cell` pixels and L2-normalised per cell and channel;
    a patch's values ordered (channel, bin, cell row, cell column), its patches row-major."""
    x = full_precision(images)
    b, c, h, w = x.shape
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    # The code's Sobel kernels [[1, 0, -1], [2, 0, -2], [1, 0, -1]] and its transpose (cross-correlation), as slices:
    # a kernel made on the host would be a blocking copy to the GPU in every step.
    rows = padded[:, :, :-2] + 2 * padded[:, :, 1:-1] + padded[:, :, 2:]
    columns = padded[..., :-2] + 2 * padded[..., 1:-1] + padded[..., 2:]
    gx = rows[..., :-2] - rows[..., 2:]
    gy = columns[:, :, :-2] - columns[:, :, 2:]
    orientation = torch.floor(torch.atan2(gx, gy) / math.pi * bins).long() % bins
    # One-hot by comparison: F.one_hot checks the indices' range on the host.
    one_hot = orientation[..., None] == torch.arange(bins, device=x.device)
    votes = one_hot.to(x.dtype) * torch.hypot(gx, gy)[..., None]  # (B, C, H, W, bins)
    cells = votes.unflatten(2, (h // cell, cell)).unflatten(4, (w // cell, cell)).sum((3, 5))
    cells = F.normalize(cells, dim=-1)  # (B, C, H / cell, W / cell, bins)
    per_patch = patch // cell
    cells = cells.permute(0, 1, 4, 2, 3).flatten(1, 2)  # (B, C x bins, H / cell, W / cell)
    cells = cells.unflatten(2, (h // patch, per_patch)).unflatten(4, (w // patch, per_patch))
    return cells.permute(0, 2, 4, 1, 3, 5).flatten(3).flatten(1, 2)


@dataclass
class MaskFeatConfig:
    name: str = "maskfeat"
    mask_ratio: float = ruled(0.4, FRACTION)  # the share of each image's patches hidden (AUG.MASK_RATIO)
    min_mask_block: int = ruled(16, AT_LEAST_ONE)  # patches per masked block, at least (BEiT's block-wise masking)
    # px: the side of a HOG cell, which must divide the patch; auto: half the patch (the paper's 8 px cells in 16 px
    # patches; 2 px in the digits' 4 px ones)
    hog_cell: Any = ruled("auto", AUTO_OR_AT_LEAST_ONE)
    hog_bins: int = ruled(9, AT_LEAST_ONE)  # orientation bins over 180 degrees


@register_method("maskfeat", schema=MaskFeatConfig)
class MaskFeat(MaskTokenViT):
    """One view per image and its block-wise mask (solo.data.views.masks.BEiTMask, drawn per sample). `predict` runs
    the backbone on every patch, the hidden ones' embeddings replaced by the mask token, and the linear head to each
    patch's HOG (`hog_patches`); `pixel_loss`: the squared error averaged over the HOG values and over every hidden
    patch of the global batch (solo.losses.masked_patch_mse; the code's F.mse_loss over its GPU's hidden patches)."""

    augmentations = {"digits": "one_view_digits", "natural": "maskfeat"}

    @classmethod
    def choose_for_the_data(cls, cfg) -> list[str]:
        if cfg.method.hog_cell != "auto":
            return []
        patch = configured_patch_size(cfg.backbone)
        cfg.method.hog_cell = max(c for c in range(1, max(1, patch // 2) + 1) if patch % c == 0)  # must tile it
        return [
            f"method.hog_cell={cfg.method.hog_cell}: 2 x 2 cells per {patch} px patch, as the paper's 8 px cells in "
            "16 px patches (method.hog_cell=auto; a number chooses)"
        ]

    def __init__(self, backbone, feature_dim: int, cfg: MaskFeatConfig):
        patch = patch_size(backbone)
        if patch % cfg.hog_cell:
            raise ConfigError(
                f"method.hog_cell={cfg.hog_cell}: a HOG cell must tile the {patch} px patch; choose a divisor of {patch}"
            )
        outputs = backbone.patch_embed.proj.in_channels * cfg.hog_bins * (patch // cfg.hog_cell) ** 2
        super().__init__(backbone, feature_dim, outputs, mask_token_bound=2.0)  # torch's trunc_normal_ default cut
        self.cfg = cfg

    def mask_generator(self) -> BEiTMask:
        return BEiTMask(grid_shape(self.backbone), self.cfg.mask_ratio, self.cfg.min_mask_block)

    def patch_targets(self, images: torch.Tensor) -> torch.Tensor:
        return hog_patches(images, self.patch, self.cfg.hog_cell, self.cfg.hog_bins)

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_patch_mse(prediction, target, mask)
