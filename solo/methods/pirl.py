"""PIRL (Misra and van der Maaten, 2020, "Self-Supervised Learning of Pretext-Invariant Representations"): each image's
embedding and its jigsaw's (its tiles, each encoded on its own, shuffled, then joined) are pulled towards a memory
bank's running average of the image's embeddings and away from every other image's."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn as nn

from solo.data.views.batch_spec import BatchSpec
from solo.distributed.batchnorm import running_stats_kept
from solo.errors import ConfigError
from solo.losses import memory_bank_loss
from solo.methods.base import DSEOption, KoLeoOption, Method, register_method
from solo.methods.memory_banks import MomentumMemoryBank
from solo.schema import AT_LEAST_ONE, MOMENTUM, POSITIVE, PROBABILITY, ruled

GRID = 3  # the paper's jigsaw: 3 x 3 tiles


@dataclass(frozen=True)
class JigsawOrder:
    """The order of a sample's GRID x GRID tiles in its jigsaw, `batch["jigsaw"]`: a permutation drawn with the
    sample's own generator (solo.data.views.batch_spec.SampleField), so the same at any world size."""

    name: str = "jigsaw"

    def __call__(self, params: torch.Tensor, height: int, width: int, rng: random.Random) -> torch.Tensor:
        order = list(range(GRID * GRID))
        rng.shuffle(order)
        return torch.tensor(order)


def jigsaw_tiles(view: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """(B * GRID * GRID, C, t, t): each view's GRID x GRID tiles of side t = size // GRID (from the centre: a size
    that GRID does not divide leaves its last pixels out), sample by sample, each sample's in its `order` (B, 9)."""
    b, c, h, w = view.shape
    th, tw = h // GRID, w // GRID
    top, left = (h - GRID * th) // 2, (w - GRID * tw) // 2
    view = view[:, :, top : top + GRID * th, left : left + GRID * tw]
    tiles = view.reshape(b, c, GRID, th, GRID, tw).permute(0, 2, 4, 1, 3, 5).reshape(b, GRID * GRID, c, th, tw)
    return tiles[torch.arange(b, device=view.device)[:, None], order].flatten(0, 1)


@dataclass
class PIRLConfig(DSEOption, KoLeoOption):
    name: str = "pirl"
    proj_output_dim: int = ruled(128, AT_LEAST_ONE)
    temperature: float = ruled(0.07, POSITIVE)
    jigsaw_weight: float = ruled(0.5, PROBABILITY)  # the paper's lambda: the jigsaw's share of the loss
    bank_momentum: float = ruled(0.5, MOMENTUM)  # an entry's share in its update (the paper's 0.5)


@register_method("pirl", schema=PIRLConfig)
class PIRL(Method):
    """Two views: the image (a crop at data.image_size) and the one the jigsaw is cut from (the authors' code: a
    larger crop, scale 0.6 to 1). The image's embedding f is a linear map of its features; the jigsaw's g maps each
    tile's features linearly (one map for all tiles), joins the nine in the jigsaw's order and maps them linearly
    (VISSL's PIRL heads). Loss: lambda * NCE(g, bank) + (1 - lambda) * NCE(f, bank), each row's positive its own
    sample's bank entry, the others every other sample's (solo.losses.memory_bank_loss); then the bank entries of the
    step's samples move towards f (solo.methods.memory_banks.MomentumMemoryBank)."""

    augmentations = {"digits": "pirl_digits", "natural": "pirl"}
    # The jigsaw's view may have a size of its own (pirl_digits: 24 px for 8 px tiles), which a recipe gives as a
    # local crop's (solo.config.recipe_views keeps sized views for the methods that take them); check_data below.
    local_crops = True

    def __init__(self, backbone, feature_dim: int, cfg: PIRLConfig):
        super().__init__(backbone, feature_dim)
        d = cfg.proj_output_dim
        self.image_head = nn.Linear(feature_dim, d)
        self.tile_head = nn.Linear(feature_dim, d)
        self.jigsaw_head = nn.Linear(GRID * GRID * d, d)
        self.cfg = cfg
        self.take_regularisers(cfg)

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        if len(view_sizes) != 2 or view_sizes[1] < GRID:
            raise ConfigError(
                f"method=pirl takes two views, the image and the one its {GRID} x {GRID} jigsaw is cut from (at least "
                f"{GRID} px), but augmentation.views gives sizes {view_sizes}: use augmentation=pirl or pirl_digits"
            )
        super().check_data(view_sizes[:1] * 2, dataset)  # the data checks; the two sizes may differ

    def set_data(self, num_samples: int) -> None:
        self.bank = MomentumMemoryBank(num_samples, self.cfg.proj_output_dim, self.cfg.bank_momentum)

    def batch_spec(self) -> BatchSpec:
        return BatchSpec(fields=(JigsawOrder(),))

    def encode(self, batch: dict) -> dict:
        image, whole = batch["views"]
        # The image and the tiles apart: a ResNet's BatchNorm statistics are per input, as per view elsewhere. The
        # running statistics (what the backbone evaluates with) are the images' alone: the small tiles' would shift
        # them (on the digits the online probe then fell from 0.96 to 0.89 over the run).
        encoded = self.encode_backbone([image])
        with running_stats_kept(self.backbone):
            tiles = self.backbone(jigsaw_tiles(whole, batch["jigsaw"]))
        return {**encoded, "tiles": tiles}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        (features,), tiles = encoded["features"], encoded["tiles"]
        f = self.image_head(features)
        joined = self.tile_head(tiles).reshape(len(features), self.jigsaw_head.in_features)  # any rows, none too
        g = self.jigsaw_head(joined)
        # A copy: the loss's backward needs the entries as they were before this step's update.
        bank, index, w = self.bank.rows.clone(), batch["index"], self.cfg.jigsaw_weight
        t = self.cfg.temperature
        loss = w * memory_bank_loss(g, bank, index, t) + (1 - w) * memory_bank_loss(f, bank, index, t)
        self.bank.update(index, f)
        return self.view_outputs(loss, [features], batch, encoded.get("dense"))
