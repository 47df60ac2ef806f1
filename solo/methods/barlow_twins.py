"""Barlow Twins (Zbontar et al., 2021): two views, BatchNorm MLP projector, redundancy-reduction loss."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import barlow_twins_loss
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ruled
from solo.methods.base import TwoViewMethod, mlp, register_method


@dataclass
class BarlowTwinsConfig:
    name: str = "barlow_twins"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(2048, AT_LEAST_ONE)
    lambd: float = ruled(0.0051, NON_NEGATIVE)
    scale_loss: float = ruled(1.0, POSITIVE)


@register_method("barlow_twins", schema=BarlowTwinsConfig)
class BarlowTwins(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: BarlowTwinsConfig):
        super().__init__(backbone, feature_dim)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.lambd, self.scale_loss = cfg.lambd, cfg.scale_loss

    def loss(self, z1, z2):
        return self.scale_loss * barlow_twins_loss(z1, z2, self.lambd)
