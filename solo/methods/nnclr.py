"""NNCLR (Dwibedi et al., 2021): InfoNCE between each view's nearest neighbour in a support set (a queue of earlier
steps' projections) and the predictions of the other view over the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from solo.losses import nnclr_loss
from solo.methods.base import DSEOption, KoLeoOption, SiameseMethod, mlp, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled


@dataclass
class NNCLRConfig(DSEOption, KoLeoOption):
    name: str = "nnclr"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # the support set: earlier steps' first-view projections
    temperature: float = ruled(0.2, POSITIVE)


@register_method("nnclr", schema=NNCLRConfig)
class NNCLR(SiameseMethod):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: NNCLRConfig):
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        super().__init__(
            backbone, feature_dim, mlp([feature_dim, h, h, d], last_bn=True), mlp([d, cfg.pred_hidden_dim, d])
        )
        self.take_regularisers(cfg)
        self.support = GlobalQueue(cfg.queue_size, d)
        self.temperature = cfg.temperature

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def pair_loss(self, p1, p2, z1, z2):
        nn1, nn2 = self.support.nearest(z1), self.support.nearest(z2)
        loss = (nnclr_loss(nn1, p2, self.temperature) + nnclr_loss(nn2, p1, self.temperature)) / 2
        self.support.push(F.normalize(z1.detach(), dim=1))
        return loss
