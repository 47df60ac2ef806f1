"""SimSiam (Chen and He, 2021): each view's prediction regresses onto the other view's projection, which takes no
gradient; no teacher, no negatives. The predictor's learning rate stays at the base rate, not decayed (the paper's
section 4.3: it works better, as the predictor keeps adapting to the latest representations)."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import simsiam_loss
from solo.methods.base import DSEOption, KoLeoOption, SiameseMethod, mlp, register_method, with_group_settings
from solo.schema import AT_LEAST_ONE, ruled


@dataclass
class SimSiamConfig(DSEOption, KoLeoOption):
    name: str = "simsiam"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(2048, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(512, AT_LEAST_ONE)  # the paper's bottleneck: a quarter of the output


def simsiam_heads(feature_dim: int, cfg) -> tuple:
    """SimSiam's projector (3 layers, BatchNorm on the output) and bottleneck predictor (2 layers)."""
    h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
    return mlp([feature_dim, h, h, d], last_bn=True), mlp([d, cfg.pred_hidden_dim, d])


@register_method("simsiam", schema=SimSiamConfig)
class SimSiam(SiameseMethod):
    def __init__(self, backbone, feature_dim: int, cfg: SimSiamConfig):
        super().__init__(backbone, feature_dim, *simsiam_heads(feature_dim, cfg))
        self.take_regularisers(cfg)

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, self.predictor.parameters(), static_lr=True)

    def pair_loss(self, p1, p2, z1, z2):
        return (simsiam_loss(p1, z2) + simsiam_loss(p2, z1)) / 2
