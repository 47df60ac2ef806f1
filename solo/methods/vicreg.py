"""VICReg (Bardes, Ponce and LeCun, 2022): invariance, variance and covariance terms on two views' embeddings."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import vicreg_loss
from solo.methods.base import ExpanderConfig, ExpanderMethod, register_method
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, ruled


@dataclass
class VICRegConfig(ExpanderConfig):
    name: str = "vicreg"
    proj_hidden_dim: int = ruled(8192, AT_LEAST_ONE)
    proj_output_dim: int = ruled(8192, AT_LEAST_ONE)
    sim_coeff: float = ruled(25.0, NON_NEGATIVE)
    std_coeff: float = ruled(25.0, NON_NEGATIVE)
    cov_coeff: float = ruled(1.0, NON_NEGATIVE)


@register_method("vicreg", schema=VICRegConfig)
class VICReg(ExpanderMethod):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: VICRegConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.coeffs = (cfg.sim_coeff, cfg.std_coeff, cfg.cov_coeff)

    def loss(self, z1, z2):
        return vicreg_loss(z1, z2, *self.coeffs)
