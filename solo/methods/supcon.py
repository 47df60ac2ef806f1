"""SupCon (Khosla et al., 2020): contrastive learning whose positives are every view of the same class."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from solo.losses import supcon_loss
from solo.methods.base import DSEOption, KoLeoOption, TwoViewMethod, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled


@dataclass
class SupConConfig(DSEOption, KoLeoOption):
    name: str = "supcon"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)


@register_method("supcon", schema=SupConConfig)
class SupCon(TwoViewMethod):
    needs_labels = True
    per_view_statistics = False  # the official code runs both views through the model in one call

    def __init__(self, backbone, feature_dim: int, cfg: SupConConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        h = cfg.proj_hidden_dim
        self.projector = nn.Sequential(
            nn.Linear(feature_dim, h), nn.ReLU(inplace=True), nn.Linear(h, cfg.proj_output_dim)
        )
        self.temperature = cfg.temperature

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        loss = supcon_loss(*self.project([f1, f2]), batch["label"], self.temperature)
        return self.view_outputs(loss, [f1, f2], batch, encoded.get("dense"))
