"""data2vec (Baevski et al., 2022), for images: a Vision Transformer sees an image with block-wise masked patches (a
learnt mask token in their place) and regresses, at each masked patch, the average of the top blocks' outputs of an
EMA teacher that sees the whole image, layer-normalised. The teacher is an EMA of the transformer blocks alone, fed
the student's own patch and position embeddings, as the official code's `ema_transformer_only`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import embed_patches, grid_shape, output_tokens, prefix_tokens
from solo.data.views.masks import BEiTMask
from solo.dtypes import full_precision
from solo.errors import ConfigError
from solo.losses import masked_patch_smooth_l1
from solo.methods.base import register_method
from solo.methods.masked_image import TargetEncoderViT
from solo.schema import AT_LEAST_ONE, FRACTION, POSITIVE, PROBABILITY, ruled


@dataclass
class Data2VecConfig:
    name: str = "data2vec"
    mask_ratio: float = ruled(
        0.6, FRACTION
    )  # the share of each image's patches hidden (120 of 196: --num_mask_patches)
    min_mask_block: int = ruled(16, AT_LEAST_ONE)  # patches per masked block, at least (BEiT's block-wise masking)
    average_top_k_layers: int = ruled(6, AT_LEAST_ONE)  # the teacher's last blocks whose outputs are averaged
    loss_beta: float = ruled(2.0, POSITIVE)  # smooth L1's bend (--l1_beta)
    base_momentum: float = ruled(0.999, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(0.9998, PROBABILITY)  # ... and at the end (linear over training)


@register_method("data2vec", schema=Data2VecConfig)
class Data2Vec(TargetEncoderViT):
    """One view per image and its block-wise mask (solo.data.views.masks.BEiTMask, drawn per sample). `encode` runs
    the student on every patch, the hidden ones' embeddings replaced by the mask token before the position
    embeddings; and, without a graph, the teacher's blocks on the student's embeddings of the whole image. The target
    of a patch is the layer norm (no affine) of the mean of the last `average_top_k_layers` blocks' outputs (before
    the final norm). `batch_loss`: smooth L1 (beta `loss_beta`) summed over the D features and scaled by 1 / sqrt(D),
    averaged over every masked patch of the global batch."""

    augmentations = {"digits": "one_view_digits", "natural": "data2vec"}
    teacher_blocks_only = True

    def __init__(self, backbone, feature_dim: int, cfg: Data2VecConfig):
        super().__init__(backbone, feature_dim, cfg.base_momentum)
        self.cfg = cfg
        depth = len(backbone.blocks)
        if cfg.average_top_k_layers > depth:
            raise ConfigError(
                f"method.average_top_k_layers={cfg.average_top_k_layers}: the backbone has {depth} blocks; "
                f"average at most {depth}"
            )
        self.mask_token = nn.Parameter(torch.zeros(backbone.embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def mask_generator(self) -> BEiTMask:
        return BEiTMask(grid_shape(self.backbone), self.cfg.mask_ratio, self.cfg.min_mask_block)

    def encode(self, batch: dict) -> dict:
        images, mask = batch["views"][0], batch["mask"]
        vit = self.backbone
        prefix = vit.num_prefix_tokens
        prediction = output_tokens(vit, images, mask, self.mask_token)[:, prefix:]
        with torch.no_grad():
            x = vit.norm_pre(torch.cat([prefix_tokens(vit, len(images)), embed_patches(vit, images)], 1))
            top = self.target_encoder(x, last=self.cfg.average_top_k_layers)
            average = full_precision(sum(top)[:, prefix:] / len(top))
            target = F.layer_norm(average, average.shape[-1:])
        return {"prediction": prediction, "target": target, "mask": mask} | self.probe_features(batch)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        prediction = encoded["prediction"]
        # The official sum over features times 1 / sqrt(D) is sqrt(D) times their mean
        scale = math.sqrt(prediction.shape[-1])
        loss = scale * masked_patch_smooth_l1(prediction, encoded["target"], encoded["mask"], beta=self.cfg.loss_beta)
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}

    def momentum_at(self, done: int, total_steps: int) -> float:
        c = self.cfg  # linear over training, as the official code's
        return c.base_momentum + (c.final_momentum - c.base_momentum) * min(done, total_steps) / total_steps
