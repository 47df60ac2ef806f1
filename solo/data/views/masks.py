"""Patch masks, drawn per sample in the data workers like the views' parameters.

A mask generator is a picklable callable that returns a bool tensor, True where a patch is hidden. MultiViewDataset
calls it inside the sample's own seeded scope (seed, epoch, index, and a stream after the views'), so a sample's mask
does not depend on the world size, the number of workers, the read order or a resume; the batch carries it as
`batch["mask"]`.
"""

from __future__ import annotations

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
