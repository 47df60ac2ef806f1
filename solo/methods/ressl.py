"""ReSSL (Zheng et al., 2021): the student's relation to a queue of earlier keys (a softmax over their similarities)
learns the momentum teacher's sharper relation of the other view."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from solo.losses import ressl_loss
from solo.methods.base import DSEOption, KoLeoOption, MomentumTwoViewMethod, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled


@dataclass
class ReSSLConfig(DSEOption, KoLeoOption):
    name: str = "ressl"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # earlier steps' teacher keys of the second view
    temperature_q: float = ruled(0.1, POSITIVE)  # the student's softmax
    temperature_k: float = ruled(0.04, POSITIVE)  # the teacher's, sharper
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("ressl", schema=ReSSLConfig)
class ReSSL(MomentumTwoViewMethod):
    """As the paper: the student sees the first view and the teacher the second (the weakly augmented one in the
    paper's recipe: give the second entry of augmentation.views a weaker recipe); the queue holds the teacher's keys."""

    # a weak view for the teacher: with two strong ones it learns much less (docs/methods/ressl.md)
    augmentations = {"digits": "ressl_digits", "natural": "ressl"}

    def __init__(self, backbone, feature_dim: int, cfg: ReSSLConfig):
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        projector = nn.Sequential(nn.Linear(feature_dim, h), nn.ReLU(inplace=True), nn.Linear(h, d))
        super().__init__(backbone, feature_dim, projector, nn.Identity(), cfg.base_momentum, cfg.final_momentum)
        self.take_regularisers(cfg)
        self.queue = GlobalQueue(cfg.queue_size, d)
        self.temperature_q, self.temperature_k = cfg.temperature_q, cfg.temperature_k

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def pair_loss(self, p1, p2, t1, t2):
        rows = self.queue.rows.clone()  # the backward needs the rows as they were before this step's push
        loss = ressl_loss(p1, t2, rows, self.queue.valid(), self.temperature_q, self.temperature_k)
        self.queue.push(F.normalize(t2, dim=1))
        return loss
