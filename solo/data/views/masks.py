"""Patch masks, drawn per sample in the data workers like the views' parameters.

A mask generator is a picklable callable that returns a bool tensor, True where a patch is hidden. MultiViewDataset
calls it inside the sample's own seeded scope (seed, epoch, index, and a stream after the views'), so a sample's mask
does not depend on the world size, the number of workers, the read order or a resume; the batch carries it as
`batch["mask"]`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RandomMask:
    """MAE's masking: `round(ratio * num_patches)` patches hidden, chosen uniformly; every sample hides as many, so a
    batch's visible patches stack into one tensor."""

    num_patches: int
    ratio: float

    @property
    def hidden(self) -> int:
        return round(self.ratio * self.num_patches)

    def __call__(self) -> torch.Tensor:
        mask = torch.zeros(self.num_patches, dtype=torch.bool)
        mask[random.sample(range(self.num_patches), self.hidden)] = True
        return mask


@dataclass(frozen=True)
class BlockMask:
    """iBOT's and DINOv2's masks, one per global crop: with probability `probability` a crop hides a share of its
    patches drawn uniformly in [ratio_min, ratio_max], as rectangles (BEiT's block-wise masking: blocks of at least
    `min_block` patches, aspect ratios log-uniform in [0.3, 1 / 0.3], never past the share, so a share smaller than a
    block hides nothing). Drawn per sample, so the share does not depend on the batch (DINOv2 spreads the shares over
    each GPU's batch instead)."""

    grid: tuple[int, int]
    views: int
    probability: float
    ratio_min: float
    ratio_max: float
    min_block: int = 4

    @property
    def hidden(self) -> int:
        """The most patches a crop hides."""
        return int(self.ratio_max * self.grid[0] * self.grid[1])

    def __call__(self) -> torch.Tensor:
        masks = torch.zeros(self.views, self.grid[0] * self.grid[1], dtype=torch.bool)
        for view in range(self.views):
            if random.random() < self.probability:
                target = int(random.uniform(self.ratio_min, self.ratio_max) * masks.shape[1])
                masks[view] = self._blocks(target).flatten()
        return masks

    def _blocks(self, target: int) -> torch.Tensor:
        height, width = self.grid
        mask = torch.zeros(height, width, dtype=torch.bool)
        count = 0
        while count < target:
            added = 0
            for _ in range(10):  # a few tries for a block that hides new patches without passing the target
                left = target - count
                area = random.uniform(self.min_block, max(self.min_block, left))
                aspect = math.exp(random.uniform(math.log(0.3), math.log(1 / 0.3)))
                h = min(height, max(1, round(math.sqrt(area * aspect))))
                w = min(width, max(1, round(math.sqrt(area / aspect))))
                top, start = random.randint(0, height - h), random.randint(0, width - w)
                new = h * w - int(mask[top : top + h, start : start + w].sum())
                if 0 < new <= left:
                    mask[top : top + h, start : start + w] = True
                    added = new
                    break
            if not added:
                break
            count += added
        return mask
