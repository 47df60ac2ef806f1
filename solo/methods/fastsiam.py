"""FastSiam (Pototzky, Sultan and Schmidt-Thieme, 2022): SimSiam with four or more views of each image, each view's
prediction regressed onto the mean of the other views' projections, a steadier target than one view's; the projector,
predictor and stop-gradient are SimSiam's."""

from __future__ import annotations

from dataclasses import dataclass

from solo.errors import ConfigError
from solo.losses import fastsiam_loss
from solo.methods.base import Method, encode_views, register_method, with_group_settings
from solo.methods.simsiam import SimSiamConfig, simsiam_heads


@dataclass
class FastSiamConfig(SimSiamConfig):
    name: str = "fastsiam"


@register_method("fastsiam", schema=FastSiamConfig)
class FastSiam(Method):
    augmentations = {"digits": "digits_four_views", "natural": "fastsiam"}

    def __init__(self, backbone, feature_dim: int, cfg: FastSiamConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.projector, self.predictor = simsiam_heads(feature_dim, cfg)

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        """Any number (2 or more) of views, all of one size (the paper's 4: augmentation=digits_four_views)."""
        if len(view_sizes) < 2 or len(set(view_sizes)) != 1:
            raise ConfigError(
                f"augmentation.views={view_sizes}: method=fastsiam takes 2 or more views of one size (the paper: 4); "
                "give one view recipe with count >= 2, as augmentation=digits_four_views"
            )
        super().check_data(view_sizes[: cls.num_views], dataset)

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, self.predictor.parameters(), static_lr=True)  # SimSiam's

    def encode(self, batch: dict) -> dict:
        return self.encode_backbone(batch["views"])

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        projections = encode_views(self.projector, features)  # each view's BatchNorm statistics, in one call
        predictions = encode_views(self.predictor, projections)
        loss = fastsiam_loss(predictions, projections)
        return self.view_outputs(loss, features, batch, encoded.get("dense"))
