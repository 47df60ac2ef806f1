"""Franca (Venkataramanan, Pariza, Salehi et al., 2025, "Franca: Nested Matryoshka Clustering for Scalable Visual
Representation Learning"): DINOv2 with nested heads. The class token and the masked patches are clustered at several
granularities at once: the levels read the first D, D / 2, D / 4, ... features of the token (Matryoshka
representation learning), each with a head and prototypes of its own, fewer for the coarser levels; each level's DINO and iBOT losses are summed.
Each masked crop hides all but one rolled rectangle of its patches (CAPI's inverse block masks).

Read from valeoai/Franca: the head (franca/layers/mrl_dino_head.py), the losses (franca/loss/mrl_dino_loss.py,
mrl_ibot_patch_loss.py), the masks (franca/data/masking.py) and the ViT-B/14 recipe (franca/configs/train/IN21K/
vitb14.yaml). RASA, Franca's post-training that removes the patch tokens' positional directions, is a separate stage
and not offered here (docs/methods/franca.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import grid_shape
from solo.data.views.masks import BlockMask
from solo.errors import ConfigError
from solo.methods.base import register_method
from solo.methods.dino import init_head_layers
from solo.methods.dinov2 import Centering, DINOv2, DINOv2Config
from solo.schema import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, PROBABILITY, ruled


@dataclass
class FrancaConfig(DINOv2Config):
    """DINOv2's keys at Franca's ViT-B/14 defaults, and the nesting levels."""

    name: str = "franca"
    bottleneck_dim: int = ruled(384, AT_LEAST_ONE)  # dino.head_bottleneck_dim
    num_prototypes: int = ruled(131072, AT_LEAST_ONE)  # the finest level's; level l has num_prototypes / 2^l
    # 0: the patches share the class token's heads; N: the patches take heads of their own, N prototypes at the finest
    # level (Franca's ibot.separate_head, whole heads, not DINOv2's last layer of their own)
    patch_prototypes: int = ruled(131072, NON_NEGATIVE)
    nesting_levels: int = ruled(5, AT_LEAST_ONE)  # the official nesting list: D / 16, D / 8, D / 4, D / 2 and D
    centering: Centering = Centering("sinkhorn_knopp")
    mask_ratio_max: float = ruled(0.65, FRACTION)  # ibot.mask_ratio_min_max (0.1, 0.65)
    base_momentum: float = ruled(0.994, PROBABILITY)  # teacher.momentum_teacher of the ViT-B/14 recipe


class NestedLevel(nn.Module):
    """One level of Franca's head: a square linear layer on the level's leading features, an MLP of three layers each
    followed by GELU (and BatchNorm before it, with `use_bn`), then the prototypes. As the official MRLDINOHead, the
    bottleneck is not L2-normalised (DINOv2's head normalises it); the prototypes keep unit norm, as solo's DINOv2."""

    def __init__(self, in_dim: int, hidden_dim: int, bottleneck_dim: int, out_dim: int, use_bn: bool):
        super().__init__()
        self.in_dim = in_dim
        layers: list[nn.Module] = [nn.Linear(in_dim, in_dim)]
        for width_in, width_out in ((in_dim, hidden_dim), (hidden_dim, hidden_dim), (hidden_dim, bottleneck_dim)):
            layers += [
                nn.Linear(width_in, width_out),
                nn.BatchNorm1d(width_out) if use_bn else nn.Identity(),
                nn.GELU(),
            ]
        self.mlp = nn.Sequential(*layers)
        init_head_layers(self.mlp)  # the official initialisation, DINO's
        self.last_layer = nn.Linear(bottleneck_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.mlp(x[..., : self.in_dim]), F.normalize(self.last_layer.weight, dim=1))


class MatryoshkaHead(nn.Module):
    """Franca's head: a NestedLevel per nesting level, coarsest first, reading the first in_dim / 2^(levels - 1), ...,
    in_dim / 2, in_dim features, each of `width` features scoring out_dim * width // in_dim prototypes (`out_dims`).
    With `patch_out_dim`, the patch tokens (forward's `patches`) take levels of their own (Franca's
    ibot.separate_head)."""

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        bottleneck_dim: int,
        out_dim: int,
        levels: int,
        use_bn: bool = False,
        patch_out_dim: int = 0,
    ):
        super().__init__()
        widths = [in_dim >> k for k in reversed(range(levels))]  # coarsest first, as the official nesting list

        def heads(prototypes: int) -> nn.ModuleList:
            return nn.ModuleList(
                NestedLevel(w, hidden_dim, bottleneck_dim, prototypes * w // in_dim, use_bn) for w in widths
            )

        self.levels = heads(out_dim)
        self.patch_levels = heads(patch_out_dim) if patch_out_dim else None
        self.out_dims = [level.last_layer.out_features for level in self.levels]
        self.patch_out_dims = [level.last_layer.out_features for level in (self.patch_levels or self.levels)]

    def forward(self, x: torch.Tensor, patches: bool = False) -> list[torch.Tensor]:
        """Each level's scores of the rows of `x`, coarsest first (a flag of forward, not a method of its own: FSDP
        gathers a unit's parameters around its forward only)."""
        levels = self.patch_levels if patches and self.patch_levels is not None else self.levels
        return [level(x) for level in levels]

    def last_layers(self) -> list[nn.Parameter]:
        """The prototypes' weights, which the first epochs keep frozen."""
        return [level.last_layer.weight for level in [*self.levels, *(self.patch_levels or [])]]


@register_method("franca", schema=FrancaConfig)
class Franca(DINOv2):
    """DINOv2 (solo.methods.dinov2) with Franca's nested heads and masks: the DINO loss of the class tokens and the
    iBOT loss of the masked patches at every level, each level's targets its own (Sinkhorn-Knopp over the global batch,
    or DINO's centring with a centre per level), the levels' losses summed unweighted; KoLeo on the backbone's global
    class tokens. Every statistic is over the global batch."""

    augmentations = {"digits": "digits_mild", "natural": "multicrop_dinov2"}

    def build_head(self, feature_dim: int, cfg: FrancaConfig) -> nn.Module:
        levels, coarsest = cfg.nesting_levels, feature_dim >> (cfg.nesting_levels - 1)
        if not coarsest:
            raise ConfigError(
                f"method.nesting_levels={levels} halves the backbone's {feature_dim} features {levels - 1} times, to 0: "
                f"use at most {feature_dim.bit_length()} levels"
            )
        fewest = min(filter(None, (cfg.num_prototypes, cfg.patch_prototypes)))
        if fewest * coarsest // feature_dim < 1:
            raise ConfigError(
                f"method.nesting_levels={levels} gives the coarsest level ({coarsest} of the backbone's {feature_dim} "
                f"features) none of {fewest} prototypes: raise method.num_prototypes (method.patch_prototypes) to at "
                f"least {-(-feature_dim // coarsest)}, or lower method.nesting_levels"
            )
        return MatryoshkaHead(
            feature_dim,
            cfg.proj_hidden_dim,
            cfg.bottleneck_dim,
            cfg.num_prototypes,
            cfg.nesting_levels,
            cfg.use_bn_in_head,
            cfg.patch_prototypes,
        )

    def head_levels(self, head: nn.Module, x: torch.Tensor, patches: bool = False) -> list[torch.Tensor]:
        return head(x, patches=patches)

    def mask_generator(self) -> BlockMask:
        c = self.cfg
        return BlockMask(
            grid_shape(self.backbone),
            self.num_views,
            c.mask_probability,
            c.mask_ratio_min,
            c.mask_ratio_max,
            rolled_inverse=True,
        )
