"""A method added from a file of its own, as a user would: a student regresses an EMA teacher's output.

Registered by `imports=[tests.toy_ema_method]`, configured by tests/configs/method/toy_ema.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.distributed.batchnorm import SyncBatchNorm
from solo.methods import Method, register_method
from solo.methods.base import ema_update, make_teacher, mlp


@dataclass
class ToyEMAConfig:
    name: str = "toy_ema"
    hidden_dim: int = 16
    out_dim: int = 8
    base_momentum: float = 0.9


def teacher_momentum(base: float, step: int, total_steps: int) -> float:
    """BYOL's schedule: from `base` after the first step up to 1 at the last."""
    return 1 - (1 - base) * (math.cos(math.pi * step / total_steps) + 1) / 2


@register_method("toy_ema", schema=ToyEMAConfig)
class ToyEMA(Method):
    teachers = ("teacher",)

    def __init__(self, backbone, feature_dim: int, cfg: ToyEMAConfig):
        super().__init__(backbone, feature_dim)
        self.head = mlp([feature_dim, cfg.hidden_dim, cfg.out_dim])
        self.teacher = make_teacher(nn.Sequential(backbone, self.head))
        self.base_momentum = cfg.base_momentum

    def forward(self, batch: dict) -> dict:
        v1, v2 = batch["views"]
        features = self.backbone(v1)
        with torch.no_grad():
            target = self.teacher(v2)
        loss = F.mse_loss(F.normalize(self.head(features), dim=1), F.normalize(target, dim=1))
        return {"loss": loss, "features": features, "labels": batch["label"]}

    def prepare_step(self, index: int, total_steps: int) -> None:
        self.momentum = teacher_momentum(self.base_momentum, index + 1, total_steps)

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.Sequential(self.backbone, self.head), self.momentum)

    def metrics(self) -> dict[str, torch.Tensor]:
        # What the trainer did to the BatchNorms, for the test to read from metrics.jsonl.
        def synced(module):
            return torch.tensor(float(sum(isinstance(m, SyncBatchNorm) for m in module.modules())))

        return {"train/student_sync_bn": synced(self.backbone), "train/teacher_sync_bn": synced(self.teacher)}
