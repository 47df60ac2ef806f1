"""LiT, locked-image tuning (Zhai et al., 2022): a pretrained image tower, locked, and a text tower trained from
scratch to read it out, with CLIP's contrastive loss (or SigLIP's sigmoid loss, as SigLIP's SigLiT). The trainer
loads the tower as it loads distill's teacher (solo.zoo.teachers), and it is the method's backbone."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from solo.errors import ConfigError
from solo.losses import clip_loss, siglip_loss
from solo.losses.tiled import config_tile
from solo.methods.base import register_method
from solo.methods.clip import ImageTextMethod, TextConfig
from solo.methods.distill import FrozenTeacher, PretrainedTeacherConfig
from solo.methods.towers import solo_towers
from solo.schema import AT_LEAST_ONE, POSITIVE, TILE, choices, ruled

LiTLoss = choices("LiTLoss", "clip", "siglip")


@dataclass
class LiTConfig(PretrainedTeacherConfig):
    name: str = "lit"
    teacher: str = "clip-digits-resnet18half"  # the locked image tower
    # A trained linear projection of the locked features to embed_dim; false: the locked features are the image
    # embedding, and the text tower projects to their width (embed_dim unused)
    image_head: bool = True
    embed_dim: int = ruled(512, AT_LEAST_ONE)
    text: TextConfig = field(default_factory=TextConfig)
    loss: LiTLoss = LiTLoss("clip")  # clip: symmetric InfoNCE; siglip: the pairwise sigmoid loss with a learnt bias
    init_logit_scale: float = ruled(14.285714285714286, POSITIVE)  # 1 / 0.07, as in CLIP
    max_logit_scale: float = ruled(100.0, POSITIVE)
    init_bias: float = -10.0  # loss=siglip: the learnt bias's start (SigLIP's b)
    loss_tile: str = ruled("none", TILE)  # loss=clip: none | auto | candidates per tile, as CLIP's


@register_method("lit", schema=LiTConfig)
class LiT(ImageTextMethod):
    """The locked tower is the backbone: in eval mode whatever the model's mode, without gradients, run under no_grad
    in the step's precision, in no optimizer group, saved with the model (a resumed run reads it back from the
    checkpoint). The text tower, the image projection (`image_head`), the logit scale (and SigLIP's bias) train."""

    teachers = ("backbone",)  # frozen: kept out of SyncBatchNorm
    pretrained_teacher = True

    def __init__(self, backbone, feature_dim: int, cfg: LiTConfig, teacher: FrozenTeacher):
        # `backbone` is None: the locked tower `teacher` is the image encoder (builds_own_backbone)
        width = cfg.embed_dim if cfg.image_head else teacher.width
        towers = solo_towers(teacher, teacher.width, width, cfg.text)
        if not cfg.image_head:
            towers = dataclasses.replace(towers, image_projection=nn.Identity())
        siglip = str(cfg.loss) == "siglip"
        super().__init__(towers, cfg.init_logit_scale, init_bias=cfg.init_bias if siglip else None)
        self.siglip, self.max_logit_scale = siglip, cfg.max_logit_scale
        self.tile = config_tile(cfg.loss_tile)

    @classmethod
    def builds_own_backbone(cls, cfg) -> bool:
        return True

    @classmethod
    def check_config(cls, cfg) -> None:
        m = cfg.method
        if str(m.loss) == "siglip" and str(m.loss_tile) != "none":
            raise ConfigError(
                f"method.loss_tile={m.loss_tile}: tiles CLIP's loss, and method.loss=siglip is computed whole; "
                "set method.loss_tile=none"
            )

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.backbone(images)

    def logit_scale(self) -> torch.Tensor:
        # Clamped at max_logit_scale as CLIP's, for either loss; no gradient past the clamp.
        return self.log_logit_scale.exp().clamp(max=self.max_logit_scale)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        image = self.embed_features(encoded["image"])
        text = self.embed_text(encoded["text"])
        if self.siglip:
            loss = siglip_loss(image, text, self.logit_scale(), self.bias)
        else:
            loss = clip_loss(image, text, self.logit_scale(), tile=self.tile)
        return {"loss": loss, "features": encoded["image"], "labels": batch["label"]}

    def metrics(self) -> dict[str, torch.Tensor]:
        out = {"train/logit_scale": self.logit_scale().detach()}
        return out | ({"train/logit_bias": self.bias.detach()} if self.siglip else {})
