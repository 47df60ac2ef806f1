"""Franca (Venkataramanan, Pariza, Salehi et al., 2025, "Franca: Nested Matryoshka Clustering for Scalable Visual
Representation Learning"): DINOv2 with nested heads. The class token and the masked patches are clustered at several
granularities at once: the levels read the first D, D / 2, D / 4, ... features of the token (Matryoshka
representation learning), each with a head and prototypes of its own, fewer for the coarser levels; each level's DINO and iBOT losses are summed.
Each masked crop hides all but one rolled rectangle of its patches (CAPI's inverse block masks).

Read from valeoai/Franca: the head (franca/layers/mrl_dino_head.py), the losses (franca/loss/mrl_dino_loss.py,
mrl_ibot_patch_loss.py), the masks (franca/data/masking.py) and the ViT-B/14 recipe (franca/configs/train/IN21K/
vitb14.yaml). RASA, Franca's post-training that removes the patch tokens' positional directions, is a method of its
own (solo/methods/rasa.py)."""

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
    # each level's bottleneck L2-normalised before its prototypes, as DINOv2's head (the official Franca head: not)
    normalize_bottleneck: bool = False
    centering: Centering = Centering("sinkhorn_knopp")
    mask_ratio_max: float = ruled(0.65, FRACTION)  # ibot.mask_ratio_min_max (0.1, 0.65)
    base_momentum: float = ruled(0.994, PROBABILITY)  # teacher.momentum_teacher of the ViT-B/14 recipe


class LevelsLinear(nn.Module):
    """A linear layer of each level's MLP, the levels side by side: (N, levels x in_dim) -> (N, levels x out_dim) in
    one batched product, level l's columns through its own (out_dim, in_dim) weight. The biases are one vector, as a
    linear layer's: the optimizers' rule keeps vectors out of weight decay."""

    def __init__(self, levels: int, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(levels, out_dim, in_dim))
        self.bias = nn.Parameter(torch.zeros(levels * out_dim))
        nn.init.trunc_normal_(self.weight, std=0.02)  # DINO's initialisation, as init_head_layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels, out_dim, in_dim = self.weight.shape
        by_level = x.view(len(x), levels, in_dim).transpose(0, 1)  # (levels, N, in_dim)
        y = torch.baddbmm(self.bias.view(levels, 1, out_dim), by_level, self.weight.transpose(1, 2))
        return y.transpose(0, 1).reshape(len(x), levels * out_dim)


class NestedLevels(nn.Module):
    """Franca's levels, as the official MRLDINOHead: level l reads the first widths[l] features through a square
    linear layer, then an MLP of three linear layers each followed by GELU (and BatchNorm before it, with `use_bn`),
    then its out_dims[l] prototypes. As the official head, the bottleneck is not L2-normalised, unless `normalize`
    (DINOv2's head: the digits default); the prototypes keep unit norm, as solo's DINOv2. From the MLP's first
    BatchNorm on the levels run side by side: one BatchNorm over every level's channels (per channel, so each level's
    statistics its own) and one batched product per linear layer, instead of one of each per level (a level's layers
    are launches)."""

    def __init__(
        self,
        widths: list[int],
        hidden_dim: int,
        bottleneck_dim: int,
        out_dims: list[int],
        use_bn: bool,
        normalize: bool = False,
    ):
        super().__init__()
        levels = len(widths)
        self.widths, self.normalize = widths, normalize
        self.projections = nn.ModuleList(nn.Linear(w, w) for w in widths)
        self.inputs = nn.ModuleList(nn.Linear(w, hidden_dim) for w in widths)
        init_head_layers([*self.projections, *self.inputs])  # the official initialisation, DINO's
        self.hidden = LevelsLinear(levels, hidden_dim, hidden_dim)
        self.bottleneck = LevelsLinear(levels, hidden_dim, bottleneck_dim)
        self.norms = nn.ModuleList(
            nn.BatchNorm1d(levels * width) if use_bn else nn.Identity()
            for width in (hidden_dim, hidden_dim, bottleneck_dim)
        )
        self.last_layers = nn.ModuleList(nn.Linear(bottleneck_dim, k, bias=False) for k in out_dims)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = torch.cat([inp(proj(x[:, :w])) for w, proj, inp in zip(self.widths, self.projections, self.inputs)], 1)
        h = F.gelu(self.norms[0](h))
        h = F.gelu(self.norms[1](self.hidden(h)))
        h = F.gelu(self.norms[2](self.bottleneck(h)))
        if self.normalize:
            h = F.normalize(h.unflatten(1, (len(self.widths), -1)), dim=-1).flatten(1)
        return [
            F.linear(level, F.normalize(last.weight, dim=1))
            for level, last in zip(h.chunk(len(self.widths), dim=1), self.last_layers)
        ]


class MatryoshkaHead(nn.Module):
    """Franca's head: NestedLevels, coarsest first, reading the first in_dim / 2^(levels - 1), ..., in_dim / 2, in_dim
    features, each of `width` features scoring out_dim * width // in_dim prototypes (`out_dims`). With
    `patch_out_dim`, the patch tokens (forward's `patches`) take levels of their own (Franca's ibot.separate_head)."""

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        bottleneck_dim: int,
        out_dim: int,
        levels: int,
        use_bn: bool = False,
        patch_out_dim: int = 0,
        normalize: bool = False,
    ):
        super().__init__()
        widths = [in_dim >> k for k in reversed(range(levels))]  # coarsest first, as the official nesting list

        def nested(prototypes: int) -> NestedLevels:
            out_dims = [prototypes * w // in_dim for w in widths]
            return NestedLevels(widths, hidden_dim, bottleneck_dim, out_dims, use_bn, normalize)

        self.levels = nested(out_dim)
        self.patch_levels = nested(patch_out_dim) if patch_out_dim else None
        self.out_dims = [last.out_features for last in self.levels.last_layers]
        self.patch_out_dims = [last.out_features for last in (self.patch_levels or self.levels).last_layers]

    def forward(self, x: torch.Tensor, patches: bool = False) -> list[torch.Tensor]:
        """Each level's scores of the rows of `x`, coarsest first (a flag of forward, not a method of its own: FSDP
        gathers a unit's parameters around its forward only)."""
        return (self.patch_levels if patches and self.patch_levels is not None else self.levels)(x)

    def last_layers(self) -> list[nn.Parameter]:
        """The prototypes' weights, which the first epochs keep frozen."""
        return [
            last.weight
            for levels in (self.levels, self.patch_levels)
            if levels is not None
            for last in levels.last_layers
        ]


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
            cfg.normalize_bottleneck,
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
