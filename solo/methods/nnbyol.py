"""NNBYOL (solo-learn's BYOL with NNCLR's support set): each view's prediction regresses onto the nearest neighbour of
the momentum teacher's projection of the other view in a queue of earlier steps' teacher projections."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from solo.losses import byol_loss
from solo.methods.base import DSEOption, KoLeoOption, register_method
from solo.methods.byol import BYOL
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, PROBABILITY, ruled


@dataclass
class NNBYOLConfig(DSEOption, KoLeoOption):
    name: str = "nnbyol"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # the support set: earlier steps' teacher projections of view 1
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("nnbyol", schema=NNBYOLConfig)
class NNBYOL(BYOL):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: NNBYOLConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.support = GlobalQueue(cfg.queue_size, cfg.proj_output_dim)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def pair_loss(self, p1, p2, t1, t2):
        loss = byol_loss(p1, self.support.nearest(t2)) + byol_loss(p2, self.support.nearest(t1))
        self.support.push(F.normalize(t1, dim=1))
        return loss
