"""Barlow Twins (Zbontar et al., 2021): two views, BatchNorm MLP projector, redundancy-reduction loss."""

from __future__ import annotations

import torch

from solo.losses import barlow_twins_loss
from solo.methods.base import Method, mlp, register, two_view_features


@register("barlow_twins")
class BarlowTwins(Method):
    def __init__(
        self, backbone, feature_dim: int, *, proj_hidden_dim: int, proj_output_dim: int, lambd: float, scale_loss: float
    ):
        super().__init__(backbone, feature_dim)
        self.projector = mlp([feature_dim, proj_hidden_dim, proj_hidden_dim, proj_output_dim])
        self.lambd, self.scale_loss = lambd, scale_loss

    def forward(self, batch: dict) -> dict:
        f1, f2 = two_view_features(self.backbone, batch["views"])
        loss = self.scale_loss * barlow_twins_loss(self.projector(f1), self.projector(f2), self.lambd)
        return {"loss": loss, "features": torch.cat([f1, f2]), "labels": batch["label"].repeat(2)}
