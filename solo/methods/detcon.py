"""DetCon-S (Hénaff et al., 2021, "Efficient Visual Pretraining with Contrastive Detection"): each view's last feature
map pooled over regions of the image (the paper's spatial heuristic: a grid), each region contrasted with the same
region of the other view against every other region of the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.backbones import pooled_and_map, watch_map
from solo.data.views.batch_spec import BatchSpec, ViewBoxes
from solo.losses import detcon_loss
from solo.methods.base import DSEOption, KoLeoOption, Method, mlp, register_method
from solo.methods.local import cell_centres
from solo.schema import AT_LEAST_ONE, POSITIVE, ruled

# A region shows in a view when it covers more than this fraction of it: a crop box that ends on a region's border
# within rounding gives no region of a vanishing weight.
MIN_AREA = 1e-3


@dataclass
class DetConConfig(DSEOption, KoLeoOption):
    name: str = "detcon"
    proj_hidden_dim: int = ruled(4096, AT_LEAST_ONE)
    proj_output_dim: int = ruled(256, AT_LEAST_ONE)
    temperature: float = ruled(0.1, POSITIVE)
    grid: int = ruled(4, AT_LEAST_ONE)  # grid x grid regions of the image: the paper's 16
    image_region: bool = False  # the whole image as one more region (its pooled view: SimCLR's pair)


def grid_regions(boxes: torch.Tensor, height: int, width: int, grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How much of each cell of each view's `height` x `width` map lies in each region of a `grid` x `grid` grid of
    the image: the region's binary mask in the image, cropped and mirrored as the view, average-pooled to the map.
    Returns the (B, grid * grid, height * width) fractions, regions and cells in row-major order, and (B, grid * grid)
    whether the region shows in the view. `boxes`: the views' (B, 5) geometry (solo.methods.local)."""
    centres = cell_centres(boxes, height, width)  # (B, cells, 2) float64
    half = torch.stack([boxes[:, 2] / height, boxes[:, 3] / width], dim=1).to(centres.dtype)[:, None, :] / 2
    low, high = centres - half, centres + half  # each cell's extent in the image (a mirror keeps it)
    edges = torch.arange(grid + 1, dtype=centres.dtype, device=centres.device) / grid
    # (B, cells, 2, grid): the overlap, along y and along x, of each cell with each band of the grid
    overlap = (torch.minimum(high[..., None], edges[1:]) - torch.maximum(low[..., None], edges[:-1])).clamp(min=0)
    overlap = overlap / (2 * half[..., None])
    fractions = torch.einsum("bki,bkj->bijk", overlap[:, :, 0], overlap[:, :, 1]).flatten(1, 2)
    return fractions, fractions.mean(dim=2) > MIN_AREA


@register_method("detcon", schema=DetConConfig)
class DetCon(Method):
    """Each view through the backbone gives its pooled features (for the probe) and the map they pool; the map's cells
    are averaged per region with `grid_regions`' weights (`batch["view_boxes"]` says where each cell lies), and each
    region's vector goes through the projector (SimCLR's MLP, shared by the regions)."""

    augmentations = {"digits": "digits", "natural": "barlow_twins"}  # the authors' code: BYOL's views

    def __init__(self, backbone, feature_dim: int, cfg: DetConConfig):
        super().__init__(backbone, feature_dim)
        watch_map(backbone)
        self.take_regularisers(cfg)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.cfg = cfg

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(fields=(ViewBoxes(),))

    def encode(self, batch: dict) -> dict:
        # Each view apart: a ResNet's BatchNorm statistics are per view, as for SimCLR (solo.methods.base.encode_views).
        pooled, maps = zip(*(pooled_and_map(self.backbone, view) for view in batch["views"]))
        return {"features": list(pooled), "maps": list(maps)}

    def regions(self, view_map: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A view's (B, R, D) projected region vectors and (B, R) whether each region shows in it. A region that does
        not is pooled over the whole view, so that the projector's BatchNorm sees real features; the loss leaves it
        out."""
        fractions, present = grid_regions(boxes, *view_map.shape[2:], self.cfg.grid)
        weights = torch.where(present[..., None], fractions, torch.ones_like(fractions))
        if self.cfg.image_region:
            weights = torch.cat([weights, torch.ones_like(weights[:, :1])], dim=1)
            present = torch.cat([present, torch.ones_like(present[:, :1])], dim=1)
        weights = (weights / weights.sum(dim=2, keepdim=True)).to(view_map.dtype)
        pooled = torch.einsum("brk,bck->brc", weights, view_map.flatten(2))
        return self.projector(pooled.flatten(0, 1)).unflatten(0, pooled.shape[:2]), present

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        (f1, f2), maps = encoded["features"], encoded["maps"]
        (z1, present1), (z2, present2) = (self.regions(m, batch["view_boxes"][:, v]) for v, m in enumerate(maps))
        loss = detcon_loss(z1, z2, present1, present2, temperature=self.cfg.temperature)
        # The backbone's output must be in the graph: FSDP unshards the parameters of its root module (the stem) for
        # the backward from a hook on that output, and the regions reach the backbone through the map alone.
        loss = loss + 0 * (f1.sum() + f2.sum())
        return self.view_outputs(loss, [f1, f2], batch, [m.flatten(2).mT for m in encoded["maps"]])
