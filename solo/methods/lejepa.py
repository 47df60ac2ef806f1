"""LeJEPA (Balestriero and LeCun, 2025): every view's embedding pulled to the mean of the global views', and SIGReg, a
test of the embeddings against an isotropic Gaussian along random directions; no teacher, stop-gradient or predictor."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from solo.backbones.stochastic import step_uniforms
from solo.losses import lejepa_loss, random_directions
from solo.methods.base import DSEOption, KoLeoOption, Method, encode_views, mlp, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, Rule, ruled

# The stream of draws that the directions come from, keyed with the run's seed and the step.
DIRECTIONS = "lejepa.directions"
AT_LEAST_TWO = Rule("must be >= 2", lambda v: v >= 2)


@dataclass
class LeJEPAConfig(DSEOption, KoLeoOption):
    name: str = "lejepa"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(512, AT_LEAST_ONE)
    lambd: float = ruled(0.05, PROBABILITY)  # SIGReg's weight; the invariance's is 1 - lambd
    num_slices: int = ruled(1024, AT_LEAST_ONE)  # M, the random directions SIGReg tests along, drawn anew every step
    t_max: float = ruled(3.0, POSITIVE)  # the Epps-Pulley integral over t in [-t_max, t_max] ...
    num_points: int = ruled(17, AT_LEAST_TWO)  # ... by the trapezoid rule, its nodes on [0, t_max]


@register_method("lejepa", schema=LeJEPAConfig)
class LeJEPA(Method):
    augmentations = {"digits": "digits", "natural": "multicrop_lejepa"}
    local_crops = True

    def __init__(self, backbone, feature_dim: int, cfg: LeJEPAConfig, activation: type[nn.Module] = nn.ReLU):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.cfg = cfg
        h = cfg.proj_hidden_dim
        self.projector = mlp([feature_dim, h, h, cfg.proj_output_dim], activation=activation)
        self.draws = None  # the trainer's (solo.backbones.stochastic.Draws.attach): the directions of each step

    def directions(self, like: torch.Tensor) -> torch.Tensor:
        """This step's directions: a function of (run seed, step) alone, the same on every rank at any world size,
        hashed on the device (solo.backbones.stochastic.step_uniforms), so nothing to keep in the checkpoint; a
        forward outside the trainer's step draws them from torch's generator."""
        dtype = torch.float64 if like.dtype == torch.float64 else torch.float32  # as the loss computes
        uniforms = step_uniforms(self, DIRECTIONS)
        return random_directions(like.shape[1], self.cfg.num_slices, uniforms, like.device, dtype)

    def loss(self, projected: list[torch.Tensor], directions: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return lejepa_loss(projected, directions, c.lambd, self.num_views, c.t_max, c.num_points)

    def encode(self, batch: dict) -> dict:
        # The reference runs every view through the backbone in one call: the views of one size share BatchNorm's
        # statistics.
        return self.encode_backbone(batch["views"], per_view_statistics=False)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        projected = encode_views(
            self.projector, features, per_view_statistics=False
        )  # every view at once, as the reference
        loss = self.loss(projected, self.directions(projected[0]))
        return self.view_outputs(loss, features[: self.num_views], batch, encoded.get("dense"))
