"""MoCo v2+ (Chen, Fan, Girshick and He, 2020; solo-learn's symmetric "v2+"): a momentum teacher's keys, and a queue
of earlier steps' keys as the negatives, one queue per view."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.distributed.env import detect
from solo.errors import ConfigError
from solo.losses import moco_queue_loss
from solo.methods.base import MomentumTwoViewMethod, register_method
from solo.methods.memory import GlobalQueue
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled


@dataclass
class MoCoV2PlusConfig:
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
    the step's keys enter the queues after the loss. The queues are global (solo.methods.memory.GlobalQueue)."""

    def __init__(self, backbone, feature_dim: int, cfg: MoCoV2PlusConfig):
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        projector = nn.Sequential(nn.Linear(feature_dim, h), nn.ReLU(inplace=True), nn.Linear(h, d))  # MoCo v2's head
        super().__init__(backbone, feature_dim, projector, nn.Identity(), cfg.base_momentum, cfg.final_momentum)
        self.queues = nn.ModuleList([GlobalQueue(cfg.queue_size, d) for _ in range(2)])
        self.temperature = cfg.temperature

    @classmethod
    def check_config(cls, cfg) -> None:
        global_batch = cfg.data.batch_size * detect().world_size
        if cfg.method.queue_size < global_batch:
            raise ConfigError(f"method.queue_size={cfg.method.queue_size} is smaller than the global batch ({global_batch}): "
                              "each step pushes the whole global batch's keys; raise method.queue_size")

    def joint(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        q1, q2 = self.projector(f1), self.projector(f2)
        with torch.no_grad():
            k1, k2 = (F.normalize(self.teacher[1](t), dim=1) for t in encoded["teacher"])
        # Copies: the loss's backward needs the rows as they were before this step's push.
        rows, valid = [q.rows.clone() for q in self.queues], [q.valid() for q in self.queues]
        loss = (moco_queue_loss(q1, k2, rows[1], valid[1], self.temperature)
                + moco_queue_loss(q2, k1, rows[0], valid[0], self.temperature)) / 2
        self.queues[0].push(k1)
        self.queues[1].push(k2)
        return {"loss": loss, "features": torch.cat([f1, f2]), "labels": batch["label"].repeat(2)}
