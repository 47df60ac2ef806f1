"""FroSSL (Skean et al., 2024): the two views' embeddings pulled together by their squared error, and the log of the
Frobenius norm of each view's covariance over the global batch pushed down, which spreads its eigenvalues."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import frossl_loss
from solo.methods.base import ExpanderConfig, ExpanderMethod, register_method
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, ruled


@dataclass
class FroSSLConfig(ExpanderConfig):
    name: str = "frossl"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(1024, AT_LEAST_ONE)
    invariance_weight: float = ruled(1.0, NON_NEGATIVE)  # the mean squared error's weight


@register_method("frossl", schema=FroSSLConfig)
class FroSSL(ExpanderMethod):
    # VICReg's views, which the authors' ImageNet recipes take (BYOL's asymmetric ones, as solo's VICReg)
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: FroSSLConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.invariance_weight = cfg.invariance_weight

    def loss(self, z1, z2):
        return frossl_loss(z1, z2, self.invariance_weight)
