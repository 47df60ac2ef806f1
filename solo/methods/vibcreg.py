"""VIbCReg (Lee and Aune, 2021): VICReg with a whitened projector output (IterNorm) and a normalised covariance term."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from solo.errors import ConfigError
from solo.losses import vibcreg_loss
from solo.methods.base import DSEOption, KoLeoOption, TwoViewMethod, register_method
from solo.methods.whitening import IterNorm
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, ruled


@dataclass
class VIbCRegConfig(DSEOption, KoLeoOption):
    name: str = "vibcreg"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(2048, AT_LEAST_ONE)
    iternorm_groups: int = ruled(64, AT_LEAST_ONE)  # IterNorm's groups; the output width must be a multiple
    sim_coeff: float = ruled(25.0, NON_NEGATIVE)
    std_coeff: float = ruled(25.0, NON_NEGATIVE)
    cov_coeff: float = ruled(200.0, NON_NEGATIVE)


@register_method("vibcreg", schema=VIbCRegConfig)
class VIbCReg(TwoViewMethod):
    # BYOL's asymmetric views (Barlow Twins reuses them)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: VIbCRegConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        self.projector = nn.Sequential(
            nn.Linear(feature_dim, h),
            nn.BatchNorm1d(h),
            nn.GELU(),
            nn.Linear(h, h),
            nn.BatchNorm1d(h),
            nn.GELU(),
            nn.Linear(h, d),
            IterNorm(d, num_groups=cfg.iternorm_groups),
        )
        self.coeffs = cfg.sim_coeff, cfg.std_coeff, cfg.cov_coeff

    @classmethod
    def check_config(cls, cfg) -> None:
        m = cfg.method
        if m.proj_output_dim % m.iternorm_groups:
            raise ConfigError(
                f"method.proj_output_dim={m.proj_output_dim} is not a multiple of method.iternorm_groups="
                f"{m.iternorm_groups}: IterNorm whitens the output in groups of equal width"
            )

    def loss(self, z1, z2):
        return vibcreg_loss(z1, z2, *self.coeffs)
