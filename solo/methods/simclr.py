"""SimCLR (Chen et al., 2020): two views, MLP projector, NT-Xent over the global batch."""

from __future__ import annotations

import torch

from solo.losses import nt_xent_loss
from solo.methods.base import Method, mlp, register, two_view_features


@register("simclr")
class SimCLR(Method):
    def __init__(self, backbone, feature_dim: int, *, proj_hidden_dim: int, proj_output_dim: int, temperature: float):
        super().__init__(backbone, feature_dim)
        self.projector = mlp([feature_dim, proj_hidden_dim, proj_output_dim])
        self.temperature = temperature

    def forward(self, batch: dict) -> dict:
        f1, f2 = two_view_features(self.backbone, batch["views"])
        loss = nt_xent_loss(self.projector(f1), self.projector(f2), self.temperature)
        return {"loss": loss, "features": torch.cat([f1, f2]), "labels": batch["label"].repeat(2)}
