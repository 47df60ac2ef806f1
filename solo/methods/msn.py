"""MSN (Assran et al., 2022): a Vision Transformer sees one crop with a share of its patches dropped and a few small
focal crops; each of their class tokens, through a projector, is matched to learnt prototypes and pulled towards the
sharpened, Sinkhorn-balanced prototype probabilities of an EMA teacher's class token on another, whole crop; a
regulariser keeps the mean probability spread over the prototypes. PMSN (Assran et al., 2023) matches that mean to a
power-law prior instead of the uniform one."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn

from solo.backbones.vit import (
    check_vit,
    embed_patches,
    keep,
    num_patches,
    pooled_feature,
    prefix_tokens,
    run_blocks,
)
from solo.data.views.masks import RandomMask
from solo.errors import ConfigError
from solo.losses import msn_loss, power_law_prior
from solo.methods.base import (
    DSEOption,
    Method,
    ema_update,
    encode_views,
    make_teacher,
    register_method,
    with_group_settings,
)
from solo.methods.masked_image import MaskedViT
from solo.schema import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, PROBABILITY, ruled


@dataclass
class MSNConfig(DSEOption):
    name: str = "msn"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    num_prototypes: int = ruled(1024, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)  # of the anchors' and the target's cosines to the prototypes
    sharpen: float = ruled(0.25, POSITIVE)  # the targets' probabilities to the power 1 / sharpen, renormalised
    sinkhorn_iterations: int = ruled(3, NON_NEGATIVE)  # 0: the sharpened targets as they are
    regularisation_weight: float = ruled(1.0, NON_NEGATIVE)  # of the mean-entropy (PMSN: prior-matching) term
    mask_ratio: float = ruled(
        0.15, FRACTION
    )  # the share of the anchor crop's patches dropped (the authors' patch_drop)
    base_momentum: float = ruled(0.996, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (a linear schedule, as the authors')


@dataclass
class PMSNConfig(MSNConfig):
    name: str = "pmsn"
    power_law_exponent: float = ruled(0.25, NON_NEGATIVE)  # prototype k's prior share proportional to k ** -exponent


class Projector(nn.Sequential):
    """The authors' head: Linear, BatchNorm, GELU, Linear, BatchNorm, GELU, Linear; normal weights of std 0.02, zero
    biases."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int):
        super().__init__(
            nn.Linear(in_dim, hidden_dim),
            nn.BatchNorm1d(hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.BatchNorm1d(hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, out_dim),
        )
        for layer in self:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)


@register_method("msn", schema=MSNConfig)
class MSN(MaskedViT, Method):
    """Views: the target crop (the teacher's), the anchor crop of the same size (the student's, masked), then any
    smaller focal crops (the student's, whole). The teacher is an EMA of backbone and projector and scores against the
    student's prototypes, detached. Every term is over the global batch (solo.losses.msn_loss)."""

    augmentations = {"digits": "digits_mild", "natural": "msn"}

    local_crops = True
    teachers = ("teacher",)
    sync_teacher_batchnorm = True  # the teacher projector's BatchNorms see the global batch, as the student's

    def __init__(self, backbone, feature_dim: int, cfg: MSNConfig):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        self.cfg = cfg
        self.visible = num_patches(backbone) - self.mask_generator().hidden
        self.projector = Projector(feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim)
        bound = cfg.proj_output_dim**-0.5  # the authors' initialisation
        self.prototypes = nn.Parameter(torch.empty(cfg.num_prototypes, cfg.proj_output_dim).uniform_(-bound, bound))
        self.teacher = make_teacher(nn.ModuleList([backbone, self.projector]))
        self.momentum = cfg.base_momentum
        self.register_buffer("teacher_momentum", torch.tensor(cfg.base_momentum), persistent=False)
        self.take_regularisers(cfg)

    def mask_generator(self) -> RandomMask:
        return RandomMask(num_patches(self.backbone), self.cfg.mask_ratio)

    def prior(self) -> torch.Tensor | None:
        """The regulariser's target for the mean anchor probability; None: uniform (mean-entropy maximisation)."""
        return None

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, [self.prototypes], weight_decay=0.0, lars_exclude=True)  # the authors'

    def encode(self, batch: dict) -> dict:
        views, vit = batch["views"], self.backbone
        if len(views) > self.num_views and not vit.dynamic_img_size:
            raise ConfigError(
                f"method={self.name} runs the smaller focal crops through the ViT: set "
                "backbone.kwargs.dynamic_img_size=true (timm then resizes its position embeddings to each crop)"
            )
        target, anchor, focal = views[0], views[1], views[self.num_views :]
        tokens = torch.cat(
            [prefix_tokens(vit, len(anchor)), keep(embed_patches(vit, anchor), batch["mask"], self.visible)], 1
        )
        masked = run_blocks(vit, tokens)
        anchors = [vit.forward_head(masked)]
        anchors += encode_views(vit, focal, forward=partial(pooled_feature, vit))
        with torch.no_grad():
            teacher = pooled_feature(self.teacher[0], target)
        encoded = {"anchors": anchors, "teacher": teacher}
        if self.dse is not None:  # the masked anchor's encoded visible patches, as MAE's
            encoded["dense"] = [masked[:, vit.num_prefix_tokens :]]
        return encoded | self.probe_features(batch)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        anchors = encoded["anchors"]
        # One projector call on every anchor row, as the authors': its BatchNorms' statistics span all anchor views.
        projected = self.projector(torch.cat(anchors)).tensor_split(len(anchors))
        with torch.no_grad():
            target = self.teacher[1](encoded["teacher"])
        c = self.cfg
        loss = msn_loss(
            list(projected),
            target,
            self.prototypes,
            c.temperature,
            c.sharpen,
            c.sinkhorn_iterations,
            c.regularisation_weight,
            self.prior(),
        )
        loss = self.with_dse(loss, encoded.get("dense"))
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}

    def prepare_step(self, index: int, total_steps: int) -> None:
        c, done = self.cfg, index + 1
        self.momentum = c.base_momentum + (c.final_momentum - c.base_momentum) * min(done, total_steps) / total_steps
        self.teacher_momentum.fill_(self.momentum)

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.projector]), self.ema_momentum())

    def metrics(self) -> dict[str, torch.Tensor]:
        return {**super().metrics(), "train/teacher_momentum": torch.tensor(self.momentum)}


@register_method("pmsn", schema=PMSNConfig)
class PMSN(MSN):
    """MSN with the mean anchor probability matched to a power-law prior over the prototypes."""

    def __init__(self, backbone, feature_dim: int, cfg: PMSNConfig):
        super().__init__(backbone, feature_dim, cfg)
        shares = power_law_prior(cfg.num_prototypes, cfg.power_law_exponent)
        self.register_buffer("prior_shares", shares, persistent=False)  # fixed by the config: not in checkpoints

    def prior(self) -> torch.Tensor:
        return self.prior_shares
