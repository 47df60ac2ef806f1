"""MACL (Huang et al., 2023): SimCLR's views, projector and negatives, with a temperature that grows with the global
batch's alignment and each anchor's loss reweighted by 1 / (1 - P(positive)) (`solo.losses.macl_loss`); optionally
CO2's consistency term (Wei et al., 2021) with the global batch's other samples as the negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.errors import ConfigError
from solo.losses import macl_loss
from solo.methods.base import CO2Option, DSEOption, KoLeoOption, TwoViewMethod, co2_term, mlp, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled


@dataclass
class MACLConfig(CO2Option, DSEOption, KoLeoOption):
    name: str = "macl"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)  # t0, the temperature at alignment a0
    alpha: float = ruled(0.5, PROBABILITY)  # how fast the temperature follows the alignment
    a0: float = ruled(0.0, PROBABILITY)  # the alignment at which the temperature is t0


@register_method("macl", schema=MACLConfig)
class MACL(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: MACLConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.cfg = cfg

    @classmethod
    def check_config(cls, cfg) -> None:
        alpha, a0 = cfg.method.alpha, cfg.method.a0
        # The temperature at the lowest alignment, -1, is t0 * (1 - alpha * (1 + a0)); the authors' code (alpha 1,
        # a0 0) reaches 0 only there.
        if alpha * (1 + a0) > 1:
            raise ConfigError(
                f"method.alpha={alpha} with method.a0={a0}: the temperature t0 * (1 + alpha * (A - a0)) goes below 0 "
                "for alignments A near -1; keep alpha * (1 + a0) at most 1 (lightly's defaults: alpha 0.5, a0 0)"
            )

    def loss(self, z1, z2):
        c = self.cfg
        loss = macl_loss(z1, z2, c.temperature, c.alpha, c.a0)
        return loss + co2_term(z1, z2, c) if c.co2_weight else loss
