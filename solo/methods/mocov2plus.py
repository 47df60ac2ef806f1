"""MoCo v2+ (Chen, Fan, Girshick and He, 2020; solo-learn's symmetric "v2+"): a momentum teacher's keys, and a queue
of earlier steps' keys as the negatives, one queue per view; optionally CO2's consistency term (Wei et al., 2021)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from solo.losses import co2_loss, moco_queue_loss
from solo.methods.base import CO2Option, DSEOption, KoLeoOption, MomentumTwoViewMethod, register_method
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled


@dataclass
class MoCoV2PlusConfig(CO2Option, DSEOption, KoLeoOption):
    name: str = "mocov2plus"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # keys of earlier steps per view; at least one global batch
    temperature: float = ruled(0.2, POSITIVE)
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("mocov2plus", schema=MoCoV2PlusConfig)
class MoCoV2Plus(MomentumTwoViewMethod):
    """Each view's query against the teacher's key of the other view and the queue of that view's earlier keys;
    the step's keys enter the queues after the loss. The queues are global (solo.methods.memory_banks.GlobalQueue)."""

    def __init__(self, backbone, feature_dim: int, cfg: MoCoV2PlusConfig):
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        projector = nn.Sequential(nn.Linear(feature_dim, h), nn.ReLU(inplace=True), nn.Linear(h, d))  # MoCo v2's head
        super().__init__(backbone, feature_dim, projector, nn.Identity(), cfg.base_momentum, cfg.final_momentum)
        self.take_regularisers(cfg)
        self.queues = nn.ModuleList([GlobalQueue(cfg.queue_size, d) for _ in range(2)])
        self.temperature = cfg.temperature
        self.co2_weight, self.co2_temperature = cfg.co2_weight, cfg.co2_temperature

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)

    def pair_loss(self, p1, p2, t1, t2):
        k1, k2 = F.normalize(t1, dim=1), F.normalize(t2, dim=1)
        # Copies: the loss's backward needs the rows as they were before this step's push.
        rows, valid = [q.rows.clone() for q in self.queues], [q.valid() for q in self.queues]
        loss = (
            moco_queue_loss(p1, k2, rows[1], valid[1], self.temperature)
            + moco_queue_loss(p2, k1, rows[0], valid[0], self.temperature)
        ) / 2
        if self.co2_weight:
            consistency = co2_loss(p1, k2, rows[1], valid[1], self.co2_temperature) + co2_loss(
                p2, k1, rows[0], valid[0], self.co2_temperature
            )
            loss = loss + self.co2_weight * consistency / 2
        self.queues[0].push(k1)
        self.queues[1].push(k2)
        return loss
