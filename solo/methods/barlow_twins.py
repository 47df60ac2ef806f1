"""Barlow Twins (Zbontar et al., 2021): two views, BatchNorm MLP projector, redundancy-reduction loss."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import barlow_twins_loss
from solo.methods.base import ExpanderConfig, ExpanderMethod, register_method
from solo.schema import NON_NEGATIVE, POSITIVE, ruled


@dataclass
class BarlowTwinsConfig(ExpanderConfig):
    name: str = "barlow_twins"
    lambd: float = ruled(0.0051, NON_NEGATIVE)
    scale_loss: float = ruled(1.0, POSITIVE)


@register_method("barlow_twins", schema=BarlowTwinsConfig)
class BarlowTwins(ExpanderMethod):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: BarlowTwinsConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.lambd, self.scale_loss = cfg.lambd, cfg.scale_loss

    def loss(self, z1, z2):
        return self.scale_loss * barlow_twins_loss(z1, z2, self.lambd)
