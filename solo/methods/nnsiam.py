"""NNSiam (solo-learn's SimSiam with NNCLR's support set): each view's prediction regresses onto the nearest
neighbour of the other view's projection in a queue of earlier steps' projections."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from solo.losses import simsiam_loss
from solo.methods.base import DSEOption, KoLeoOption, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.methods.simsiam import SimSiam
from solo.schema import AT_LEAST_ONE, ruled


@dataclass
class NNSiamConfig(DSEOption, KoLeoOption):
    name: str = "nnsiam"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(2048, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # the support set: earlier steps' first-view projections


@register_method("nnsiam", schema=NNSiamConfig)
class NNSiam(SimSiam):  # SimSiam's heads and static predictor learning rate
    def __init__(self, backbone, feature_dim: int, cfg: NNSiamConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.support = GlobalQueue(cfg.queue_size, cfg.proj_output_dim)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def pair_loss(self, p1, p2, z1, z2):
        loss = (simsiam_loss(p1, self.support.nearest(z2)) + simsiam_loss(p2, self.support.nearest(z1))) / 2
        self.support.push(F.normalize(z1.detach(), dim=1))
        return loss
