"""Alignment and uniformity (Wang and Isola, 2020): the two views of a sample pulled together on the hypersphere, and
the embeddings of the global batch spread over it."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import align_uniform_loss
from solo.methods.base import DSEOption, KoLeoOption, TwoViewMethod, mlp, register_method
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ruled


@dataclass
class AlignUniformConfig(DSEOption, KoLeoOption):
    name: str = "align_uniform"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    align_alpha: float = ruled(2.0, POSITIVE)  # the alignment's power: the mean of ||u1 - u2||^alpha
    uniform_t: float = ruled(2.0, POSITIVE)  # the uniformity's potential: exp(-t ||u_i - u_j||^2)
    lambd: float = ruled(1.0, NON_NEGATIVE)  # the uniformity's weight


@register_method("align_uniform", schema=AlignUniformConfig)
class AlignUniform(TwoViewMethod):
    def __init__(self, backbone, feature_dim: int, cfg: AlignUniformConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.cfg = cfg

    def loss(self, z1, z2):
        c = self.cfg
        return align_uniform_loss(z1, z2, c.align_alpha, c.uniform_t, c.lambd)
