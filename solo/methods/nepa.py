"""NEPA (Xu et al., 2025): a Vision Transformer reads an image's patches in raster order under causal attention, and
each position's output predicts the input embedding of the next patch (the patch embedding layer's output, before the
positions are added; a target, which takes no gradient): their negative cosine similarity is the loss. No head, no
decoder, no mask and no teacher: the shift by one patch and the causal attention are what keep the task from being
trivial, the stop-gradient what keeps the embeddings from collapsing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones.vit import (
    check_vit,
    patch_contents,
    pool_patch_tokens,
    pooled_feature,
    prefix_tokens,
    run_blocks,
    with_positions,
)
from solo.data.views.batch_spec import BatchSpec
from solo.losses import next_embedding_loss
from solo.methods.base import Method, register_method


@dataclass
class NEPAConfig:
    name: str = "nepa"


@register_method("nepa", schema=NEPAConfig)
class NEPA(Method):
    """One view per image. `encode` embeds its patches (`embeddings`, the targets), adds the positions, prepends the
    class token, and runs the backbone under causal attention (each token sees itself and the tokens before it);
    `outputs` are the patch positions' final tokens, row i predicting embedding i + 1 (solo.losses.next_embedding_loss).
    When an online probe reads them, also the backbone on the whole image as validation sees it, under bidirectional
    attention (`BatchSpec.probe_image`), without a graph: NEPA's paper fine-tunes with bidirectional attention. The
    backbone's pooled feature becomes the mean patch token."""

    num_views = 1
    pool = "mean"
    augmentations = {"digits": "one_view_digits", "natural": "mae"}  # MAE's crop and flip: NEPA's could not be read

    def __init__(self, backbone, feature_dim: int, cfg: NEPAConfig):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        pool_patch_tokens(backbone)

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(probe_image=self.feeds_probe)  # no patch mask: causal attention is all that hides

    def encode(self, batch: dict) -> dict:
        images = batch["views"][0]
        vit = self.backbone
        embeddings, grid = patch_contents(vit, images)
        tokens = torch.cat([prefix_tokens(vit, len(images)), with_positions(vit, embeddings, grid)], dim=1)
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=images.device).tril()
        outputs = run_blocks(vit, tokens, causal.expand(len(images), -1, -1))[:, vit.num_prefix_tokens :]
        encoded = {"outputs": outputs, "embeddings": embeddings}
        if self.feeds_probe:
            with torch.no_grad():
                encoded["features"] = pooled_feature(vit, batch["probe_image"])
        return encoded

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        loss = next_embedding_loss(encoded["outputs"], encoded["embeddings"])
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}
