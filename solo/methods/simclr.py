"""SimCLR (Chen et al., 2020): two views, MLP projector, NT-Xent over the global batch; optionally CO2's consistency
term (Wei et al., 2021) with the global batch's other samples as the negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import nt_xent_loss
from solo.losses.tiled import config_tile
from solo.methods.base import CO2Option, DSEOption, KoLeoOption, TwoViewMethod, co2_term, mlp, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, TILE, ruled


@dataclass
class SimCLRConfig(CO2Option, DSEOption, KoLeoOption):
    name: str = "simclr"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    temperature: float = ruled(0.2, POSITIVE)
    loss_tile: str = ruled("none", TILE)  # none | auto | candidates per tile: NT-Xent in memory B_local x tile


@register_method("simclr", schema=SimCLRConfig)
class SimCLR(TwoViewMethod):
    per_view_statistics = False  # the official code runs both views through the model in one call

    def __init__(self, backbone, feature_dim: int, cfg: SimCLRConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.temperature = cfg.temperature
        self.tile = config_tile(cfg.loss_tile)
        self.cfg = cfg

    def loss(self, z1, z2):
        loss = nt_xent_loss(z1, z2, self.temperature, tile=self.tile)
        if self.cfg.co2_weight:  # each view's projection against the other's, the other as the key (a target)
            loss = loss + co2_term(z1, z2, self.cfg)
        return loss
