"""CLIP (Radford et al., 2021): an image tower and a text tower trained with symmetric InfoNCE."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.losses import clip_loss
from solo.methods.base import Method, register
from solo.text import VOCAB_SIZE
from solo.text.encoder import TextTransformer


@register("clip")
class CLIP(Method):
    inputs = "image_text"

    def __init__(
        self,
        backbone,
        feature_dim: int,
        *,
        embed_dim: int,
        text: dict,
        init_logit_scale: float,
        max_logit_scale: float,
    ):
        super().__init__(backbone, feature_dim)
        self.image_projection = nn.Linear(feature_dim, embed_dim, bias=False)
        self.text_tower = TextTransformer(
            vocab_size=VOCAB_SIZE,
            context_length=text["context_length"],
            width=text["width"],
            depth=text["depth"],
            heads=text["heads"],
            causal=text["causal"],
        )
        self.text_projection = nn.Linear(text["width"], embed_dim, bias=False)
        self.context_length = text["context_length"]
        # Learnt in log space, as in CLIP, so the scale stays positive.
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(init_logit_scale)))
        self.max_logit_scale = max_logit_scale

    def logit_scale(self) -> torch.Tensor:
        # Clamped at max_logit_scale (CLIP: 100) to keep training stable; no gradient past the clamp.
        return self.log_logit_scale.exp().clamp(max=self.max_logit_scale)

    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(backbone features, L2-normalised embeddings)."""
        features = self.backbone(images)
        return features, F.normalize(self.image_projection(features), dim=-1)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text_projection(self.text_tower(tokens)), dim=-1)

    def forward(self, batch: dict) -> dict:
        features, image = self.encode_image(batch["image"])
        text = self.encode_text(batch["text"])
        loss = clip_loss(image, text, self.logit_scale())
        return {"loss": loss, "features": features, "labels": batch["label"], "logit_scale": self.logit_scale().detach()}
