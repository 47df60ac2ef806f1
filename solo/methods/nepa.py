"""NEPA (Xu et al., 2025): a Vision Transformer reads an image's patches in raster order under causal attention, and
each position's output predicts the input embedding of the next patch (the patch embedding layer's output, before the
positions are added; a target, which takes no gradient): their negative cosine similarity is the loss. No head, no
decoder, no mask and no teacher: the shift by one patch and the causal attention are what keep the task from being
trivial, the stop-gradient what keeps the embeddings from collapsing. As in the authors' code (SihanXU/nepa,
`ViTNepaForPreTraining`), the class token's output predicts the first patch: every image makes N predictions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones.vit import (
    blocks_at,
    check_vit,
    patch_contents,
    pool_patch_tokens,
    pooled_feature,
    prefix_tokens,
    read_features_after,
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
    """One view per image. `encode` embeds its patches, adds the positions, prepends the class token (and registers),
    and runs the backbone under causal attention (each token sees itself and the tokens before it). `outputs` are the
    final tokens from the last prefix token on and `embeddings` that token's input followed by the patch embeddings (the
    targets), row i of the one predicting row i + 1 of the other (solo.losses.next_embedding_loss): the authors' code
    shifts the whole sequence, class token included, so that its output predicts the first patch. A ViT without prefix
    tokens starts at the first patch (N - 1 predictions).
    When an online probe reads them, also the backbone on the whole image as validation sees it, under bidirectional
    attention (`BatchSpec.probe_image`), without a graph: NEPA's paper fine-tunes with bidirectional attention. The
    backbone's pooled feature becomes the mean patch token after the middle block (`feature_depth`)."""

    num_views = 1
    pool = "mean"
    # The last blocks become the next embedding's prediction, close to the patch embeddings (the paper finds NEPA's
    # outputs weak under linear probing); the middle of the trunk holds the image's features, as iGPT's did.
    feature_depth = 0.5
    augmentations = {"digits": "one_view_digits", "natural": "nepa"}

    def __init__(self, backbone, feature_dim: int, cfg: NEPAConfig):
        super().__init__(backbone, feature_dim)
        check_vit(backbone, self.name)
        pool_patch_tokens(backbone)
        read_features_after(backbone, blocks_at(backbone, self.feature_depth))

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(probe_image=self.feeds_probe)  # no patch mask: causal attention is all that hides

    def encode(self, batch: dict) -> dict:
        images = batch["views"][0]
        vit = self.backbone
        embeddings, grid = patch_contents(vit, images)
        prefix = prefix_tokens(vit, len(images))
        tokens = torch.cat([prefix, with_positions(vit, embeddings, grid)], dim=1)
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=images.device).tril()
        first = max(vit.num_prefix_tokens - 1, 0)  # the last prefix token predicts the first patch
        outputs = run_blocks(vit, tokens, causal.expand(len(images), -1, -1))[:, first:]
        encoded = {"outputs": outputs, "embeddings": torch.cat([prefix[:, first:], embeddings], dim=1)}
        if self.feeds_probe:
            with torch.no_grad():
                encoded["features"] = pooled_feature(vit, batch["probe_image"])
        return encoded

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        loss = next_embedding_loss(encoded["outputs"], encoded["embeddings"])
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}
