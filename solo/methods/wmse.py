"""W-MSE (Ermolov et al., 2021): the two views' embeddings whitened over sub-batches of the global batch, then
pulled together; whitening, not negatives, keeps them from collapsing."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from solo.distributed.env import detect
from solo.errors import ConfigError
from solo.losses import wmse_loss
from solo.methods.base import DSEOption, KoLeoOption, TwoViewMethod, register_method
from solo.schema import AT_LEAST_ONE, PROBABILITY, ruled


@dataclass
class WMSEConfig(DSEOption, KoLeoOption):
    name: str = "wmse"
    proj_hidden_dim: int = ruled(1024, AT_LEAST_ONE)
    proj_output_dim: int = ruled(64, AT_LEAST_ONE)
    whitening_size: int = ruled(128, AT_LEAST_ONE)  # samples per whitened sub-batch; divides the global batch
    whitening_eps: float = ruled(0.0, PROBABILITY)  # shrinks each covariance towards the identity


@register_method("wmse", schema=WMSEConfig)
class WMSE(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: WMSEConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        h = cfg.proj_hidden_dim
        self.projector = nn.Sequential(
            nn.Linear(feature_dim, h), nn.BatchNorm1d(h), nn.ReLU(inplace=True), nn.Linear(h, cfg.proj_output_dim)
        )
        self.whitening_size, self.eps = cfg.whitening_size, cfg.whitening_eps

    @classmethod
    def check_config(cls, cfg) -> None:
        m, global_batch = cfg.method, cfg.data.batch_size * detect().world_size
        if global_batch % m.whitening_size or m.whitening_size <= m.proj_output_dim:
            raise ConfigError(
                f"method.whitening_size={m.whitening_size}: W-MSE whitens sub-batches of that many samples of "
                f"the global batch ({global_batch}), so it must divide it, and must exceed "
                f"method.proj_output_dim={m.proj_output_dim} for the covariance to be invertible"
            )

    def loss(self, z1, z2):
        return wmse_loss(z1, z2, self.whitening_size, self.eps)
