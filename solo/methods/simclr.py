"""SimCLR (Chen et al., 2020): two views, MLP projector, NT-Xent over the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.losses import nt_xent_loss
from solo.methods.base import Method, mlp, register_method, two_view_features


@dataclass
class SimCLRConfig:
    name: str = "simclr"
    proj_hidden_dim: int = 2048
    proj_output_dim: int = 128
    temperature: float = 0.2


@register_method("simclr", schema=SimCLRConfig)
class SimCLR(Method):
    def __init__(self, backbone, feature_dim: int, cfg: SimCLRConfig):
        super().__init__(backbone, feature_dim)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.temperature = cfg.temperature

    def forward(self, batch: dict) -> dict:
        f1, f2 = two_view_features(self.backbone, batch["views"])
        loss = nt_xent_loss(self.projector(f1), self.projector(f2), self.temperature)
        return {"loss": loss, "features": torch.cat([f1, f2]), "labels": batch["label"].repeat(2)}
