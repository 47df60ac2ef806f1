"""TiCo (Zhu et al., 2022): the student's embedding of one view pulled to a momentum teacher's of the other, and its
covariance contrast, the embedding weighed by a running covariance of the global batch's embeddings, pushed down."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.losses import tico_loss
from solo.methods.base import (
    DSEOption,
    KoLeoOption,
    Method,
    cosine_momentum,
    ema_update,
    make_teacher,
    mlp,
    register_method,
)
from solo.schema import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, PROBABILITY, ruled


@dataclass
class TiCoConfig(DSEOption, KoLeoOption):
    name: str = "tico"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    beta: float = ruled(0.9, MOMENTUM)  # the running covariance's momentum: C <- beta C + (1 - beta) B, every step
    rho: float = ruled(8.0, NON_NEGATIVE)  # the covariance contrast's weight
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("tico", schema=TiCoConfig)
class TiCo(Method):
    """The first view through the student (backbone -> projector), the second through its EMA teacher, as lightly's
    TiCo and the TiCo-pytorch code it cites: no predictor, and the loss one-sided (only the student's view makes the
    covariance)."""

    # BYOL's asymmetric views (lightly's TiCoTransform), as BYOL's
    augmentations = {"digits": "digits", "natural": "barlow_twins"}
    teachers = ("teacher",)
    sync_teacher_batchnorm = True

    def __init__(self, backbone, feature_dim: int, cfg: TiCoConfig):
        super().__init__(backbone, feature_dim)
        self.cfg = cfg
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.teacher = make_teacher(nn.ModuleList([backbone, self.projector]))
        # A buffer: in the checkpoint, so a resumed run goes on with the same running covariance.
        self.register_buffer("covariance", torch.zeros(cfg.proj_output_dim, cfg.proj_output_dim))
        self.momentum = cfg.base_momentum
        self.register_buffer("teacher_momentum", torch.tensor(cfg.base_momentum), persistent=False)

    def encode(self, batch: dict) -> dict:
        first, second = batch["views"]
        with torch.no_grad():
            teacher = self.teacher[0](second)
        return {**self.encode_backbone([first]), "teacher": teacher}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        (features,) = encoded["features"]
        with torch.no_grad():
            target = self.teacher[1](encoded["teacher"])
        c = self.cfg
        loss, covariance = tico_loss(self.projector(features), target, self.covariance, c.beta, c.rho)
        with torch.no_grad():  # after the loss, from the whole global batch: the next step's running covariance
            self.covariance.copy_(covariance)
        return self.view_outputs(loss, [features], batch, encoded.get("dense"))

    def prepare_step(self, index: int, total_steps: int) -> None:
        self.momentum = cosine_momentum(self.cfg.base_momentum, self.cfg.final_momentum, index + 1, total_steps)
        self.teacher_momentum.fill_(self.momentum)

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.projector]), self.ema_momentum())

    def metrics(self) -> dict[str, torch.Tensor]:
        return {**super().metrics(), "train/teacher_momentum": torch.tensor(self.momentum)}
