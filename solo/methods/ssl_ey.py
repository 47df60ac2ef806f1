"""SSL-EY (Chapman et al., 2023): CCA of the two views' embeddings through its Eckhart-Young objective, the
cross-covariance pushed up and the summed auto-covariances held by their squared Frobenius norm, over the global
batch; no teacher, predictor or negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import ssl_ey_loss
from solo.methods.base import ExpanderConfig, ExpanderMethod, register_method
from solo.schema import AT_LEAST_ONE, ruled


@dataclass
class SSLEYConfig(ExpanderConfig):
    name: str = "ssl_ey"
    proj_hidden_dim: int = ruled(8192, AT_LEAST_ONE)
    proj_output_dim: int = ruled(8192, AT_LEAST_ONE)


@register_method("ssl_ey", schema=SSLEYConfig)
class SSLEY(ExpanderMethod):
    # VICReg's views, as the authors' code (built on VICReg's) takes them
    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def loss(self, z1, z2):
        return ssl_ey_loss(z1, z2)
