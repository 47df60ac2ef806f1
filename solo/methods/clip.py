"""CLIP (Radford et al., 2021): an image tower and a text tower trained with symmetric InfoNCE; the towers are
shared with SigLIP (solo.methods.siglip)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.eval.zero_shot import class_embeddings, evaluate_image_text
from solo.losses import clip_loss
from solo.losses.tiled import config_tile
from solo.schema import AT_LEAST_ONE, POSITIVE, TILE, Rule, ruled
from solo.methods.base import Method, register_method
from solo.text import VOCAB_SIZE, ByteTokenizer
from solo.text.encoder import TextTransformer


@dataclass
class TextConfig:
    """CLIP's text tower: a Transformer over byte tokens, pooled at the end-of-text token."""

    width: int = ruled(512, AT_LEAST_ONE)
    depth: int = ruled(12, AT_LEAST_ONE)
    heads: int = ruled(8, AT_LEAST_ONE)
    context_length: int = ruled(77, Rule("must be >= 3 (start, one byte, end)", lambda v: v >= 3))  # tokens, start and end included; longer captions are truncated (and counted)
    causal: bool = True


@dataclass
class CLIPConfig:
    name: str = "clip"
    embed_dim: int = ruled(512, AT_LEAST_ONE)
    init_logit_scale: float = ruled(14.285714285714286, POSITIVE)  # 1 / 0.07, as in CLIP
    max_logit_scale: float = ruled(100.0, POSITIVE)
    loss_tile: str = ruled("none", TILE)  # none | auto | candidates per tile: the loss in memory B_local x tile
    text: TextConfig = field(default_factory=TextConfig)


class ImageTextMethod(Method):
    """An image tower (backbone + projection) and a text tower (Transformer + projection) over the pairs' shared
    embedding space; subclasses give the loss in `joint` (CLIP, SigLIP)."""

    inputs = "image_text"
    num_views = 1  # one augmented image per pair

    def __init__(self, backbone, feature_dim: int, embed_dim: int, text: TextConfig, init_logit_scale: float):
        super().__init__(backbone, feature_dim)
        self.image_projection = nn.Linear(feature_dim, embed_dim, bias=False)
        self.text_tower = TextTransformer(
            vocab_size=VOCAB_SIZE,
            context_length=text.context_length,
            width=text.width,
            depth=text.depth,
            heads=text.heads,
            causal=text.causal,
        )
        self.text_projection = nn.Linear(text.width, embed_dim, bias=False)
        self.context_length = text.context_length
        self.tokenizer = ByteTokenizer(text.context_length)
        # Learnt in log space, as in CLIP and SigLIP, so the scale stays positive.
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(init_logit_scale)))

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """The image tower's backbone features (before the projection): what a linear probe reads."""
        return self.backbone(images)

    def embed_features(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone features -> L2-normalised image embeddings."""
        return F.normalize(self.image_projection(features), dim=-1)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """L2-normalised image embeddings, as open_clip's encode_image(normalize=True)."""
        return self.embed_features(self.image_features(images))

    def embed_text(self, pooled: torch.Tensor) -> torch.Tensor:
        """The text tower's pooled output -> L2-normalised text embeddings."""
        return F.normalize(self.text_projection(pooled), dim=-1)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """L2-normalised text embeddings of `tokens` (from `self.tokenizer(list of str)`)."""
        return self.embed_text(self.text_tower(tokens))

    def encode(self, batch: dict) -> dict:
        return {"image": self.image_features(batch["image"]), "text": self.text_tower(batch["text"])}

    def evaluate(self, probe, loader, device, autocast) -> dict:
        """Retrieval recall both ways, zero-shot accuracy when the val pairs have class prompts, the probe."""
        prompts = loader.dataset.prompts
        classifier = None
        if prompts:
            classifier = class_embeddings(self, prompts, self.tokenizer, device, self.log_logit_scale.dtype)
        return evaluate_image_text(self, probe, classifier, loader, device, autocast)


@register_method("clip", schema=CLIPConfig)
class CLIP(ImageTextMethod):
    def __init__(self, backbone, feature_dim: int, cfg: CLIPConfig):
        super().__init__(backbone, feature_dim, cfg.embed_dim, cfg.text, cfg.init_logit_scale)
        self.max_logit_scale = cfg.max_logit_scale
        self.tile = config_tile(cfg.loss_tile)

    def logit_scale(self) -> torch.Tensor:
        # Clamped at max_logit_scale (CLIP: 100) to keep training stable; no gradient past the clamp.
        return self.log_logit_scale.exp().clamp(max=self.max_logit_scale)

    def joint(self, encoded: dict, batch: dict) -> dict:
        image = self.embed_features(encoded["image"])
        text = self.embed_text(encoded["text"])
        loss = clip_loss(image, text, self.logit_scale(), tile=self.tile)
        return {"loss": loss, "features": encoded["image"], "labels": batch["label"]}

    def metrics(self) -> dict[str, torch.Tensor]:
        return {"train/logit_scale": self.logit_scale().detach()}
