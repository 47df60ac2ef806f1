"""VICRegL (Bardes, Ponce and LeCun, 2022): VICReg on the pooled embeddings and on the last stage's feature-map cells,
matched across the views by where they lie in the image and by their embeddings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from solo.backbones import pooled_and_map, watch_map
from solo.data.views.batch_spec import BatchSpec, ViewBoxes
from solo.errors import ConfigError
from solo.losses import vicregl_loss
from solo.methods.base import ExpanderConfig, ExpanderMethod, mlp, register_method
from solo.methods.local import cell_centres
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, PROBABILITY, ruled


@dataclass
class VICRegLConfig(ExpanderConfig):
    name: str = "vicregl"
    proj_hidden_dim: int = ruled(8192, AT_LEAST_ONE)
    proj_output_dim: int = ruled(8192, AT_LEAST_ONE)
    maps_hidden_dim: int = ruled(512, AT_LEAST_ONE)  # the per-cell projector's (the authors' --maps-mlp 512-512-512)
    maps_output_dim: int = ruled(512, AT_LEAST_ONE)
    alpha: float = ruled(0.75, PROBABILITY)  # alpha * global + (1 - alpha) * local
    # The cells of view 1 and of view 2 kept by the location matching (the authors' --num_matches)
    num_matches: List[int] = field(default_factory=lambda: [20, 4])
    sim_coeff: float = ruled(25.0, NON_NEGATIVE)
    std_coeff: float = ruled(25.0, NON_NEGATIVE)
    cov_coeff: float = ruled(1.0, NON_NEGATIVE)


@register_method("vicregl", schema=VICRegLConfig)
class VICRegL(ExpanderMethod):
    """Each view through the backbone gives its pooled features (the global branch: VICReg's expander) and the map
    they pool, whose cells go through their own projector (Linear-BatchNorm-ReLU on each cell, the authors'
    maps_projector); `batch["view_boxes"]` says where each cell lies in the image (solo.methods.local)."""

    augmentations = {"digits": "digits", "natural": "barlow_twins"}

    def __init__(self, backbone, feature_dim: int, cfg: VICRegLConfig):
        super().__init__(backbone, feature_dim, cfg)
        watch_map(backbone)
        if len(cfg.num_matches) != 2 or min(cfg.num_matches) < 1:
            raise ConfigError(
                f"method.num_matches={list(cfg.num_matches)}: give two counts >= 1, the cells of view 1 and of view 2 "
                "kept by the location matching, e.g. [20, 4]"
            )
        self.maps_projector = mlp([feature_dim, cfg.maps_hidden_dim, cfg.maps_hidden_dim, cfg.maps_output_dim])
        self.cfg = cfg

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(fields=(ViewBoxes(),))

    def encode(self, batch: dict) -> dict:
        # Each view apart: a ResNet's BatchNorm statistics are per view, as for VICReg (solo.methods.base.encode_views).
        pooled, maps = zip(*(pooled_and_map(self.backbone, view) for view in batch["views"]))
        return {"features": list(pooled), "maps": list(maps)}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        (f1, f2), maps = encoded["features"], encoded["maps"]
        height, width = maps[0].shape[2:]
        local, centres = [], []
        for v, view_map in enumerate(maps):
            cells = view_map.flatten(2).transpose(1, 2)  # (B, h * w, C), row-major as cell_centres
            local.append(self.maps_projector(cells.flatten(0, 1)).unflatten(0, cells.shape[:2]))
            centres.append(cell_centres(batch["view_boxes"][:, v], height, width))
        c = self.cfg
        loss = vicregl_loss(
            self.projector(f1),
            self.projector(f2),
            *local,
            *centres,
            alpha=c.alpha,
            num_matches=c.num_matches,
            sim_coeff=c.sim_coeff,
            std_coeff=c.std_coeff,
            cov_coeff=c.cov_coeff,
        )
        return self.view_outputs(loss, [f1, f2], batch, [m.flatten(2).mT for m in encoded["maps"]])
