"""Supervised training of the backbone and a linear head on the labels: main_linear.py's fine-tuning (MAE's and
DINO's full fine-tuning protocol) runs it through the pretraining trainer, and it is the supervised baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from solo.errors import ConfigError
from solo.losses import supervised_loss
from solo.methods.base import Method, register_method
from solo.schema import NON_NEGATIVE, ruled


@dataclass
class SupervisedConfig:
    name: str = "supervised"
    # 0: the train split's classes (the trainer sets it from the data; main_linear.py's fine-tuning does too)
    num_classes: int = ruled(0, NON_NEGATIVE)


@register_method("supervised", schema=SupervisedConfig)
class Supervised(Method):
    """Cross-entropy of a linear head on one view, averaged over the global batch (solo.losses.supervised_loss).
    Validated by its own head: `val/acc1`, `val/acc5`."""

    augmentations = {"digits": "supervised_digits", "natural": "supervised"}

    num_views = 1
    needs_labels = True

    def __init__(self, backbone, feature_dim: int, cfg: SupervisedConfig):
        super().__init__(backbone, feature_dim)
        if cfg.num_classes < 1:  # 0 is resolved by the trainer, from the data, before the method is built
            raise ConfigError(f"method.num_classes={cfg.num_classes}: the head needs the number of classes")
        self.head = nn.Linear(feature_dim, cfg.num_classes)

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        if not dataset.images:
            raise ConfigError(
                f"method={cls.name} trains on labelled images; data={dataset.name} holds image-text pairs only"
            )
        super().check_data(view_sizes, dataset)

    def encode(self, batch: dict) -> dict:
        return {"features": self.backbone(batch["views"][0])}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features, labels = encoded["features"], batch["label"]
        return {"loss": supervised_loss(self.head(features), labels), "features": features, "labels": labels}

    def classifier(self, probe):
        return self.head
