"""SigLIP (Zhai et al., 2023): CLIP's towers trained with a pairwise sigmoid loss, learnt scale and bias."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from solo.losses import siglip_loss
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled
from solo.methods.base import register_method
from solo.methods.clip import ImageTextMethod, TextConfig


@dataclass
class SigLIPConfig:
    name: str = "siglip"
    embed_dim: int = ruled(512, AT_LEAST_ONE)
    init_logit_scale: float = ruled(10.0, POSITIVE)  # the paper's t' = log 10
    init_bias: float = -10.0  # the paper's b: starts the loss near the 1 positive : N - 1 negatives prior
    text: TextConfig = field(default_factory=TextConfig)


@register_method("siglip", schema=SigLIPConfig)
class SigLIP(ImageTextMethod):
    def __init__(self, backbone, feature_dim: int, cfg: SigLIPConfig):
        super().__init__(backbone, feature_dim, cfg.embed_dim, cfg.text, cfg.init_logit_scale)
        self.bias = nn.Parameter(torch.tensor(cfg.init_bias))

    def joint(self, encoded: dict, batch: dict) -> dict:
        image = self.embed_features(encoded["image"])
        text = self.embed_text(encoded["text"])
        loss = siglip_loss(image, text, self.log_logit_scale.exp(), self.bias)
        return {"loss": loss, "features": encoded["image"], "labels": batch["label"]}

    def metrics(self) -> dict[str, torch.Tensor]:
        return {"train/logit_scale": self.log_logit_scale.exp().detach(), "train/logit_bias": self.bias.detach()}
