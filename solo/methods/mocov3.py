"""MoCo v3 (Chen, Xie and He, 2021): InfoNCE between the student's predictions and a momentum teacher's keys;
optionally CO2's consistency term (Wei et al., 2021) with the global batch's other keys as the negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import co2_batch_loss, mocov3_loss
from solo.methods.base import CO2Option, DSEOption, KoLeoOption, MomentumTwoViewMethod, mlp, register_method
from solo.schema import AT_LEAST_ONE, POSITIVE, PROBABILITY, ruled


@dataclass
class MoCoV3Config(CO2Option, DSEOption, KoLeoOption):
    name: str = "mocov3"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    pred_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    temperature: float = ruled(1.0, POSITIVE)  # MoCo v3: 1.0 for ResNet-50, 0.2 for ViTs
    base_momentum: float = ruled(0.99, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)


@register_method("mocov3", schema=MoCoV3Config)
class MoCoV3(MomentumTwoViewMethod):
    augmentations = {"digits": "digits", "natural": "mocov3"}

    def __init__(self, backbone, feature_dim: int, cfg: MoCoV3Config):
        # MoCo v3's ViT heads: a 3-layer projector and a 2-layer predictor, both ending in BatchNorm without affine
        # (its ResNet code uses a 2-layer projector and no last BatchNorm in the predictor).
        h, d = cfg.proj_hidden_dim, cfg.proj_output_dim
        projector = mlp([feature_dim, h, h, d], last_bn=True)
        predictor = mlp([d, cfg.pred_hidden_dim, d], last_bn=True)
        super().__init__(backbone, feature_dim, projector, predictor, cfg.base_momentum, cfg.final_momentum)
        self.take_regularisers(cfg)
        self.temperature = cfg.temperature
        self.co2_weight, self.co2_temperature = cfg.co2_weight, cfg.co2_temperature

    def loss(self, prediction, target):
        loss = mocov3_loss(prediction, target, self.temperature)
        if self.co2_weight:  # per direction: the two directions' mean, weighted, as MoCo v2+'s
            loss = loss + self.co2_weight * co2_batch_loss(prediction, target, self.co2_temperature) / 2
        return loss
