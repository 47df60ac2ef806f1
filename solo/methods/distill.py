"""Distillation from a frozen pretrained teacher (LightlyTrain's default method; Beyer et al., 2022's consistent
teaching): the student, any backbone, sees the view the teacher sees, and a projector from its features regresses
the teacher's features, and optionally its patch tokens. The trainer loads the teacher (solo.zoo.teachers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import is_vit, output_tokens
from solo.errors import ConfigError
from solo.eval.features import extract_features
from solo.eval.health import teacher_agreement
from solo.losses import feature_distillation_loss
from solo.methods.base import Method, mlp, register_method
from solo.schema import NON_NEGATIVE, choices, ruled

DistillLoss = choices("DistillLoss", "cosine", "mse")


@dataclass
class PretrainedTeacherConfig:
    """The keys of a method that learns from a frozen pretrained encoder (Method.pretrained_teacher: distill's
    teacher, LiT's locked image tower), which the trainer loads (solo.zoo.teachers)."""

    name: str = ""
    # A solo zoo name (an image backbone's, or an image-text model's image tower), pretraining run directory, training
    # checkpoint or weights file; a timm model name; or open_clip:<model>
    teacher: str = "simclr-digits-resnet18half"
    # timm and open_clip teachers: their weights file (timm without one: timm's own pretrained weights, from its cache
    # or the network; open_clip: or one of its pretrained tags)
    teacher_weights: Optional[str] = None
    # timm and open_clip teachers: timm.create_model's keyword arguments (img_size, dynamic_img_size), or changes to
    # open_clip's model config (as method.model_cfg)
    teacher_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class DistillConfig(PretrainedTeacherConfig):
    name: str = "distill"
    loss: DistillLoss = DistillLoss("cosine")  # cosine: 1 - cos(projected student, teacher); mse: the squared error
    # The projector from the student's width to the teacher's: 0 for one Linear layer, else an MLP's hidden width
    proj_hidden_dim: int = ruled(0, NON_NEGATIVE)
    # The weight of the same loss on patch tokens (both timm ViTs; the teacher's grid interpolated to the student's)
    patch_weight: float = ruled(0.0, NON_NEGATIVE)


class FrozenTeacher(nn.Module):
    """A pretrained image encoder that no optimizer trains and that stays in eval mode whatever mode the model around
    it is put in (BatchNorm on its running statistics, no dropout): the same function of each image at any world size
    and step. Views normalised with the run's data statistics (mean, std) are renormalised to the teacher's own first.

    `teacher(images)`: its pooled features (B, width); `teacher(images, patches=True)`: those and its patch tokens
    (B, N, D), for a timm Vision Transformer. `source` names it in messages."""

    def __init__(self, encoder: nn.Module, width: int, source: str, data_stats: tuple, own_stats: tuple):
        super().__init__()
        self.encoder = encoder.requires_grad_(False)
        self.width, self.source = width, source
        data_mean, data_std, mean, std = (
            torch.tensor(v, dtype=torch.float64).view(-1, 1, 1) for v in (*data_stats, *own_stats)
        )
        self.renormalise = not (torch.equal(data_mean, mean) and torch.equal(data_std, std))
        # x_teacher = (x_data * data_std + data_mean - mean) / std; buffers, not state: the config gives them again
        self.register_buffer("scale", (data_std / std).float(), persistent=False)
        self.register_buffer("shift", ((data_mean - mean) / std).float(), persistent=False)
        self.train(False)

    def train(self, mode: bool = True) -> FrozenTeacher:
        return super().train(False)

    def forward(self, images: torch.Tensor, patches: bool = False):
        if self.renormalise:
            images = images * self.scale + self.shift
        return pooled_and_patches(self.encoder, images) if patches else self.encoder(images)


def pooled_and_patches(vit: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A timm ViT's pooled feature (what `vit(images)` gives) and its patch tokens (B, N, D), from one pass through
    solo.backbones.vit.output_tokens, as the masked-image methods take them (an empty rank's batch included)."""
    tokens = output_tokens(vit, images)
    return vit.forward_head(tokens), tokens[:, vit.num_prefix_tokens :]


def grid_of(vit: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The (rows, columns) of patches a timm ViT makes of `images`."""
    return tuple(vit.patch_embed.dynamic_feat_size(tuple(images.shape[-2:])))


def on_grid(tokens: torch.Tensor, grid: tuple[int, int], target: tuple[int, int]) -> torch.Tensor:
    """Patch tokens (B, rows x columns, D) of `grid`, bilinearly interpolated to the `target` grid."""
    if grid == target:
        return tokens
    maps = tokens.transpose(1, 2).unflatten(2, grid)  # (B, D, rows, columns)
    return F.interpolate(maps, size=target, mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)


def projector(width: int, teacher_width: int, hidden: int) -> nn.Module:
    """The student's features -> the teacher's width: one Linear layer, or with `hidden` > 0 a small MLP."""
    return nn.Linear(width, teacher_width) if hidden == 0 else mlp([width, hidden, teacher_width])


@register_method("distill", schema=DistillConfig)
class Distill(Method):
    """One view, the same for the teacher and the student; the loss of the projected student's pooled features against
    the teacher's (plus method.patch_weight times that of its projected patch tokens against the teacher's, on the
    student's grid). Validated by the online probe and `val/teacher_agreement`, the mean cosine between the projected
    student's and the teacher's features over the val split."""

    num_views = 1
    teachers = ("teacher",)
    pretrained_teacher = True
    augmentations = {"digits": "distill_digits", "natural": "distill"}

    def __init__(self, backbone, feature_dim: int, cfg: DistillConfig, teacher: FrozenTeacher):
        super().__init__(backbone, feature_dim)
        self.teacher, self.kind, self.patch_weight = teacher, str(cfg.loss), cfg.patch_weight
        self.projector = projector(feature_dim, teacher.width, cfg.proj_hidden_dim)
        self.teacher_val = None  # (the val loader, the teacher's features of it), once computed
        if self.patch_weight:
            for what, encoder in (
                ("the student (backbone)", backbone),
                (f"the teacher {teacher.source}", teacher.encoder),
            ):
                if not is_vit(encoder):
                    raise ConfigError(
                        f"method.patch_weight={cfg.patch_weight}: patch tokens are matched between two timm Vision "
                        f"Transformers, and {what} is a {type(encoder).__name__}: set method.patch_weight=0"
                    )
            self.patch_projector = projector(backbone.embed_dim, teacher.encoder.embed_dim, cfg.proj_hidden_dim)

    def encode(self, batch: dict) -> dict:
        images = batch["views"][0]
        with torch.no_grad():
            target = self.teacher(images, patches=bool(self.patch_weight))
        if not self.patch_weight:
            return {"features": self.backbone(images), "teacher": target}
        features, patches = pooled_and_patches(self.backbone, images)
        target, target_patches = target
        grid = grid_of(self.backbone, images)
        target_patches = on_grid(target_patches, grid_of(self.teacher.encoder, images), grid)
        return {"features": features, "patches": patches, "teacher": target, "teacher_patches": target_patches}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        loss = feature_distillation_loss(self.projector(features), encoded["teacher"], self.kind)
        if self.patch_weight:
            patches = encoded["patches"]
            projected = self.patch_projector(patches.flatten(0, 1)).unflatten(0, patches.shape[:2])
            loss = loss + self.patch_weight * feature_distillation_loss(
                projected, encoded["teacher_patches"], self.kind
            )
        return {"loss": loss, "features": features, "labels": batch["label"]}

    def val_health(self, embedded: torch.Tensor, loader, device, autocast) -> dict[str, float]:
        """`val/teacher_agreement`: the mean cosine between the projected student's features (`embedded`) and the
        teacher's, over the val split in dataset order (so the same at any world size). The frozen teacher's val
        features do not change: one pass of it for the run, not one per epoch."""
        if self.teacher_val is None or self.teacher_val[0] is not loader:
            self.teacher_val = (loader, extract_features(self.teacher, loader, device, autocast)[0])
        return {"val/teacher_agreement": teacher_agreement(embedded, self.teacher_val[1])}
