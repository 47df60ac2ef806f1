"""SigLIP (Zhai et al., 2023): CLIP's towers trained with a pairwise sigmoid loss, learnt scale and bias."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.losses import siglip_loss
from solo.methods.base import register_method
from solo.methods.clip import ImageTextMethod, TowersConfig, build_towers
from solo.schema import POSITIVE, ruled


@dataclass
class SigLIPConfig(TowersConfig):
    name: str = "siglip"
    init_logit_scale: float = ruled(10.0, POSITIVE)  # the paper's t' = log 10
    init_bias: float = -10.0  # the paper's b: starts the loss near the 1 positive : N - 1 negatives prior


@register_method("siglip", schema=SigLIPConfig)
class SigLIP(ImageTextMethod):
    def __init__(self, backbone, feature_dim: int, cfg: SigLIPConfig):
        super().__init__(build_towers(backbone, feature_dim, cfg), cfg.init_logit_scale, init_bias=cfg.init_bias)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        image = self.embed_features(encoded["image"])
        text = self.embed_text(encoded["text"])
        loss = siglip_loss(image, text, self.log_logit_scale.exp(), self.bias)
        return {"loss": loss, "features": encoded["image"], "labels": batch["label"]}

    def metrics(self) -> dict[str, torch.Tensor]:
        return {"train/logit_scale": self.log_logit_scale.exp().detach(), "train/logit_bias": self.bias.detach()}
