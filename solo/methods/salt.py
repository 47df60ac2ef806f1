"""SALT (Li et al., 2025, "Rethinking JEPA: Compute-Efficient Video SSL with Frozen Teachers"), for images: I-JEPA's
masks and predictor, with a frozen teacher instead of an EMA one. Stage 1 trains the teacher by pixel reconstruction
(MAE: any solo run or zoo entry); stage 2, this method, trains a new student to predict, from a context block, the
teacher's features of the target blocks (L1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones.vit import is_vit
from solo.errors import ConfigError
from solo.methods.base import register_method
from solo.methods.distill import FrozenTeacher, PretrainedTeacherConfig, grid_of, on_grid
from solo.methods.ijepa import IJEPA, MultiBlockPredictionConfig
from solo.schema import choices

SALTLoss = choices("SALTLoss", "l1", "smooth_l1", "mse")


@dataclass
class SALTConfig(MultiBlockPredictionConfig, PretrainedTeacherConfig):
    name: str = "salt"
    teacher: str = "mae-digits-vittiny6"  # stage 1: a pixel-reconstruction run (zoo name, run directory, weights...)
    loss: SALTLoss = SALTLoss("l1")  # l1 (SALT's), smooth_l1 or mse


@register_method("salt", schema=SALTConfig)
class SALT(IJEPA):
    """I-JEPA's step (solo.methods.ijepa) with `target_encoder` the frozen teacher (solo.methods.distill.FrozenTeacher,
    loaded by the trainer from method.teacher): every patch's target is the teacher's patch token on the whole image
    (after its final norm, no further normalisation), on the student's patch grid (bilinear where the teacher's
    differs), and the loss (method.loss: L1 by default) is averaged over every target patch of the global batch. The
    student starts from its own initialisation; its width may differ from the teacher's (the predictor maps to the
    teacher's)."""

    pretrained_teacher = True

    def __init__(self, backbone, feature_dim: int, cfg: SALTConfig, teacher: FrozenTeacher):
        if not is_vit(teacher.encoder):
            raise ConfigError(
                f"method.teacher={cfg.teacher}: SALT predicts the teacher's patch tokens, and it is a "
                f"{type(teacher.encoder).__name__}; give a timm Vision Transformer (an MAE run's, a zoo ViT)"
            )
        super().__init__(backbone, feature_dim, cfg, frozen=teacher)

    def target_features(self, images: torch.Tensor) -> torch.Tensor:
        _, patches = self.target_encoder(images, patches=True)
        return on_grid(patches, grid_of(self.target_encoder.encoder, images), grid_of(self.backbone, images))
