"""DirectCLR (Jing et al., 2022): no projector; InfoNCE on the first `method.d0` dimensions of the backbone's
representation, against the other view of every sample of the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.errors import ConfigError
from solo.losses import directclr_loss
from solo.methods.base import DSEOption, KoLeoOption, TwoViewMethod, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled


@dataclass
class DirectCLRConfig(DSEOption, KoLeoOption):
    name: str = "directclr"
    d0: int = ruled(360, AT_LEAST_ONE)  # the leading dimensions the loss reads (the paper: 360 of ResNet-50's 2048)
    temperature: float = ruled(0.1, POSITIVE)


class LeadingDimensions(nn.Module):
    """x -> its first `d0` columns."""

    def __init__(self, d0: int):
        super().__init__()
        self.d0 = d0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : self.d0]


@register_method("directclr", schema=DirectCLRConfig)
class DirectCLR(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: DirectCLRConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        if cfg.d0 > feature_dim:
            raise ConfigError(
                f"method.d0={cfg.d0}: more than the backbone's {feature_dim} features; give method.d0 <= {feature_dim}"
            )
        # No projector: the loss reads the representation's first d0 dimensions. As `projector`, that slice is also
        # what the health metrics take for the embedding the loss sees.
        self.projector = LeadingDimensions(cfg.d0)
        self.d0, self.temperature = cfg.d0, cfg.temperature

    def loss(self, z1, z2):
        return directclr_loss(z1, z2, self.d0, self.temperature)
