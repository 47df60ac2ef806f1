"""MMCR (Yerxa et al., 2023): the nuclear norm of the matrix of per-sample centroids of every view's normalised
embedding, maximised over the global batch; no teacher, stop-gradient, predictor or negatives."""

from __future__ import annotations

from dataclasses import dataclass

from solo.losses import mmcr_loss
from solo.methods.base import DSEOption, KoLeoOption, Method, encode_views, mlp, register_method
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, ruled


@dataclass
class MMCRConfig(DSEOption, KoLeoOption):
    name: str = "mmcr"
    proj_hidden_dim: int = ruled(8192, AT_LEAST_ONE)
    proj_output_dim: int = ruled(512, AT_LEAST_ONE)
    lambd: float = ruled(0.0, NON_NEGATIVE)  # the weight of the mean per-sample nuclear norm (the paper's lambda)


@register_method("mmcr", schema=MMCRConfig)
class MMCR(Method):
    local_crops = True  # every crop is one more view of its sample: the paper's centroids take many

    def __init__(self, backbone, feature_dim: int, cfg: MMCRConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.lambd = cfg.lambd
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])

    def encode(self, batch: dict) -> dict:
        # The authors' code runs a batch's views through the backbone together: the views of one size share
        # BatchNorm's statistics.
        return self.encode_backbone(batch["views"], per_view_statistics=False)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        features = encoded["features"]
        projected = encode_views(
            self.projector, features, per_view_statistics=False
        )  # every view at once, as the authors'
        loss = mmcr_loss(projected, self.lambd)
        return self.view_outputs(loss, features[: self.num_views], batch, encoded.get("dense"))
