"""CLIP (Radford et al., 2021): an image tower and a text tower trained with symmetric InfoNCE; the towers are
shared with SigLIP (solo.methods.siglip), solo's own or open_clip's (solo.methods.towers)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf

from solo.data.views.batch_spec import BatchSpec
from solo.errors import ConfigError
from solo.eval.zero_shot import class_embeddings, evaluate_image_text
from solo.losses import clip_loss
from solo.losses.tiled import config_tile
from solo.methods.base import Method, register_method
from solo.methods.towers import Towers, check_pretrained, open_clip_image_size, open_clip_towers, solo_towers
from solo.schema import AT_LEAST_ONE, POSITIVE, TILE, Rule, ruled


@dataclass
class TextConfig:
    """CLIP's text tower: a Transformer over byte tokens, pooled at the end-of-text token."""

    width: int = ruled(512, AT_LEAST_ONE)
    depth: int = ruled(12, AT_LEAST_ONE)
    heads: int = ruled(8, AT_LEAST_ONE)
    context_length: int = ruled(
        77, Rule("must be >= 3 (start, one byte, end)", lambda v: v >= 3)
    )  # tokens, start and end included; longer captions are truncated (and counted)
    causal: bool = True


@dataclass
class TowersConfig:
    """The towers of CLIP and SigLIP: solo's own (the `backbone` group's image backbone and the byte-level text
    Transformer `text`, both projected to `embed_dim`), or open_clip's model `model`, sized by its open_clip config
    (`embed_dim` and `text` unused then)."""

    embed_dim: int = ruled(512, AT_LEAST_ONE)
    text: TextConfig = field(default_factory=TextConfig)
    model: Optional[str] = None  # an open_clip model name (open_clip.list_models()): its towers and tokenizer
    model_cfg: Dict[str, Any] = field(default_factory=dict)  # changes to its open_clip config, merged key by key
    pretrained: Optional[str] = (
        None  # open_clip weights for `model` (a state dict file or open_clip tag), loaded at start
    )


@dataclass
class CLIPConfig(TowersConfig):
    name: str = "clip"
    init_logit_scale: float = ruled(14.285714285714286, POSITIVE)  # 1 / 0.07, as in CLIP
    max_logit_scale: float = ruled(100.0, POSITIVE)
    loss_tile: str = ruled("none", TILE)  # none | auto | candidates per tile: the loss in memory B_local x tile


def build_towers(backbone, feature_dim: int, cfg: TowersConfig) -> Towers:
    """CLIP's and SigLIP's towers: open_clip's model method.model, or `backbone` and solo's text tower."""
    if cfg.model:
        return open_clip_towers(cfg.model, cfg.model_cfg, cfg.pretrained)
    return solo_towers(backbone, feature_dim, cfg.embed_dim, cfg.text)


class ImageTextMethod(Method):
    """An image tower and a text tower, each projected to the pairs' shared embedding space (solo.methods.towers:
    solo's own, or open_clip's with method.model; LiT's locked image tower); subclasses give the loss in `batch_loss`
    (CLIP, SigLIP, LiT). `init_bias`: a learnt logit bias (SigLIP's), None for none."""

    inputs = "image_text"
    num_views = 1  # one augmented image per pair
    # CLIP's one lightly cropped view, on any data
    augmentations = {"digits": "clip", "natural": "clip"}

    def __init__(self, towers: Towers, init_logit_scale: float, init_bias: float | None = None):
        super().__init__(towers.backbone, towers.feature_dim)
        self.image_projection = towers.image_projection
        self.text_tower = towers.text_tower
        self.text_projection = towers.text_projection
        self.tokenizer = towers.tokenizer
        self.context_length = towers.tokenizer.context_length
        # Learnt in log space, as in CLIP and SigLIP, so the scale stays positive; loaded weights bring their own.
        log_scale = towers.log_logit_scale if towers.log_logit_scale is not None else math.log(init_logit_scale)
        self.log_logit_scale = nn.Parameter(torch.tensor(log_scale))
        if init_bias is not None:
            self.bias = nn.Parameter(torch.tensor(towers.logit_bias if towers.logit_bias is not None else init_bias))

    @classmethod
    def builds_own_backbone(cls, cfg) -> bool:
        return bool(cfg.get("model"))

    @classmethod
    def check_config(cls, cfg) -> None:
        """open_clip's towers take images of one size, their config's vision_cfg.image_size: the data's and the views'."""
        from solo.data import view_sizes

        m, d = cfg.method, cfg.data
        if not m.model:
            return
        size = open_clip_image_size(m.model, OmegaConf.to_container(m.model_cfg))
        sizes = sorted({d.image_size, *view_sizes(cfg.augmentation.views, d.image_size)})
        if any((s, s) != size for s in sizes):
            views = f" (augmentation.views give sizes {sizes})" if sizes != [d.image_size] else ""
            shown = size[0] if size[0] == size[1] else list(size)
            raise ConfigError(
                f"method.model={m.model} takes {shown} px images (its open_clip vision_cfg.image_size), but "
                f"data.image_size={d.image_size}{views}: set data.image_size={shown}, or build the model for "
                f"{d.image_size} px with +method.model_cfg.vision_cfg.image_size={d.image_size}"
            )
        if m.pretrained:
            check_pretrained(m.model, m.pretrained)

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """The image tower's features before the projection (open_clip's: its embedding before normalisation):
        what a linear probe reads."""
        return self.backbone(images)

    def embed_features(self, features: torch.Tensor) -> torch.Tensor:
        """Image features -> L2-normalised image embeddings."""
        return F.normalize(self.image_projection(features), dim=-1)

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(tokenizer=self.tokenizer)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """L2-normalised image embeddings, as open_clip's encode_image(normalize=True)."""
        return self.embed_features(self.image_features(images))

    def embed_text(self, pooled: torch.Tensor) -> torch.Tensor:
        """The text tower's output -> L2-normalised text embeddings."""
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
        super().__init__(build_towers(backbone, feature_dim, cfg), cfg.init_logit_scale)
        self.max_logit_scale = cfg.max_logit_scale
        self.tile = config_tile(cfg.loss_tile)

    def logit_scale(self) -> torch.Tensor:
        # Clamped at max_logit_scale (CLIP: 100) to keep training stable; no gradient past the clamp.
        return self.log_logit_scale.exp().clamp(max=self.max_logit_scale)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        image = self.embed_features(encoded["image"])
        text = self.embed_text(encoded["text"])
        loss = clip_loss(image, text, self.logit_scale(), tile=self.tile)
        return {"loss": loss, "features": encoded["image"], "labels": batch["label"]}

    def metrics(self) -> dict[str, torch.Tensor]:
        return {"train/logit_scale": self.logit_scale().detach()}
