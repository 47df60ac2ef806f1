"""SimMIM (Xie et al., 2022): a Vision Transformer encodes every patch of an image, a learnt mask token in place of
each hidden one; a linear head maps each token to its patch's raw pixels, and the loss is the L1 error on the hidden
pixels only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from solo.backbones import configured_patch_size
from solo.backbones.vit import grid_shape, patch_size
from solo.data.views.masks import CoarseRandomMask
from solo.errors import ConfigError
from solo.losses import masked_patch_l1
from solo.methods.base import register_method
from solo.methods.masked_image import MaskTokenViT
from solo.schema import AUTO_OR_AT_LEAST_ONE, FRACTION, ruled


@dataclass
class SimMIMConfig:
    name: str = "simmim"
    mask_ratio: float = ruled(0.6, FRACTION)  # the share of each image's mask patches hidden (rounded up)
    # px: the side of the squares hidden, a multiple of the patch size; auto: the paper's 32 px of 224 scaled to
    # data.image_size, in whole patches (one 4 px patch on the 16 px digits)
    mask_patch_size: Any = ruled("auto", AUTO_OR_AT_LEAST_ONE)


PAPER_MASK_SQUARE, PAPER_IMAGE_SIZE = 32, 224


@register_method("simmim", schema=SimMIMConfig)
class SimMIM(MaskTokenViT):
    """One view per image and its mask (solo.data.views.masks.CoarseRandomMask, drawn per sample). `predict` runs the
    backbone on every patch, the hidden ones' embeddings replaced by the mask token (SimMIM's ViT), and the linear
    head to each patch's raw pixels (SimMIM's decoder: a 1 x 1 convolution to stride^2 x 3 channels and a pixel
    shuffle, here in patchify's order); when an online probe reads them, also the backbone on the whole image as
    validation sees it (`BatchSpec.probe_image`), without a graph. `pixel_loss`: the mean absolute error over every
    hidden pixel of the global batch (solo.losses.masked_patch_l1). The probes read the patch tokens' mean, as
    SimMIM's fine-tuning pools them: no loss reads the class token, whose probe lags far behind
    (docs/methods/simmim.md)."""

    augmentations = {"digits": "one_view_digits", "natural": "simmim"}

    @classmethod
    def choose_for_the_data(cls, cfg) -> list[str]:
        if cfg.method.mask_patch_size != "auto":
            return []
        patch, size = configured_patch_size(cfg.backbone), cfg.data.image_size
        wanted, grid = size * PAPER_MASK_SQUARE / PAPER_IMAGE_SIZE / patch, max(1, size // patch)
        # the squares must tile the grid: the divisor of its side nearest to the paper's scaled square
        cells = min((k for k in range(1, grid + 1) if grid % k == 0), key=lambda k: abs(k - wanted))
        cfg.method.mask_patch_size = cells * patch
        return [
            f"method.mask_patch_size={cfg.method.mask_patch_size}: the paper's {PAPER_MASK_SQUARE} px squares at "
            f"{PAPER_IMAGE_SIZE} px, scaled to data.image_size={size} in whole {patch} px patches "
            "(method.mask_patch_size=auto; a number chooses)"
        ]

    def __init__(self, backbone, feature_dim: int, cfg: SimMIMConfig):
        patch = patch_size(backbone)
        super().__init__(backbone, feature_dim, patch**2 * 3, mask_token_bound=0.02)  # SimMIM's ViT's init
        self.cfg = cfg
        size = backbone.patch_embed.img_size[0]
        if cfg.mask_patch_size % self.patch or size % cfg.mask_patch_size:
            raise ConfigError(
                f"method.mask_patch_size={cfg.mask_patch_size}: the squares hidden must be whole patches "
                f"({self.patch} px) and tile the {size} px image; choose a multiple of {self.patch} that divides {size}"
            )

    def mask_generator(self) -> CoarseRandomMask:
        return CoarseRandomMask(grid_shape(self.backbone), self.cfg.mask_patch_size // self.patch, self.cfg.mask_ratio)

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_patch_l1(prediction, target, mask)
