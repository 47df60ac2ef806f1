"""I-JEPA (Assran et al., 2023): from one block of an image's patches (the context), a narrow predictor predicts the
representations of a few other blocks (the targets) at their positions; the targets' representations are those of
an EMA of the encoder on the whole image, layer-normalised. One crop per image, no pixels predicted."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import (
    embed_patches,
    first_positions,
    grid_shape,
    output_tokens,
    prefix_tokens,
    run_blocks,
    sincos_positions,
    take,
)
from solo.data.views.masks import MultiBlockMask
from solo.losses import masked_patch_l1, masked_patch_mse, masked_patch_smooth_l1
from solo.methods.base import DSEOption, register_method
from solo.methods.masked_image import TargetEncoderViT, check_transformer_width
from solo.schema import AT_LEAST_ONE, DECAY, FRACTION, POSITIVE, PROBABILITY, choices, ruled

# The error between predicted and target features: the official code's smooth L1 (beta 1), or the paper's L2.
PatchLoss = choices("PatchLoss", "smooth_l1", "mse")
PATCH_LOSSES = {"smooth_l1": masked_patch_smooth_l1, "mse": masked_patch_mse, "l1": masked_patch_l1}


@dataclass
class MultiBlockPredictionConfig(DSEOption):
    """The keys of a method that predicts target blocks' features from a context block (I-JEPA, SALT); DSE on the
    encoded context patches."""

    predictor_embed_dim: int = ruled(384, AT_LEAST_ONE)
    predictor_depth: int = ruled(12, AT_LEAST_ONE)
    predictor_heads: int = ruled(12, AT_LEAST_ONE)
    num_targets: int = ruled(4, AT_LEAST_ONE)  # target blocks per image
    target_scale_min: float = ruled(0.15, FRACTION)  # each target covers a share of the patches in [min, max]
    target_scale_max: float = ruled(0.2, FRACTION)
    target_aspect_min: float = ruled(0.75, POSITIVE)  # ... with a height / width in [min, max]
    target_aspect_max: float = ruled(1.5, POSITIVE)
    context_scale_min: float = ruled(0.85, DECAY)  # the square context block's share, before the targets leave it
    context_scale_max: float = ruled(1.0, DECAY)
    min_context_patches: int = ruled(10, AT_LEAST_ONE)  # fewer left beside the targets: the masks are drawn again

    def validate(self) -> None:
        for low, high in [("target_scale", "scale"), ("target_aspect", "aspect"), ("context_scale", "scale")]:
            lo, hi = getattr(self, f"{low}_min"), getattr(self, f"{low}_max")
            if lo > hi:
                raise ValueError(f"{low}_min={lo} is above {low}_max={hi}: a block's {high} is drawn between the two")


@dataclass
class IJEPAConfig(MultiBlockPredictionConfig):
    name: str = "ijepa"
    base_momentum: float = ruled(0.996, PROBABILITY)  # the target encoder's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (a linear schedule, as I-JEPA's)
    loss: PatchLoss = PatchLoss("smooth_l1")  # smooth_l1 (the official code's) or mse (the paper's L2)


class IJEPAPredictor(nn.Module):
    """The encoded context patches, narrowed to the predictor's width, with fixed 2-D sine-cosine positions; for each
    target block a learnt mask token at each of its positions; transformer blocks over both; each target position's
    output mapped back to the encoder's width. Padding (the positions past a sample's own count) is never attended
    to. `out_dim`: the width of the features predicted (the encoder's by default)."""

    def __init__(self, in_dim: int, cfg: MultiBlockPredictionConfig, grid: tuple[int, int], out_dim: int = 0):
        super().__init__()
        from timm.models.vision_transformer import Block  # here: timm's import slows every process's start

        width = cfg.predictor_embed_dim
        self.embed = nn.Linear(in_dim, width)
        self.mask_token = nn.Parameter(torch.zeros(width))
        self.register_buffer("positions", sincos_positions(width, grid), persistent=False)
        self.blocks = nn.ModuleList(
            Block(width, cfg.predictor_heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=_layer_norm)
            for _ in range(cfg.predictor_depth)
        )
        self.norm = _layer_norm(width)
        self.project = nn.Linear(width, out_dim or in_dim)
        for m in self.modules():  # I-JEPA's initialisation
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def forward(
        self,
        context: torch.Tensor,
        context_at: torch.Tensor,
        context_valid: torch.Tensor,
        target_at: torch.Tensor,
        target_valid: torch.Tensor,
    ) -> torch.Tensor:
        """(B, M, T, D) predictions at the M target blocks' positions `target_at` (B, M, T) from `context` (B, C, D),
        the encoded patches at `context_at` (B, C); `*_valid` marks each sample's own positions, the rest padding."""
        b, m, t = target_at.shape
        positions = self.positions.to(context.dtype)
        # Each sample's context once per target block, sample-major: (B * M, C, width)
        x = (self.embed(context) + positions[context_at]).repeat_interleave(m, dim=0)
        queries = self.mask_token.to(x.dtype) + positions[target_at.flatten(0, 1)]
        attends = torch.cat([context_valid.repeat_interleave(m, dim=0), target_valid.flatten(0, 1)], dim=1)
        x, mask = torch.cat([x, queries], dim=1), attends[:, None, None, :]
        for block in self.blocks:
            x = block(x, attn_mask=mask)
        return self.project(self.norm(x[:, -t:])).unflatten(0, (b, m))  # not view(b, m, t, -1): b may be 0


def _layer_norm(width: int, **kwargs) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps=1e-6, **kwargs)


@register_method("ijepa", schema=IJEPAConfig)
class IJEPA(TargetEncoderViT):
    """One view per image and its masks (solo.data.views.masks.MultiBlockMask: a context and target blocks, drawn per
    sample). `encode` runs the encoder on the context patches, padded to the most a context can hold, the padding
    kept out of attention; the predictor; and the target encoder on the whole image. `batch_loss` is the error between
    predicted and target features (method.loss: smooth L1 as the official code, or the squared error), averaged over
    the features and over every target patch of the global batch (the padding counted nowhere). The backbone's pooled
    feature becomes the mean patch token, I-JEPA's linear protocol, for the online probe and the k-NN during
    pretraining, and `main_linear.py`'s probes."""

    augmentations = {"digits": "one_view_digits", "natural": "ijepa"}

    def __init__(self, backbone, feature_dim: int, cfg: MultiBlockPredictionConfig, frozen: nn.Module | None = None):
        """`frozen`: a frozen target encoder with an `encoder` (SALT's teacher) instead of the EMA of the backbone."""
        super().__init__(backbone, feature_dim, cfg.base_momentum if frozen is None else 0.0, frozen)
        self.cfg = cfg
        width = (frozen.encoder if frozen is not None else backbone).embed_dim  # of the predicted features
        self.predictor = IJEPAPredictor(backbone.embed_dim, cfg, grid_shape(backbone), width)
        self.mask_generator()(random.Random(0))  # masks the grid cannot hold: one error now, not in a data worker
        self.patch_loss = PATCH_LOSSES[str(cfg.loss)]
        self.take_regularisers(cfg)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_transformer_width(cfg, "predictor_embed_dim", "predictor_heads")

    def mask_generator(self) -> MultiBlockMask:
        c = self.cfg
        return MultiBlockMask(
            grid_shape(self.backbone),
            c.num_targets,
            (c.target_scale_min, c.target_scale_max),
            (c.target_aspect_min, c.target_aspect_max),
            (c.context_scale_min, c.context_scale_max),
            c.min_context_patches,
        )

    def encode(self, batch: dict) -> dict:
        images, masks = batch["views"][0], batch["mask"]  # masks: (B, 1 + targets, patches), the context first
        vit, generator = self.backbone, self.mask_generator()
        context_at = first_positions(masks[:, 0], generator.most_context)
        context_valid = masks[:, 0].gather(1, context_at)
        targets = masks[:, 1:]
        target_at = first_positions(targets.flatten(0, 1), generator.most_target).unflatten(0, targets.shape[:2])
        target_valid = targets.gather(2, target_at)

        prefix = prefix_tokens(vit, len(images))
        tokens = torch.cat([prefix, take(embed_patches(vit, images), context_at)], dim=1)
        attends = torch.cat([context_valid.new_ones(prefix.shape[:2]), context_valid], dim=1)
        context = run_blocks(vit, tokens, attends)[:, prefix.shape[1] :]
        prediction = self.predictor(context, context_at, context_valid, target_at, target_valid)
        with torch.no_grad():
            target = take(self.target_features(images), target_at.flatten(1, 2)).view(prediction.shape)
        encoded = {"prediction": prediction, "target": target, "valid": target_valid}
        if self.dse is not None:  # each image's context patches, its padding marked
            encoded |= {"dense": [context], "dense_valid": [context_valid]}
        return encoded | self.probe_features(batch)

    def target_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N, D): every patch's target, the target encoder's output on the whole image, layer-normalised."""
        teacher = self.target_encoder
        features = output_tokens(teacher, images)[:, teacher.num_prefix_tokens :]
        return F.layer_norm(features, features.shape[-1:])

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        loss = self.patch_loss(
            encoded["prediction"].flatten(0, 1), encoded["target"].flatten(0, 1), encoded["valid"].flatten(0, 1)
        )
        loss = self.with_dse(loss, encoded.get("dense"), encoded.get("dense_valid"))
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}

    def momentum_at(self, done: int, total_steps: int) -> float:
        c = self.cfg  # linear, as I-JEPA's
        return c.base_momentum + (c.final_momentum - c.base_momentum) * min(done, total_steps) / total_steps
