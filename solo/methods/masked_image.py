"""What the masked-image methods share. `MaskedViT` (MAE, SimMIM, AIM, MSN, I-JEPA, CAPI, DINOv2): a patch mask per
sample, drawn in the data workers (`mask_generator`: `batch["mask"]`), and an online probe on each whole image through
the evaluation transform (`batch["probe_image"]`), since the views it trains on are masked. `PixelReconstruction`
(MAE, CrossMAE, SimMIM, AIM, MaskFeat): one view per image whose patches' pixels (or a target computed from them) are predicted
where the mask says. `TargetEncoderViT`
(I-JEPA, CAPI, data2vec, data2vec 2.0, SALT): one view per image whose targets come from a target encoder, an EMA of
the backbone or a frozen pretrained encoder."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import (
    BlockOutputs,
    check_vit,
    output_tokens,
    patch_size,
    patchify,
    pool_patch_tokens,
    pooled_feature,
)
from solo.data.views.batch_spec import BatchSpec, PatchMasks
from solo.errors import ConfigError
from solo.losses import normalised_patches
from solo.methods.base import Method, ema_update, make_teacher


class MaskedViT:
    """A mixin for a Method on a ViT whose batches carry each sample's patch mask."""

    def mask_generator(self):
        """The generator of each sample's mask (solo.data.views.masks), for the data workers."""
        raise NotImplementedError

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(fields=(PatchMasks(self.mask_generator()),), probe_image=self.feeds_probe)

    def probe_features(self, batch: dict) -> dict:
        """{"features": the backbone's pooled feature of each whole image, without a graph} when an online probe
        reads them (the probe learns on what it is evaluated on), else {}."""
        if not self.feeds_probe:
            return {}
        with torch.no_grad():
            return {"features": pooled_feature(self.backbone, batch["probe_image"])}


class PixelReconstruction(MaskedViT, Method):
    """One view per image; `predict(batch)` gives each patch's target as `patch_targets` computes it from the pixels
    (by default the pixels themselves, (B, patches, patch^2 x 3) in patchify's order; MaskFeat's: their HOG), and
    `pixel_loss(prediction, target, mask)` (solo.losses.masked) scores them over the global batch. With
    `normalise_targets`, each target patch is normalised by its own mean and variance (MAE's norm_pix_loss)."""

    num_views = 1
    normalise_targets = False

    def __init__(self, backbone, feature_dim: int):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        self.patch = patch_size(backbone)

    def predict(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def pixel_loss(self, prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def patch_targets(self, images: torch.Tensor) -> torch.Tensor:
        target = patchify(images, self.patch)
        return normalised_patches(target) if self.normalise_targets else target

    def encode(self, batch: dict) -> dict:
        return {"prediction": self.predict(batch), **self.probe_features(batch)}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        loss = self.pixel_loss(encoded["prediction"], self.patch_targets(batch["views"][0]), batch["mask"])
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}


class MaskTokenViT(PixelReconstruction):
    """The backbone on every patch, a learnt mask token in place of each hidden patch's embedding before the position
    embeddings (SimMIM's and MaskFeat's ViT), then a linear head from each patch token to its `outputs` target values;
    the probes read the mean patch token (pool=mean: no loss reads the class token). `mask_token_bound`: the mask
    token's truncated-normal init (std 0.02) is cut at +- that."""

    pool = "mean"

    def __init__(self, backbone, feature_dim: int, outputs: int, mask_token_bound: float):
        super().__init__(backbone, feature_dim)
        pool_patch_tokens(backbone)
        self.mask_token = nn.Parameter(torch.zeros(backbone.embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02, a=-mask_token_bound, b=mask_token_bound)
        self.head = nn.Linear(backbone.embed_dim, outputs)

    def predict(self, batch: dict) -> torch.Tensor:
        images, mask = batch["views"][0], batch["mask"]
        vit = self.backbone
        return self.head(output_tokens(vit, images, mask, self.mask_token)[:, vit.num_prefix_tokens :])


class TargetEncoderViT(MaskedViT, Method):
    """One view per image; the targets come from `target_encoder`, an EMA of the backbone whose momentum after step
    k of n is `momentum_at(k, n)`; the probes read the mean patch token (pool=mean), as I-JEPA's linear protocol.
    With `teacher_blocks_only`, the EMA copies only the backbone's blocks (solo.backbones.vit.BlockOutputs), which take
    the student's own patch and position embeddings (data2vec's `ema_transformer_only`). Given a `frozen` target
    encoder instead (SALT's pretrained teacher), that one, never moved."""

    num_views = 1
    teachers = ("target_encoder",)
    pool = "mean"
    teacher_blocks_only: ClassVar[bool] = False

    def __init__(self, backbone, feature_dim: int, base_momentum: float, frozen: nn.Module | None = None):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        pool_patch_tokens(backbone)
        self.moves = frozen is None
        if frozen is not None:
            self.target_encoder = frozen
            return
        teacher = make_teacher(self.taught())
        self.target_encoder = BlockOutputs(teacher) if self.teacher_blocks_only else teacher
        self.momentum = base_momentum
        self.register_buffer("teacher_momentum", torch.tensor(base_momentum), persistent=False)

    def momentum_at(self, done: int, total_steps: int) -> float:
        raise NotImplementedError

    def prepare_step(self, index: int, total_steps: int) -> None:
        if self.moves:
            self.momentum = self.momentum_at(index + 1, total_steps)
            self.teacher_momentum.fill_(self.momentum)

    def taught(self) -> nn.Module:
        """What the target encoder is an EMA of."""
        return self.backbone.blocks if self.teacher_blocks_only else self.backbone

    def after_optimizer_step(self) -> None:
        if self.moves:
            ema_update(self.target_encoder, self.taught(), self.ema_momentum())

    def metrics(self) -> dict[str, torch.Tensor]:
        moving = {"train/teacher_momentum": torch.tensor(self.momentum)} if self.moves else {}
        return {**super().metrics(), **moving}


class CrossAttentionBlock(nn.Module):
    """A decoder block whose queries attend to a context only (not to each other), then an MLP; pre-norm residuals
    round both, so each query is predicted independently of the others (CAPI's predictor, CrossMAE's decoder). The
    context, of `context_width` (the queries' by default), is taken as it is: callers normalise it."""

    def __init__(self, width: int, heads: int, context_width: int | None = None):
        super().__init__()
        from timm.layers import Mlp  # here: timm's import slows every process's start

        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.query, self.key_value = nn.Linear(width, width), nn.Linear(context_width or width, 2 * width)
        self.project = nn.Linear(width, width)
        self.mlp = Mlp(width, 4 * width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        heads = self.heads
        q = self.query(self.norm1(x)).unflatten(-1, (heads, -1)).transpose(1, 2)
        k, v = self.key_value(context).unflatten(-1, (2, heads, -1)).permute(2, 0, 3, 1, 4)
        x = x + self.project(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        return x + self.mlp(self.norm2(x))


def check_transformer_width(cfg, width_key: str, heads_key: str) -> None:
    """A transformer of the method's own (MAE's decoder, I-JEPA's predictor), with 2-D sine-cosine positions: its
    width must divide into its heads and into 4. Checked with the config, before anything is built."""
    width, heads = cfg.method[width_key], cfg.method[heads_key]
    step = math.lcm(heads, 4)
    if width % step:
        raise ConfigError(
            f"method.{width_key}={width} with method.{heads_key}={heads}: the width must be a multiple of the heads "
            f"and of 4 (its 2-D sine-cosine position embeddings); use method.{width_key}={step * max(1, round(width / step))}"
        )
