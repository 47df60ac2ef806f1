"""data2vec 2.0 (Baevski et al., 2023): data2vec's contextualised targets made cheap. The student encodes only the
visible patches of several masks of each image (inverse block masks: the visible patches come in blocks); a light
convolutional decoder fills in the grid and predicts, at each hidden patch, the average of the top blocks' feed-forward
outputs of an EMA teacher that saw the whole image once, each instance-normalised, the mean layer-normalised; the
class token predicts the mean of its image's targets."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import embed_patches, grid_shape, keep, prefix_tokens, put_back, run_blocks
from solo.data.views.masks import Data2Vec2Masks
from solo.dtypes import full_precision
from solo.errors import ConfigError
from solo.losses import data2vec2_loss
from solo.methods.base import register_method
from solo.methods.masked_image import TargetEncoderViT
from solo.schema import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, PROBABILITY, ruled


@dataclass
class Data2Vec2Config:
    name: str = "data2vec2"
    mask_ratio: float = ruled(0.8, FRACTION)  # the share of each mask's patches hidden (--mask_prob)
    mask_block: int = ruled(3, AT_LEAST_ONE)  # the side of the visible blocks, in patches (--mask_length)
    mask_adjust: float = ruled(0.07, NON_NEGATIVE)  # more block centres than the visible share needs (mask_prob_adjust)
    masks_per_image: int = ruled(16, AT_LEAST_ONE)  # masks of each image, one teacher pass (--clone_batch)
    average_top_k_layers: int = ruled(10, AT_LEAST_ONE)  # the teacher's last blocks whose outputs are averaged
    decoder_dim: int = ruled(768, AT_LEAST_ONE)  # the convolutional decoder's channels
    decoder_layers: int = ruled(6, AT_LEAST_ONE)
    decoder_kernel: int = ruled(3, AT_LEAST_ONE)  # odd: the grid keeps its size
    decoder_groups: int = ruled(16, AT_LEAST_ONE)  # grouped convolutions: divides the width and decoder_dim
    class_weight: float = ruled(2.56, NON_NEGATIVE)  # the class token's term, against the patches' mean (see the docs)
    base_momentum: float = ruled(0.9998, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(0.99999, PROBABILITY)  # ... reached linearly after momentum_anneal_fraction
    momentum_anneal_fraction: float = ruled(0.2665, PROBABILITY)  # of training (100,000 of 375,300 updates)


class ConvDecoder(nn.Module):
    """data2vec 2.0's decoder for images: the encoded visible patches at their places on the patch grid, zeros at the
    hidden ones; `layers` blocks of a grouped 2-D convolution, a layer norm over the channels (no affine) and a GELU,
    each added to its input where the widths match; then a linear map back to the encoder's width."""

    def __init__(self, width: int, cfg: Data2Vec2Config, grid: tuple[int, int]):
        super().__init__()
        self.grid = grid
        channels = [width] + [cfg.decoder_dim] * cfg.decoder_layers
        self.convs = nn.ModuleList(
            nn.Conv2d(c_in, c_out, cfg.decoder_kernel, padding=cfg.decoder_kernel // 2, groups=cfg.decoder_groups)
            for c_in, c_out in zip(channels[:-1], channels[1:])
        )
        self.project = nn.Linear(cfg.decoder_dim, width)

    def forward(self, visible: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """(B, N, width) predictions at every patch from `visible` (B, V, width), each row's visible patches in
        order, and `hidden` (B, N)."""
        x = put_back(visible, hidden, visible.new_zeros(*hidden.shape, visible.shape[-1]))
        x = x.transpose(1, 2).unflatten(2, self.grid)  # (B, width, H, W)
        for conv in self.convs:
            y = F.gelu(F.layer_norm(conv(x).movedim(1, -1), (conv.out_channels,)).movedim(-1, 1))
            x = x + y if y.shape == x.shape else y
        return self.project(x.flatten(2).transpose(1, 2))


class FeedForwardOutput(nn.Module):
    """A timm ViT block that returns its output and its MLP branch's (after layer scale, before the residual sum):
    data2vec 2.0's targets are the blocks' feed-forward outputs. A module of its own, so that FSDP gathers the block's
    parameters around this call as around the block's."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.block
        x = x + b.drop_path1(b.ls1(b.attn(b.norm1(x))))
        branch = b.ls2(b.mlp(b.norm2(x)))
        return x + b.drop_path2(branch), branch


@register_method("data2vec2", schema=Data2Vec2Config)
class Data2Vec2(TargetEncoderViT):
    """One view per image and `masks_per_image` masks of it (solo.data.views.masks.Data2Vec2Masks, drawn per sample:
    `batch["mask"]` (B, M, N)). `encode` embeds each image once, runs the student on each mask's visible patches (the
    class token first), decodes every patch, and, without a graph, runs the teacher (an EMA of the whole backbone) on
    the whole image. A patch's target: the mean over the teacher's last `average_top_k_layers` blocks of their
    feed-forward outputs, each normalised per channel over the image's patches (instance norm), then layer-normalised.
    `batch_loss`: data2vec2_loss over every (mask, hidden patch) of the global batch, the class token's output against
    the mean of its image's targets."""

    augmentations = {"digits": "one_view_digits", "natural": "data2vec"}

    def __init__(self, backbone, feature_dim: int, cfg: Data2Vec2Config):
        super().__init__(backbone, feature_dim, cfg.base_momentum)
        self.cfg = cfg
        depth, width = len(backbone.blocks), backbone.embed_dim
        if cfg.average_top_k_layers > depth:
            raise ConfigError(
                f"method.average_top_k_layers={cfg.average_top_k_layers}: the backbone has {depth} blocks; "
                f"average at most {depth}"
            )
        if width % cfg.decoder_groups or cfg.decoder_dim % cfg.decoder_groups:
            raise ConfigError(
                f"method.decoder_groups={cfg.decoder_groups}: it must divide the backbone's width ({width}) and "
                f"method.decoder_dim ({cfg.decoder_dim}); pick a common divisor"
            )
        if cfg.decoder_kernel % 2 == 0:
            raise ConfigError(
                f"method.decoder_kernel={cfg.decoder_kernel}: use an odd size, so the grid keeps its size"
            )
        if cfg.class_weight and backbone.cls_token is None:
            raise ConfigError(
                f"method.class_weight={cfg.class_weight}: the backbone has no class token; set method.class_weight=0"
            )
        if not all(hasattr(b, "ls2") and hasattr(b, "drop_path2") for b in backbone.blocks):
            raise ConfigError(
                f"backbone.name={type(backbone.blocks[0]).__name__} blocks: data2vec2 reads the feed-forward output "
                "of timm's standard ViT Block; use a timm VisionTransformer with its default blocks"
            )
        if self.mask_generator().visible < 1:
            raise ConfigError(
                f"method.mask_ratio={cfg.mask_ratio}: it hides every patch of the {grid_shape(backbone)} grid; lower it"
            )
        teacher_blocks = self.target_encoder.blocks
        self.target_encoder.blocks = type(teacher_blocks)(*(FeedForwardOutput(b) for b in teacher_blocks))
        self.decoder = ConvDecoder(width, cfg, grid_shape(backbone))

    def mask_generator(self) -> Data2Vec2Masks:
        c = self.cfg
        return Data2Vec2Masks(grid_shape(self.backbone), c.mask_ratio, c.mask_block, c.mask_adjust, c.masks_per_image)

    def encode(self, batch: dict) -> dict:
        images, masks = batch["views"][0], batch["mask"]
        vit = self.backbone
        prefix = vit.num_prefix_tokens
        hidden = masks.flatten(0, 1)  # (B * M, N): each image's masks in turn
        patches = embed_patches(vit, images).repeat_interleave(masks.shape[1], dim=0)
        visible = keep(patches, hidden, self.mask_generator().visible)
        tokens = run_blocks(vit, torch.cat([prefix_tokens(vit, len(hidden)), visible], dim=1))
        prediction = self.decoder(tokens[:, prefix:], hidden)
        target = self.targets(images)
        return {
            "prediction": prediction,
            "hidden": hidden,
            "target": target.repeat_interleave(masks.shape[1], dim=0),
            "class_prediction": tokens[:, 0],
            "class_target": target.mean(dim=1).repeat_interleave(masks.shape[1], dim=0),
        } | self.probe_features(batch)

    @torch.no_grad()
    def targets(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N, D): each patch's target from the teacher on the whole image."""
        teacher = self.target_encoder
        prefix = teacher.num_prefix_tokens
        x = teacher.norm_pre(torch.cat([prefix_tokens(teacher, len(images)), embed_patches(teacher, images)], 1))
        first = len(teacher.blocks) - self.cfg.average_top_k_layers
        total = 0
        for index, block in enumerate(teacher.blocks):
            x, branch = block(x)
            if index >= first:
                y = full_precision(branch[:, prefix:])
                mean, var = y.mean(dim=1, keepdim=True), y.var(dim=1, unbiased=False, keepdim=True)
                total = total + (y - mean) / (var + 1e-5).sqrt()  # F.instance_norm's, over the patches
        average = total / self.cfg.average_top_k_layers
        return F.layer_norm(average, average.shape[-1:])

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        e = encoded
        loss = data2vec2_loss(
            e["prediction"], e["target"], e["hidden"], e["class_prediction"], e["class_target"], self.cfg.class_weight
        )
        return {"loss": loss, "features": e.get("features"), "labels": batch["label"]}

    def momentum_at(self, done: int, total_steps: int) -> float:
        c = (
            self.cfg
        )  # linear until momentum_anneal_fraction of training, then constant (the official ema_anneal_end_step)
        anneal = max(1, round(c.momentum_anneal_fraction * total_steps))
        return c.base_momentum + (c.final_momentum - c.base_momentum) * min(done, anneal) / anneal
