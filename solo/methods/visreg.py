"""VISReg (Wu et al., 2026): LeJEPA's views, invariance and random directions, with SIGReg replaced by three
decoupled terms on each view's global-batch statistics: its mean to 0, each dimension's standard deviation to 1, and
a sliced 2-Wasserstein distance of the standardised embeddings to an isotropic Gaussian."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from solo.losses import visreg_loss
from solo.methods.base import DSEOption, KoLeoOption, register_method
from solo.methods.lejepa import LeJEPA
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, ruled


@dataclass
class VISRegConfig(DSEOption, KoLeoOption):
    name: str = "visreg"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)  # the paper's best (its Table 4); LeJEPA's is 64
    lambd: float = ruled(0.9, PROBABILITY)  # the regulariser's weight (large data); the invariance's is 1 - lambd
    num_slices: int = ruled(2048, AT_LEAST_ONE)  # M, the directions of the shape term, drawn anew every step
    scale_weight: float = ruled(1.0, NON_NEGATIVE)
    shape_weight: float = ruled(1.0, NON_NEGATIVE)
    center_weight: float = ruled(1.0, NON_NEGATIVE)
    eps: float = ruled(1e-4, POSITIVE)  # added to the standard deviation that standardises the shape term's input


@register_method("visreg", schema=VISRegConfig)
class VISReg(LeJEPA):
    augmentations = {"digits": "digits_four_views", "natural": "multicrop_visreg"}
    num_views = 4  # global crops, the centre of the invariance (the paper's appendix A.1)

    def __init__(self, backbone, feature_dim: int, cfg: VISRegConfig):
        super().__init__(backbone, feature_dim, cfg, activation=nn.GELU)  # the paper's projector (its appendix A.1)

    def loss(self, projected: list[torch.Tensor], directions: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        weights = (c.scale_weight, c.shape_weight, c.center_weight)
        return visreg_loss(projected, directions, c.lambd, self.num_views, weights, c.eps)
