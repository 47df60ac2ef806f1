"""EMP-SSL (Tong et al., 2023): many fixed-size patches of each image, the total coding rate of each patch's embeddings
over the global batch maximised and every patch pulled to its image's mean embedding; no teacher or negatives."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.data.views.batch_spec import BatchSpec
from solo.errors import ConfigError
from solo.losses import emp_ssl_loss
from solo.methods.base import DSEOption, Method, mlp, register_method
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ruled


@dataclass
class EMPSSLConfig(DSEOption):
    name: str = "emp_ssl"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(1024, AT_LEAST_ONE)
    tcr_eps: float = ruled(0.2, POSITIVE)  # the coding rate's epsilon squared (the paper's eps^2, its code's eps)
    lambd: float = ruled(200.0, NON_NEGATIVE)  # the invariance's weight: cosine of each patch to its image's mean


@register_method("emp_ssl", schema=EMPSSLConfig)
class EMPSSL(Method):
    augmentations = {"digits": "emp_ssl_digits", "natural": "emp_ssl"}
    # The patches are small crops, far from the whole images validation reads: a probe trained on their features
    # scores low on whole images (docs/methods/emp_ssl.md).

    def __init__(self, backbone, feature_dim: int, cfg: EMPSSLConfig):
        super().__init__(backbone, feature_dim)
        self.cfg = cfg
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.take_regularisers(cfg)

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        """Any number (2 or more) of patches, all of one size: the paper's are fixed-size crops, not multi-crop."""
        if len(view_sizes) < 2 or len(set(view_sizes)) != 1:
            raise ConfigError(
                f"augmentation.views={view_sizes}: method=emp_ssl takes 2 or more patches of one size; give one view "
                "recipe with count >= 2, as augmentation=emp_ssl_digits"
            )
        super().check_data(view_sizes[: cls.num_views], dataset)

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(probe_image=self.feeds_probe)

    def encode(self, batch: dict) -> dict:
        # Every patch in one call, as the authors' code: the BatchNorms take their statistics over all of them.
        views = batch["views"]
        encoded = self.encode_backbone(views, per_view_statistics=False)
        encoded["patches"] = encoded.pop("features")
        if (
            self.feeds_probe
        ):  # the probe learns on what it is evaluated on (Method.batch_spec: probe_image), without a graph
            with torch.no_grad():
                encoded["features"] = self.backbone(batch["probe_image"])
        return encoded

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        patches = encoded["patches"]
        projected = self.projector(torch.cat(patches)).split([len(f) for f in patches])
        loss = self.with_dse(emp_ssl_loss(list(projected), self.cfg.tcr_eps, self.cfg.lambd), encoded.get("dense"))
        return {"loss": loss, "features": encoded.get("features"), "labels": batch["label"]}
