"""CAPI (Darcet et al., 2025): a Vision Transformer encodes the visible patches of an image; a cross-attention
predictor predicts, for a few of the hidden ones, which cluster the teacher's token at that position falls in. The
teacher is an EMA of the encoder on the whole image; the clusters are an online clustering head's (learnt
prototypes), its targets Sinkhorn-Knopp assignments over the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.backbones.vit import (
    embed_patches,
    first_positions,
    grid_shape,
    num_patches,
    output_tokens,
    prefix_tokens,
    run_blocks,
    sincos_positions,
    take,
)
from solo.data.views.masks import InverseBlockMask
from solo.distributed import all_reduce, world_size
from solo.errors import ConfigError
from solo.losses import capi_clustering, capi_loss
from solo.methods.base import cosine_momentum, register_method, with_group_settings
from solo.methods.masked_image import CrossAttentionBlock, TargetEncoderViT
from solo.schema import AT_LEAST_ONE, DECAY, FRACTION, POSITIVE, PROBABILITY, ruled


@dataclass
class CAPIConfig:
    name: str = "capi"
    num_prototypes: int = ruled(16384, AT_LEAST_ONE)  # the clusters (the authors' num_clusters)
    predictor_depth: int = ruled(12, AT_LEAST_ONE)  # cross-attention blocks, at the encoder's width
    predictor_heads: int = ruled(16, AT_LEAST_ONE)
    student_temperature: float = ruled(0.12, POSITIVE)
    target_temperature: float = ruled(0.06, POSITIVE)  # of the clustering head's scores into Sinkhorn-Knopp
    clustering_temperature: float = ruled(0.12, POSITIVE)  # of its scores in its own loss (the authors' pred_temp)
    sinkhorn_iterations: int = ruled(3, AT_LEAST_ONE)
    positionwise_sinkhorn: bool = True  # one Sinkhorn-Knopp per patch position (the authors' default), or over all
    clustering_lr_scale: float = ruled(0.5, POSITIVE)  # the clustering head's lr over optim.lr (5e-4 / 1e-3)
    mask_ratio: float = ruled(0.65, FRACTION)  # the share of each image's patches hidden, outside one visible block
    prediction_subsampling: float = ruled(0.05, DECAY)  # the share of the hidden patches predicted
    base_momentum: float = ruled(0.999, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)


class CAPIPredictor(nn.Module):
    """A learnt mask token plus fixed 2-D sine-cosine positions at each predicted position, through cross-attention
    blocks over the encoder's output (its patch tokens with the same positions added, its prefix tokens as they are),
    then a norm without affine parameters (the authors' decoder norm)."""

    def __init__(self, width: int, depth: int, heads: int, grid: tuple[int, int]):
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(width))
        self.register_buffer("positions", sincos_positions(width, grid), persistent=False)
        self.blocks = nn.ModuleList(CrossAttentionBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=1e-6, elementwise_affine=False)
        for m in self.modules():  # the authors' initialisation
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(
        self, context: torch.Tensor, context_at: torch.Tensor, prefix: int, predict_at: torch.Tensor
    ) -> torch.Tensor:
        """(B, M, width) predictions at `predict_at` (B, M) from `context` (B, prefix + C, width), the encoder's output,
        its patches at `context_at` (B, C)."""
        positions = self.positions.to(context.dtype)
        context = torch.cat([context[:, :prefix], context[:, prefix:] + positions[context_at]], dim=1)
        x = self.mask_token.to(context.dtype) + positions[predict_at]
        for block in self.blocks:
            x = block(x, context)
        return self.norm(x)


class PrototypeHead(nn.Module):
    """The student's head (the authors' L2NormLinear): scores of the L2-normalised input against K weight-normalised
    prototypes, each with a learnt scale (weight_norm's g, starting at 1)."""

    def __init__(self, in_dim: int, num_prototypes: int):
        super().__init__()
        self.prototypes = nn.Parameter(torch.empty(num_prototypes, in_dim))
        nn.init.trunc_normal_(self.prototypes, std=0.02)
        self.scale = nn.Parameter(torch.ones(num_prototypes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = F.normalize(self.prototypes, dim=1) * self.scale[:, None]
        return F.normalize(x, dim=-1) @ weight.t().to(x.dtype)


class OnlineClustering(nn.Module):
    """The clustering head (the authors' OnlineClustering): a linear layer with a bias on the L2-normalised teacher
    tokens, its weights drawn from N(0, 1)."""

    def __init__(self, in_dim: int, num_prototypes: int):
        super().__init__()
        self.layer = nn.Linear(in_dim, num_prototypes)
        nn.init.normal_(self.layer.weight, std=1.0)
        nn.init.zeros_(self.layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(F.normalize(x, dim=-1, eps=1e-7))


@register_method("capi", schema=CAPIConfig)
class CAPI(TargetEncoderViT):
    """One view per image and its masks (solo.data.views.masks.InverseBlockMask, drawn per sample: the hidden patches
    and the predicted ones among them). `encode` runs the encoder on the visible patches, the predictor at the
    predicted positions, and the teacher (an EMA of the encoder) on the whole image. `batch_loss` runs the clustering head
    on every teacher patch token, Sinkhorn-Knopp over the global batch for its targets, and sums two losses: the
    clustering head's own (every token of the global batch; only the head gets its gradient) and the student's
    cross-entropy against the targets at the predicted patches (every predicted patch of the global batch). The
    probes read the mean patch token (pool=mean), as the other masked-image methods'."""

    augmentations = {"digits": "one_view_digits", "natural": "capi"}

    def __init__(self, backbone, feature_dim: int, cfg: CAPIConfig):
        super().__init__(backbone, feature_dim, cfg.base_momentum)
        self.cfg = cfg
        generator = self.mask_generator()
        if generator.hidden >= num_patches(backbone) or generator.predicted < 1:
            raise ConfigError(
                f"method.prediction_subsampling={cfg.prediction_subsampling}: of {num_patches(backbone)} patches "
                f"{generator.hidden} are hidden (method.mask_ratio={cfg.mask_ratio}) and {generator.predicted} "
                "predicted; raise method.prediction_subsampling (or the mask ratio) so that at least one is predicted "
                "and one stays visible"
            )
        self.visible = num_patches(backbone) - generator.hidden
        width = backbone.embed_dim
        if width % cfg.predictor_heads:
            raise ConfigError(
                f"method.predictor_heads={cfg.predictor_heads}: the width {width} must be a multiple of the heads"
            )
        self.predictor = CAPIPredictor(width, cfg.predictor_depth, cfg.predictor_heads, grid_shape(backbone))
        self.head = PrototypeHead(width, cfg.num_prototypes)
        self.clustering = OnlineClustering(width, cfg.num_prototypes)

    def mask_generator(self) -> InverseBlockMask:
        return InverseBlockMask(grid_shape(self.backbone), self.cfg.mask_ratio, self.cfg.prediction_subsampling)

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, self.clustering.parameters(), lr_scale=self.cfg.clustering_lr_scale)

    def encode(self, batch: dict) -> dict:
        images, masks = batch["views"][0], batch["mask"]  # masks: (B, 2, patches), hidden then predicted
        vit = self.backbone
        visible_at = first_positions(~masks[:, 0], self.visible)
        predict_at = first_positions(masks[:, 1], self.mask_generator().predicted)
        prefix = prefix_tokens(vit, len(images))
        context = run_blocks(vit, torch.cat([prefix, take(embed_patches(vit, images), visible_at)], dim=1))
        encoded = {"prediction": self.predictor(context, visible_at, prefix.shape[1], predict_at)}
        with torch.no_grad():
            teacher = self.target_encoder
            encoded["teacher"] = output_tokens(teacher, images)[:, teacher.num_prefix_tokens :]
        encoded["predict_at"] = predict_at
        return encoded | self.probe_features(batch)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        c = self.cfg
        # The teacher's tokens carry no graph: the clustering loss trains the clustering head only
        targets, clustering = capi_clustering(
            self.clustering(encoded["teacher"]),
            c.target_temperature,
            c.clustering_temperature,
            c.sinkhorn_iterations,
            c.positionwise_sinkhorn,
        )
        student = self.head(encoded["prediction"])
        capi = capi_loss(student, take(targets, encoded["predict_at"]), c.student_temperature)
        self.terms = {"capi": capi.detach(), "clustering": clustering.detach()}  # W times this rank's share
        return {"loss": capi + clustering, "features": encoded.get("features"), "labels": batch["label"]}

    def momentum_at(self, done: int, total_steps: int) -> float:
        return cosine_momentum(self.cfg.base_momentum, self.cfg.final_momentum, done, total_steps)

    def metrics(self) -> dict[str, torch.Tensor]:
        out = super().metrics()
        terms = getattr(self, "terms", {})
        if terms:  # the sum over ranks is W times each term
            values = all_reduce(torch.stack(list(terms.values())).double()) / world_size()
            out.update({f"train/{name}_loss": value for name, value in zip(terms, values)})
        return out
