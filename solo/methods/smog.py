"""SMoG (Pang, Zhang, Li, Cai and Lu, 2022, "Unsupervised Visual Representation Learning by Synchronous Momentum
Grouping"): contrast between groups rather than instances. Each view's prediction is classified among K group
features, its class being the group nearest the momentum teacher's embedding of the other view; the groups move
towards the online embeddings that chose them at every step, and are re-clustered by k-means at intervals."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.errors import ConfigError, DataError
from solo.losses import momentum_groups, smog_loss
from solo.methods.base import (
    DSEOption,
    KoLeoOption,
    MomentumTwoViewMethod,
    ema_update,
    encode_views,
    mlp,
    register_method,
)
from solo.methods.memory_banks import GlobalQueue, check_queue_size, kmeans
from solo.schema import AT_LEAST_ONE, MOMENTUM, POSITIVE, PROBABILITY, ruled


@dataclass
class SMoGConfig(DSEOption, KoLeoOption):
    name: str = "smog"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    num_groups: int = ruled(3000, AT_LEAST_ONE)
    group_momentum: float = ruled(0.99, MOMENTUM)  # beta: a group's share in its update at every step
    temperature: float = ruled(0.1, POSITIVE)
    queue_size: int = ruled(65536, AT_LEAST_ONE)  # the online embeddings that a regrouping clusters
    regroup_every: int = ruled(300, AT_LEAST_ONE)  # optimizer steps between two regroupings
    kmeans_iterations: int = ruled(10, AT_LEAST_ONE)
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(0.99, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("smog", schema=SMoGConfig)
class SMoG(MomentumTwoViewMethod):
    """Student: backbone -> projector (its output BatchNorm without affine) -> predictor; teacher: an EMA copy of
    backbone -> projector. At every step:

    - each view's teacher embedding is assigned its nearest group (cosine), before the groups move;
    - the groups move with both views' online embeddings, over the whole global batch
      (solo.losses.momentum_groups);
    - each view's prediction is classified among the moved groups against the other view's assignment
      (solo.losses.smog_loss), the two directions averaged;
    - the first view's online embeddings enter a global queue (solo.methods.memory_banks.GlobalQueue).

    Every `regroup_every` steps, spherical k-means of the queue replaces the groups and the teacher restarts as a copy
    of the student (the paper's Table 7b, as lightly's example does it). The groups, the queue and the teacher are the
    same on every rank and in checkpoints."""

    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: SMoGConfig):
        d = cfg.proj_output_dim
        projector = mlp([feature_dim, cfg.proj_hidden_dim, d], last_bn=True)
        predictor = mlp([d, cfg.pred_hidden_dim, d])
        super().__init__(backbone, feature_dim, projector, predictor, cfg.base_momentum, cfg.final_momentum)
        self.take_regularisers(cfg)
        self.cfg = cfg
        # Random unit rows, the same on every rank (drawn while the model is built, before the ranks' streams part).
        self.register_buffer("groups", F.normalize(torch.randn(cfg.num_groups, d), dim=1))
        self.queue = GlobalQueue(cfg.queue_size, d)
        self.regroup_now = False

    @classmethod
    def check_config(cls, cfg) -> None:
        check_queue_size(cfg)
        if cfg.method.num_groups > cfg.method.queue_size:
            raise ConfigError(
                f"method.num_groups={cfg.method.num_groups} is more than method.queue_size={cfg.method.queue_size}: "
                "k-means regroups the queue's embeddings into method.num_groups groups; lower method.num_groups or "
                "raise method.queue_size"
            )

    def nearest_group(self, z: torch.Tensor) -> torch.Tensor:
        return (F.normalize(z, dim=1) @ F.normalize(self.groups.to(z.dtype), dim=1).T).argmax(dim=1)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        z1, z2 = encode_views(self.projector, [f1, f2])
        p1, p2 = encode_views(self.predictor, [z1, z2])
        with torch.no_grad():
            t1, t2 = encode_views(self.teacher[1], encoded["teacher"])
            target1, target2 = self.nearest_group(t1), self.nearest_group(t2)
        groups = momentum_groups(self.groups, F.normalize(torch.cat([z1, z2]), dim=1), self.cfg.group_momentum)
        t = self.cfg.temperature
        loss = (smog_loss(p1, groups, target2, t) + smog_loss(p2, groups, target1, t)) / 2
        self.groups.copy_(groups)
        self.queue.push(F.normalize(z1.detach(), dim=1))
        return self.view_outputs(loss, [f1, f2], batch, encoded.get("dense"))

    def prepare_step(self, index: int, total_steps: int) -> None:
        super().prepare_step(index, total_steps)
        done = index + 1  # no regrouping after the run's last step
        self.regroup_now = done % self.cfg.regroup_every == 0 and done < total_steps
        self.step_done = done

    def after_optimizer_step(self) -> None:
        if not self.regroup_now:
            super().after_optimizer_step()
            return
        self.regroup()  # k-means reads the host: once every regroup_every steps, not compiled whole

    @torch.no_grad()
    def regroup(self) -> None:
        """The groups <- spherical k-means of the queue's filled rows; the teacher <- a copy of the student."""
        rows = self.queue.rows[self.queue.valid()]
        k = self.cfg.num_groups
        if len(rows) < k:
            raise DataError(
                f"method.num_groups={k}: the queue held {len(rows)} embeddings at step {self.step_done}'s regrouping, "
                "fewer than the groups; lower method.num_groups or raise method.regroup_every"
            )
        centroids, _ = kmeans(rows, k, self.cfg.kmeans_iterations, seed=self.step_done)
        self.groups.copy_(centroids)
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.projector]), 0.0)
