"""SwAV (Caron et al., 2020): each crop predicts the Sinkhorn-Knopp codes of the global crops over learnt prototypes;
with `method.queue_size`, earlier steps' embeddings join the codes' equipartition (the paper's queue for small
batches)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.losses import swav_loss
from solo.methods.base import (
    DSEOption,
    KoLeoOption,
    Method,
    encode_views,
    mlp,
    register_method,
    with_group_settings,
)
from solo.methods.memory_banks import GlobalQueue, check_queue_size
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ruled


@dataclass
class SwAVConfig(DSEOption, KoLeoOption):
    name: str = "swav"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    num_prototypes: int = ruled(3000, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)
    epsilon: float = ruled(0.05, POSITIVE)  # Sinkhorn-Knopp's entropic regularisation
    sinkhorn_iterations: int = ruled(3, AT_LEAST_ONE)
    freeze_prototypes_epochs: float = ruled(1.0, NON_NEGATIVE)  # SwAV: 313 steps, one epoch at batch 4096
    # Earlier steps' embeddings per global crop that join the Sinkhorn-Knopp (0: none; the paper's 3840 at batch 256),
    # from this epoch on (the paper's 15)
    queue_size: int = ruled(0, NON_NEGATIVE)
    queue_start_epochs: float = ruled(15.0, NON_NEGATIVE)


@register_method("swav", schema=SwAVConfig)
class SwAV(Method):
    augmentations = {"digits": "digits", "natural": "multicrop_swav"}
    local_crops = True

    def __init__(self, backbone, feature_dim: int, cfg: SwAVConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.cfg = cfg
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.prototypes = nn.Linear(cfg.proj_output_dim, cfg.num_prototypes, bias=False)
        self._normalize_prototypes()
        # One global queue per global crop (solo.methods.memory_banks), and whether its rows count this step: a device
        # flag, so that the step's graph does not change when the queue starts.
        self.queues = None
        if cfg.queue_size:
            self.queues = nn.ModuleList(
                [GlobalQueue(cfg.queue_size, cfg.proj_output_dim) for _ in range(self.num_views)]
            )
            self.register_buffer("queue_on", torch.zeros((), dtype=torch.bool), persistent=False)

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.method.queue_size:
            check_queue_size(cfg)

    @torch.no_grad()
    def _normalize_prototypes(self) -> None:
        # Unit prototypes, restored after every update: the scores are cosine similarities.
        self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        frozen_steps = round(self.cfg.freeze_prototypes_epochs * self.steps_per_epoch)
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, self.prototypes.parameters(), frozen_steps=frozen_steps)

    def encode(self, batch: dict) -> dict:
        # The official code's multi-crop forward: the crops of one size share their BatchNorm statistics.
        return self.encode_backbone(batch["views"], per_view_statistics=False)

    def prepare_step(self, index: int, total_steps: int) -> None:
        if self.queues is not None:
            self.queue_on.fill_(index >= round(self.cfg.queue_start_epochs * self.steps_per_epoch))

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        # Every crop through the projector at once, as the official code: its BatchNorm's statistics over all of them.
        projected = encode_views(self.projector, encoded["features"], per_view_statistics=False)
        embeddings = [F.normalize(e, dim=1) for e in projected]
        scores = [self.prototypes(e) for e in embeddings]
        c = self.cfg
        queue = valid = None
        if self.queues is not None:
            with torch.no_grad():  # the queue's embeddings scored against the current prototypes, as SwAV's code
                queue = [self.prototypes(q.rows.clone()) for q in self.queues]
            valid = self.queues[0].valid() & self.queue_on
        loss = swav_loss(scores, c.temperature, c.epsilon, c.sinkhorn_iterations, self.num_views, queue, valid)
        if self.queues is not None:  # after the loss: the queue holds earlier steps' embeddings
            for q, e in zip(self.queues, embeddings):
                q.push(e)
        return self.view_outputs(loss, encoded["features"][: self.num_views], batch, encoded.get("dense"))

    def after_optimizer_step(self) -> None:
        self._normalize_prototypes()
