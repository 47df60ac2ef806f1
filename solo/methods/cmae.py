"""CMAE (Huang, Jin, Lu, Hou, Cheng, Fu, Shen and Feng, 2023, "Contrastive Masked Autoencoders are Stronger Vision
Learners", TPAMI): MAE's encoder and pixel decoder on a masked view, plus a feature decoder whose mean output, through
a projector and a predictor, is contrasted (MoCo v3's InfoNCE) with a momentum encoder's mean patch feature of a
pixel-shifted, colour-augmented view of the same image."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones.vit import (
    check_vit,
    embed_patches,
    grid_shape,
    keep,
    num_patches,
    patch_size,
    patchify,
    prefix_tokens,
    run_blocks,
)
from solo.data.views.masks import RandomMask
from solo.losses import masked_patch_mse, mocov3_loss, normalised_patches
from solo.methods.base import MomentumTwoViewMethod, mlp, register_method
from solo.methods.mae import MAEDecoder
from solo.methods.masked_image import MaskedViT, check_transformer_width
from solo.schema import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, PROBABILITY, ruled


@dataclass
class CMAEConfig:
    name: str = "cmae"
    mask_ratio: float = ruled(0.65, FRACTION)  # the share of the online view's patches hidden from the encoder
    decoder_embed_dim: int = ruled(512, AT_LEAST_ONE)  # both decoders' width
    decoder_depth: int = ruled(8, AT_LEAST_ONE)  # the pixel decoder's blocks (MAE's decoder)
    feature_decoder_depth: int = ruled(2, AT_LEAST_ONE)
    decoder_heads: int = ruled(16, AT_LEAST_ONE)
    norm_pix_loss: bool = True  # targets: each patch's pixels standardised by the patch's mean and variance
    proj_hidden_dim: int = ruled(1536, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(1536, AT_LEAST_ONE)
    temperature: float = ruled(0.07, POSITIVE)
    contrastive_weight: float = ruled(1.0, NON_NEGATIVE)  # the official ct_weight (on MoCo v3's 2 x temperature scale)
    base_momentum: float = ruled(0.996, PROBABILITY)  # the target encoder's share in its EMA update, at the start
    final_momentum: float = ruled(0.996, PROBABILITY)  # ... and at the end (cosine; the official hook keeps 0.996)


@register_method("cmae", schema=CMAEConfig)
class CMAE(MaskedViT, MomentumTwoViewMethod):
    """Two views per image: the online one (view 0), masked per sample, and the target one (view 1: the same box
    moved by a few pixels, with colour changes; solo/configs/augmentation/cmae.yaml). Per sample (`encode`): the
    encoder on the visible patches; the pixel decoder and the feature decoder on its output (mask tokens at the hidden
    positions); the mean of the feature decoder's every patch output; the target encoder (an EMA of the backbone) on
    every patch of the target view, without its final norm, and the mean of its patch tokens. Over the batch
    (`batch_loss`): the projector and predictor on the online mean, the EMA projector on the target mean (their
    BatchNorms over the global batch), and the loss, MAE's mean squared error over every hidden patch of the global
    batch plus `contrastive_weight` times MoCo v3's InfoNCE against the global batch's target keys."""

    augmentations = {"digits": "cmae_digits", "natural": "cmae"}

    def __init__(self, backbone, feature_dim: int, cfg: CMAEConfig):
        check_vit(backbone, "cmae")
        width = backbone.embed_dim
        projector = mlp([width, cfg.proj_hidden_dim, cfg.proj_output_dim])
        predictor = mlp([cfg.proj_output_dim, cfg.pred_hidden_dim, cfg.proj_output_dim])
        super().__init__(backbone, feature_dim, projector, predictor, cfg.base_momentum, cfg.final_momentum)
        self.cfg = cfg
        self.patch = patch_size(backbone)
        self.visible = num_patches(backbone) - self.mask_generator().hidden
        grid, prefix = grid_shape(backbone), backbone.num_prefix_tokens
        decoder = (width, cfg.decoder_embed_dim)
        self.pixel_decoder = MAEDecoder(*decoder, cfg.decoder_depth, cfg.decoder_heads, grid, prefix, self.patch**2 * 3)
        # The official feature decoder is an MAE decoder whose outputs have patch^2 x 3 values, which is the
        # encoder's width for ViT-B/16 (768); solo's outputs the encoder's width for any ViT.
        self.feature_decoder = MAEDecoder(*decoder, cfg.feature_decoder_depth, cfg.decoder_heads, grid, prefix, width)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_transformer_width(cfg, "decoder_embed_dim", "decoder_heads")

    def mask_generator(self) -> RandomMask:
        return RandomMask(num_patches(self.backbone), self.cfg.mask_ratio)

    def encode(self, batch: dict) -> dict:
        (online, target), mask = batch["views"], batch["mask"]
        vit = self.backbone
        tokens = torch.cat([prefix_tokens(vit, len(online)), keep(embed_patches(vit, online), mask, self.visible)], 1)
        encoded = run_blocks(vit, tokens)
        with torch.no_grad():
            teacher = self.teacher[0]
            tokens = torch.cat([prefix_tokens(teacher, len(target)), embed_patches(teacher, target)], 1)
            target_mean = run_blocks(teacher, tokens, final_norm=False)[:, teacher.num_prefix_tokens :].mean(1)
        return {
            "pixels": self.pixel_decoder(encoded, mask),
            "online_mean": self.feature_decoder(encoded, mask).mean(1),
            "target_mean": target_mean,
            **self.probe_features(batch),
        }

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        prediction = self.predictor(self.projector(encoded["online_mean"]))
        with torch.no_grad():
            key = self.teacher[1](encoded["target_mean"])
        target = patchify(batch["views"][0], self.patch)
        if self.cfg.norm_pix_loss:
            target = normalised_patches(target)
        loss = masked_patch_mse(encoded["pixels"], target, batch["mask"])
        loss = loss + self.cfg.contrastive_weight * mocov3_loss(prediction, key, self.cfg.temperature)
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}
