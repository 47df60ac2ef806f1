"""A method that needs an entry of its own in its batches, added from this file alone, as a user would: each view's
crop area, a per-view scalar that the data workers compute from the view's crop box, which the method learns to
predict from the view's features. Registered by `imports=[tests.toy_field_method]`, configured by
tests/configs/method/crop_area.yaml; docs/extending.md walks through it."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.data.views.augment import PARAM_INDEX
from solo.data.views.batch_spec import BatchSpec
from solo.distributed import batch_sizes, world_size
from solo.methods import Method, register_method
from solo.methods.base import encode_views


@dataclass(frozen=True)
class CropArea:
    """Each view's crop as a share of its image's area, (V,) float32: the batch carries it as `crop_area`, (B, V)."""

    name: str = "crop_area"

    def __call__(self, params: torch.Tensor, height: int, width: int, rng: random.Random) -> torch.Tensor:
        return (params[:, PARAM_INDEX["height"]] * params[:, PARAM_INDEX["width"]] / (height * width)).float()


@dataclass
class CropAreaConfig:
    name: str = "crop_area"


@register_method("crop_area", schema=CropAreaConfig)
class CropAreaRegression(Method):
    """The squared error of each view's predicted crop area, the mean over the global batch's views."""

    def __init__(self, backbone, feature_dim: int, cfg: CropAreaConfig):
        super().__init__(backbone, feature_dim)
        self.head = nn.Linear(feature_dim, 1)

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(fields=(CropArea(),))

    def encode(self, batch: dict) -> dict:
        return {"features": encode_views(self.backbone, batch["views"])}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        predicted = torch.cat([self.head(f) for f in features], dim=1)  # (B, V)
        error = (predicted - batch["crop_area"].to(predicted.dtype)).square().sum()
        # solo's convention: each rank returns W / (global count) times its sum, so that DDP's mean is the global mean.
        count = sum(batch_sizes(len(predicted), predicted.device)) * predicted.shape[1]
        return {
            "loss": error * (world_size() / count),
            "features": torch.cat(features),
            "labels": batch["label"].repeat(len(features)),
        }


@register_method("crop_area_local_mean", schema=CropAreaConfig)
class CropAreaLocalMean(CropAreaRegression):
    """The known-wrong variant, for tests: each rank's mean of its own views' errors, which DDP's mean of the ranks'
    gradients turns into the global mean only when every rank holds as many samples."""

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        out = super().batch_loss(encoded, batch)
        count = sum(batch_sizes(len(batch["label"]), batch["label"].device)) / world_size()
        out["loss"] = out["loss"] * count / len(batch["label"])
        return out
