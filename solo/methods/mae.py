"""MAE (He et al., 2022): a Vision Transformer encodes the visible quarter of an image's patches; a light decoder,
given the encoding and a mask token at every hidden position, reconstructs the hidden patches' pixels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.backbones.vit import (
    embed_patches,
    grid_shape,
    keep,
    num_patches,
    prefix_tokens,
    put_back,
    run_blocks,
    sincos_positions,
)
from solo.data.views.masks import RandomMask
from solo.losses import masked_patch_mse
from solo.methods.base import DSEOption, register_method
from solo.methods.masked_image import PixelReconstruction, check_transformer_width
from solo.schema import AT_LEAST_ONE, FRACTION, ruled


@dataclass
class MAEConfig(DSEOption):  # DSE on the encoder's output for the visible patches
    name: str = "mae"
    mask_ratio: float = ruled(0.75, FRACTION)  # the share of each image's patches hidden from the encoder
    decoder_embed_dim: int = ruled(512, AT_LEAST_ONE)
    decoder_depth: int = ruled(8, AT_LEAST_ONE)
    decoder_heads: int = ruled(16, AT_LEAST_ONE)
    norm_pix_loss: bool = True  # targets: each patch's pixels standardised by the patch's mean and variance


class MAEDecoder(nn.Module):
    """The encoded visible tokens, mapped to the decoder's `width`, with a learnt mask token at every hidden
    position, fixed 2-D sine-cosine positions, `depth` transformer blocks, then a linear map to each patch's `outputs`
    values (its pixels; CMAE's feature decoder: a feature)."""

    def __init__(
        self, in_dim: int, width: int, depth: int, heads: int, grid: tuple[int, int], prefix: int, outputs: int
    ):
        super().__init__()
        from timm.models.vision_transformer import Block  # here: timm's import slows every process's start

        self.prefix = prefix
        self.embed = nn.Linear(in_dim, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.register_buffer("positions", sincos_positions(width, grid)[None], persistent=False)
        self.blocks = nn.ModuleList(
            Block(width, heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=_layer_norm) for _ in range(depth)
        )
        self.norm = _layer_norm(width)
        self.predict = nn.Linear(width, outputs)
        for m in self.modules():  # MAE's initialisation
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, encoded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, N, outputs) predictions at every patch from `encoded` (B, prefix + visible, D) and `mask` (B, N)."""
        x = self.embed(encoded)
        visible = x[:, self.prefix :]
        # Every position starts as the mask token; the visible ones take their encodings, in order.
        tokens = put_back(visible, mask, self.mask_token.to(x.dtype).expand(mask.shape[0], mask.shape[1], -1))
        tokens = tokens + self.positions.to(x.dtype)
        x = torch.cat([x[:, : self.prefix], tokens], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.predict(self.norm(x))[:, self.prefix :]


def _layer_norm(width: int, **kwargs) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps=1e-6, **kwargs)


@register_method("mae", schema=MAEConfig)
class MAE(PixelReconstruction):
    """The encoder on the visible patches and the decoder, both per sample; the loss is the mean squared error over
    every hidden patch of the global batch (solo.losses.masked_patch_mse)."""

    augmentations = {"digits": "one_view_digits", "natural": "mae"}

    def __init__(self, backbone, feature_dim: int, cfg: MAEConfig):
        super().__init__(backbone, feature_dim)
        self.cfg = cfg
        self.normalise_targets = cfg.norm_pix_loss
        self.visible = num_patches(backbone) - self.mask_generator().hidden
        self.decoder = MAEDecoder(
            backbone.embed_dim,
            cfg.decoder_embed_dim,
            cfg.decoder_depth,
            cfg.decoder_heads,
            grid_shape(backbone),
            backbone.num_prefix_tokens,
            self.patch**2 * 3,
        )
        self.take_regularisers(cfg)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_transformer_width(cfg, "decoder_embed_dim", "decoder_heads")

    def mask_generator(self) -> RandomMask:
        return RandomMask(num_patches(self.backbone), self.cfg.mask_ratio)

    def encode_visible(self, batch: dict) -> torch.Tensor:
        """The encoder's output (B, prefix + visible, D) for each image's prefix and visible patches."""
        images, mask = batch["views"][0], batch["mask"]
        vit = self.backbone
        tokens = torch.cat([prefix_tokens(vit, len(images)), keep(embed_patches(vit, images), mask, self.visible)], 1)
        return run_blocks(vit, tokens)

    def predict(self, batch: dict) -> torch.Tensor:
        return self.decoder(self.encode_visible(batch), batch["mask"])

    def encode(self, batch: dict) -> dict:
        if self.dse is None:
            return super().encode(batch)
        visible = self.encode_visible(batch)
        dense = visible[:, self.backbone.num_prefix_tokens :]
        return {"prediction": self.decoder(visible, batch["mask"]), "dense": [dense], **self.probe_features(batch)}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        out = super().batch_loss(encoded, batch)
        return {**out, "loss": self.with_dse(out["loss"], encoded.get("dense"))}

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_patch_mse(prediction, target, mask)
