"""VCReg (Zhu, Evtimova, Chen, Shwartz-Ziv and LeCun, 2024, "Variance-Covariance Regularization Improves
Representation Learning"): supervised training whose every block's output is kept high in variance and low in
covariance, so that the features transfer beyond the labels they were trained on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones import blocks_of, pooled_and_block_outputs, watch_blocks
from solo.errors import ConfigError
from solo.losses import vcreg_loss
from solo.methods.base import register_method
from solo.methods.supervised import Supervised, SupervisedConfig
from solo.schema import NON_NEGATIVE, ruled


@dataclass
class VCRegConfig(SupervisedConfig):
    name: str = "vcreg"
    var_weight: float = ruled(0.16, NON_NEGATIVE)  # alpha: each block's hinge on its features' standard deviations
    cov_weight: float = ruled(0.01, NON_NEGATIVE)  # beta: each block's mean squared off-diagonal covariance


def block_rows(output: torch.Tensor) -> torch.Tensor:
    """A block's output as (rows, features): a ViT's tokens (B, T, C) and a CNN's positions (B, C, H, W) are rows."""
    return output.flatten(0, 1) if output.dim() == 3 else output.flatten(2).transpose(1, 2).flatten(0, 1)


@register_method("vcreg", schema=VCRegConfig)
class VCReg(Supervised):
    """Cross-entropy of a linear head on one view, plus, for each of the backbone's blocks (solo.backbones.blocks_of:
    a ViT's blocks, a ResNet's four stages), vcreg_loss of its output, every token or position a row, with the global
    batch's statistics. Validated by its own head, as method=supervised."""

    def __init__(self, backbone, feature_dim: int, cfg: VCRegConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.blocks = blocks_of(backbone)
        if not self.blocks:
            raise ConfigError(
                f"method=vcreg regularises each block's output, and {type(backbone).__name__} has no blocks that "
                "solo.backbones.blocks_of finds: pick a ViT or a ResNet"
            )
        watch_blocks(self.blocks)
        self.var_weight, self.cov_weight = cfg.var_weight, cfg.cov_weight

    def encode(self, batch: dict) -> dict:
        features, outputs = pooled_and_block_outputs(self.backbone, batch["views"][0], self.blocks)
        last = outputs[-1].shape[1 if outputs[-1].dim() == 4 else -1]
        if last != self.feature_dim:  # e.g. a Swin's channels-last stages: their last axis is the features
            raise ConfigError(
                f"method=vcreg reads a block's features on axis 1 of a 4-D output (B, C, H, W) and the last axis of a "
                f"3-D one; {type(self.backbone).__name__}'s last block gives {tuple(outputs[-1].shape)} for "
                f"{self.feature_dim} features: pick a ViT or a ResNet"
            )
        return {"features": features, "blocks": outputs}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        out = super().batch_loss(encoded, batch)
        regulariser = sum(vcreg_loss(block_rows(o), self.var_weight, self.cov_weight) for o in encoded["blocks"])
        return out | {"loss": out["loss"] + regulariser}
