"""CrossMAE (Fu, Lian, Wang, Shi, Wang, Yala, Darrell, Efros and Goldberg, 2024, "Rethinking Patch Dependence for
Masked Autoencoders"): MAE's encoder on the visible patches; the decoder reconstructs only some of the hidden patches,
each by cross-attention from its mask token to the visible tokens (never to the other masked tokens), every decoder
block reading its own learnt mix of the encoder's block outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.backbones.vit import (
    embed_patches,
    first_positions,
    grid_shape,
    num_patches,
    prefix_tokens,
    sincos_positions,
    take,
)
from solo.data.views.masks import PredictedRandomMask
from solo.errors import ConfigError
from solo.losses import masked_patch_mse
from solo.methods.base import register_method
from solo.methods.masked_image import CrossAttentionBlock, PixelReconstruction, check_transformer_width
from solo.schema import AT_LEAST_ONE, FRACTION, ruled


@dataclass
class CrossMAEConfig:
    name: str = "crossmae"
    mask_ratio: float = ruled(0.75, FRACTION)  # the share of each image's patches hidden from the encoder
    predict_ratio: float = ruled(0.25, FRACTION)  # the share of all patches reconstructed (kept_mask_ratio)
    decoder_embed_dim: int = ruled(512, AT_LEAST_ONE)
    decoder_depth: int = ruled(12, AT_LEAST_ONE)
    decoder_heads: int = ruled(16, AT_LEAST_ONE)
    norm_pix_loss: bool = True  # targets: each patch's pixels standardised by the patch's mean and variance


class CrossMAEDecoder(nn.Module):
    """The official decoder with its weighted feature maps (`--weight_fm --use_input`): the encoder's input tokens and
    each block's output (K maps of (B, T, D)) are mixed by a learnt (decoder_depth, K) matrix, one mix per decoder
    block, each LayerNormed; a learnt mask token plus fixed 2-D sine-cosine positions at each predicted position goes
    through the cross-attention blocks (solo.methods.masked_image.CrossAttentionBlock), a LayerNorm and a linear map
    to the patch's pixels."""

    def __init__(self, encoder_width: int, maps: int, cfg: CrossMAEConfig, grid: tuple[int, int], pixels: int):
        super().__init__()
        width, depth = cfg.decoder_embed_dim, cfg.decoder_depth
        self.mix = nn.Linear(maps, depth, bias=False)
        self.context_norms = nn.ModuleList(nn.LayerNorm(encoder_width, eps=1e-6) for _ in range(depth))
        self.mask_token = nn.Parameter(torch.zeros(width))
        self.register_buffer("positions", sincos_positions(width, grid), persistent=False)
        self.blocks = nn.ModuleList(
            CrossAttentionBlock(width, cfg.decoder_heads, context_width=encoder_width) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.predict = nn.Linear(width, pixels)
        for m in self.modules():  # the official initialisation (its xavier pass reaches the mix's matrix too)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, maps: list[torch.Tensor], predict_at: torch.Tensor) -> torch.Tensor:
        """(B, M, pixels) predictions at `predict_at` (B, M) from the encoder's `maps`."""
        mixed = self.mix(torch.stack(maps, dim=-1))  # (B, T, D, decoder_depth)
        x = self.mask_token.to(mixed.dtype) + self.positions.to(mixed.dtype)[predict_at]
        for i, (norm, block) in enumerate(zip(self.context_norms, self.blocks)):
            x = block(x, norm(mixed[..., i]))
        return self.predict(self.norm(x))


@register_method("crossmae", schema=CrossMAEConfig)
class CrossMAE(PixelReconstruction):
    """One view per image and its masks (solo.data.views.masks.PredictedRandomMask, drawn per sample: the hidden
    patches and the predicted ones among them). The encoder runs on the visible patches and keeps every block's
    output; the decoder predicts the pixels at the predicted positions. The loss is the mean squared error over every
    predicted patch of the global batch (solo.losses.masked_patch_mse), on MAE's normalised pixels by default."""

    augmentations = {"digits": "one_view_digits", "natural": "mae"}

    def __init__(self, backbone, feature_dim: int, cfg: CrossMAEConfig):
        super().__init__(backbone, feature_dim)
        # The official encoder has no final norm while pretraining (the decoder reads the blocks' raw outputs): the
        # ViT's stays the identity it starts as, for the probes and for fine-tuning, and takes no gradient.
        backbone.norm.requires_grad_(False)
        self.cfg = cfg
        self.normalise_targets = cfg.norm_pix_loss
        masks = self.mask_generator()
        if masks.hidden >= num_patches(backbone) or not 1 <= masks.predicted <= masks.hidden:
            raise ConfigError(
                f"method.predict_ratio={cfg.predict_ratio}: of {num_patches(backbone)} patches {masks.hidden} are "
                f"hidden (method.mask_ratio={cfg.mask_ratio}) and {masks.predicted} predicted; the predicted must be "
                "at least one and at most the hidden, and one patch must stay visible"
            )
        self.visible, self.predicted = num_patches(backbone) - masks.hidden, masks.predicted
        maps = len(backbone.blocks) + 1  # the encoder's input and every block's output
        self.decoder = CrossMAEDecoder(backbone.embed_dim, maps, cfg, grid_shape(backbone), self.patch**2 * 3)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_transformer_width(cfg, "decoder_embed_dim", "decoder_heads")

    def mask_generator(self) -> PredictedRandomMask:
        return PredictedRandomMask(num_patches(self.backbone), self.cfg.mask_ratio, self.cfg.predict_ratio)

    def predicted_positions(self, masks: torch.Tensor) -> torch.Tensor:
        """(B, predicted): each image's predicted positions, in order, from its masks (B, 2, patches)."""
        return first_positions(masks[:, 1], self.predicted)

    def feature_maps(self, images: torch.Tensor, visible_at: torch.Tensor) -> list[torch.Tensor]:
        """The encoder's input (prefix and visible tokens) and each block's output, before the final norm."""
        vit = self.backbone
        x = vit.norm_pre(torch.cat([prefix_tokens(vit, len(images)), take(embed_patches(vit, images), visible_at)], 1))
        maps = [x]
        for block in vit.blocks:
            x = block(x)
            maps.append(x)
        return maps

    def predict(self, batch: dict) -> torch.Tensor:
        images, masks = batch["views"][0], batch["mask"]  # masks: (B, 2, patches), hidden then predicted
        visible_at = first_positions(~masks[:, 0], self.visible)
        return self.decoder(self.feature_maps(images, visible_at), self.predicted_positions(masks))

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # The predictions are the predicted positions', in order: every one of them counts.
        target = take(target, self.predicted_positions(mask))
        return masked_patch_mse(
            prediction, target, torch.ones(target.shape[:2], dtype=torch.bool, device=target.device)
        )
