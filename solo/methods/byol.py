"""BYOL (Grill et al., 2020): the student predicts a momentum teacher's projection of the other view."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import byol_loss
from solo.methods.base import DSEOption, KoLeoOption, MomentumTwoViewMethod, mlp, register_method
from solo.schema import AT_LEAST_ONE, PROBABILITY, ruled


@dataclass
class BYOLConfig(DSEOption, KoLeoOption):
    name: str = "byol"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    base_momentum: float = ruled(0.996, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("byol", schema=BYOLConfig)
class BYOL(MomentumTwoViewMethod):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: BYOLConfig):
        projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        predictor = mlp([cfg.proj_output_dim, cfg.pred_hidden_dim, cfg.proj_output_dim])
        super().__init__(backbone, feature_dim, projector, predictor, cfg.base_momentum, cfg.final_momentum)
        self.take_regularisers(cfg)

    def loss(self, prediction, target):
        return byol_loss(prediction, target)
