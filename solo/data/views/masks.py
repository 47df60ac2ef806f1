"""Patch masks, drawn per sample in the data workers like the views' parameters.

A mask generator is a picklable callable that returns a bool tensor, True where a patch is hidden, drawn from the
`rng` it is given (a random.Random; Python's `random` module by default). A method asks for one in its batches with
solo.data.views.batch_spec.PatchMasks: the data workers call it with the sample's own generator (seed, epoch, index,
and a stream after the views'), so a sample's mask does not depend on the world size, the number of workers, the
read order or a resume; the batch carries it as `batch["mask"]`. The masks are drawn in numpy and become a tensor at
the end (torch.from_numpy): tensor operations per block would cost the workers tens of operations a sample.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from solo.errors import ConfigError


@dataclass(frozen=True)
class RandomMask:
    """MAE's masking: `round(ratio * num_patches)` patches hidden, chosen uniformly; every sample hides as many, so a
    batch's visible patches stack into one tensor."""

    num_patches: int
    ratio: float

    @property
    def hidden(self) -> int:
        return round(self.ratio * self.num_patches)

    def __call__(self, rng=random) -> torch.Tensor:
        mask = np.zeros(self.num_patches, dtype=bool)
        mask[rng.sample(range(self.num_patches), self.hidden)] = True
        return torch.from_numpy(mask)


@dataclass(frozen=True)
class PredictedRandomMask:
    """CrossMAE's masking: MAE's (`round(ratio * num_patches)` patches hidden, chosen uniformly), and
    `round(predict_ratio * num_patches)` of the hidden ones, chosen uniformly, reconstructed (the official code's
    kept_mask_ratio, a share of all the patches). Every sample hides and predicts as many, so a batch's patches stack.
    Returns (2, num_patches): row 0 the hidden patches, row 1 the predicted ones."""

    num_patches: int
    ratio: float
    predict_ratio: float

    @property
    def hidden(self) -> int:
        return round(self.ratio * self.num_patches)

    @property
    def predicted(self) -> int:
        return round(self.predict_ratio * self.num_patches)

    def __call__(self, rng=random) -> torch.Tensor:
        hidden = rng.sample(range(self.num_patches), self.hidden)
        mask = np.zeros((2, self.num_patches), dtype=bool)
        mask[0, hidden] = True
        mask[1, rng.sample(hidden, self.predicted)] = True
        return torch.from_numpy(mask)


@dataclass(frozen=True)
class CoarseRandomMask:
    """SimMIM's masking: the grid of patches cut into cells of `scale` x `scale` patches (SimMIM's mask patches, e.g.
    32 px over 16 px patches: scale 2), and `ceil(ratio * cells)` cells hidden, chosen uniformly (its
    MaskGenerator's count); every patch of a hidden cell is hidden. Returns (patches,), row-major."""

    grid: tuple[int, int]
    scale: int
    ratio: float

    @property
    def hidden(self) -> int:
        cells = (self.grid[0] // self.scale) * (self.grid[1] // self.scale)
        return math.ceil(self.ratio * cells) * self.scale**2

    def __call__(self, rng=random) -> torch.Tensor:
        rows, cols = self.grid[0] // self.scale, self.grid[1] // self.scale
        cells = np.zeros(rows * cols, dtype=bool)
        cells[rng.sample(range(rows * cols), math.ceil(self.ratio * rows * cols))] = True
        cells = cells.reshape(rows, cols)
        return torch.from_numpy(cells.repeat(self.scale, 0).repeat(self.scale, 1).flatten())


@dataclass(frozen=True)
class PrefixMask:
    """AIM's prefix: the first K patches in raster order, K drawn uniformly in {1, ..., patches - 1}, attend to each
    other both ways; the others are predicted, each from the patches before it. Returns (patches,), True where a
    patch is predicted (after the prefix)."""

    num_patches: int

    def __call__(self, rng=random) -> torch.Tensor:
        return torch.from_numpy(np.arange(self.num_patches) >= rng.randint(1, self.num_patches - 1))


def rolled_block(grid: tuple[int, int], visible: int, min_aspect: float, rng) -> np.ndarray:
    """CAPI's and Franca's shown patches (their InverseBlockMasking with `roll`): one rectangle of at least `visible`
    patches, its aspect ratio log-uniform in [min_aspect, 1 / min_aspect] as far as the grid allows, cut to `visible`
    in raster order, then rolled by a random shift on both axes, so that it may wrap round the edges. Returns
    (patches,) bool, True where shown."""
    height, width = grid
    low = max(math.log(min_aspect), math.log(visible / width**2))
    high = min(-math.log(min_aspect), math.log(height**2 / (visible + 1e-5)))
    aspect = math.exp(rng.uniform(low, high))
    h, w = math.ceil(math.sqrt(visible * aspect)), math.ceil(math.sqrt(visible / aspect))
    top, left = rng.randint(0, height - h), rng.randint(0, width - w)
    block = np.zeros((height, width), dtype=bool)
    block[top : top + h, left : left + w] = True
    shown = np.zeros(height * width, dtype=bool)
    shown[np.flatnonzero(block)[:visible]] = True
    shift = (rng.randint(0, height - 1), rng.randint(0, width - 1))
    return np.roll(shown.reshape(height, width), shift, (0, 1)).flatten()


@dataclass(frozen=True)
class BlockMask:
    """iBOT's and DINOv2's masks, one per global crop: with probability `probability` a crop hides a share of its
    patches drawn uniformly in [ratio_min, ratio_max], as rectangles (BEiT's block-wise masking: blocks of at least
    `min_block` patches, aspect ratios log-uniform in [0.3, 1 / 0.3], never past the share, so a share smaller than a
    block hides nothing). With `rolled_inverse` (Franca's masks) the crop instead shows one rolled_block of the other
    patches (aspect ratios in [0.3, 1 / 0.3], as Franca's MaskingGenerator) and hides exactly the share. Drawn per
    sample, so the share does not depend on the batch (DINOv2 spreads the shares over each GPU's batch instead)."""

    grid: tuple[int, int]
    views: int
    probability: float
    ratio_min: float
    ratio_max: float
    min_block: int = 4
    rolled_inverse: bool = False

    @property
    def hidden(self) -> int:
        """The most patches a crop hides."""
        return int(self.ratio_max * self.grid[0] * self.grid[1])

    def __call__(self, rng=random) -> torch.Tensor:
        patches = self.grid[0] * self.grid[1]
        masks = np.zeros((self.views, patches), dtype=bool)
        for view in range(self.views):
            if rng.random() < self.probability:
                target = int(rng.uniform(self.ratio_min, self.ratio_max) * patches)
                if not self.rolled_inverse:
                    masks[view] = self._blocks(target, rng).flatten()
                elif target:  # nothing hidden: Franca's generator shows the whole crop
                    masks[view] = ~rolled_block(self.grid, patches - target, 0.3, rng) if target < patches else True
        return torch.from_numpy(masks)

    def _blocks(self, target: int, rng) -> np.ndarray:
        height, width = self.grid
        mask = np.zeros((height, width), dtype=bool)
        count = 0
        while count < target:
            added = 0
            for _ in range(10):  # a few tries for a block that hides new patches without passing the target
                left = target - count
                area = rng.uniform(self.min_block, max(self.min_block, left))
                aspect = math.exp(rng.uniform(math.log(0.3), math.log(1 / 0.3)))
                h = min(height, max(1, round(math.sqrt(area * aspect))))
                w = min(width, max(1, round(math.sqrt(area / aspect))))
                top, start = rng.randint(0, height - h), rng.randint(0, width - w)
                new = h * w - int(mask[top : top + h, start : start + w].sum())
                if 0 < new <= left:
                    mask[top : top + h, start : start + w] = True
                    added = new
                    break
            if not added:
                break
            count += added
        return mask


@dataclass(frozen=True)
class BEiTMask:
    """BEiT's block-wise mask of a single view (data2vec, MaskFeat): a share `ratio` of the patches hidden as
    BlockMask's rectangles of at least `min_block` patches; (patches,) bool, like RandomMask's."""

    grid: tuple[int, int]
    ratio: float
    min_block: int

    def __call__(self, rng=random) -> torch.Tensor:
        return BlockMask(self.grid, 1, 1.0, self.ratio, self.ratio, self.min_block)(rng)[0]


@dataclass(frozen=True)
class MultiBlockMask:
    """I-JEPA's masks: `targets` rectangles to predict, each covering a share of the patches drawn uniformly in
    `target_scale` with an aspect ratio (height / width) drawn uniformly in `target_aspect`; and one square context
    block covering a share drawn in `context_scale`, minus every target patch, with at least `min_context` patches
    left (redrawn otherwise). Returns (1 + targets, patches): row 0 the context, then one row per target.

    I-JEPA's collator draws the block sizes once per batch and cuts every sample's masks to the smallest in its GPU's
    batch, so what a sample sees depends on its batch-mates and the world size. Here everything is drawn per sample
    and nothing is cut: a batch stacks because every row has the same length, and the method pads each sample's
    patches to `most_context` / `most_target` and keeps the padding out of attention and out of the loss."""

    grid: tuple[int, int]
    targets: int
    target_scale: tuple[float, float]
    target_aspect: tuple[float, float]
    context_scale: tuple[float, float]
    min_context: int = 1

    def _size(self, scale: float, aspect: float) -> tuple[int, int]:
        area = scale * self.grid[0] * self.grid[1]
        height = min(self.grid[0], max(1, round(math.sqrt(area * aspect))))
        return height, min(self.grid[1], max(1, round(math.sqrt(area / aspect))))

    def _most(self, scale: tuple[float, float], aspect: tuple[float, float]) -> int:
        """The largest block these ranges can draw: the height grows with the scale and the aspect, the width with
        the scale and falls with the aspect, so the corners of the ranges bound every draw."""
        return min(
            self.grid[0] * self.grid[1],
            self._size(scale[1], aspect[1])[0] * self._size(scale[1], aspect[0])[1],
        )

    @property
    def most_target(self) -> int:
        return self._most(self.target_scale, self.target_aspect)

    @property
    def most_context(self) -> int:
        return self._most(self.context_scale, (1.0, 1.0))

    def _block(self, scale: tuple[float, float], aspect: tuple[float, float], rng) -> np.ndarray:
        h, w = self._size(rng.uniform(*scale), rng.uniform(*aspect))
        top, left = rng.randint(0, self.grid[0] - h), rng.randint(0, self.grid[1] - w)
        block = np.zeros(self.grid, dtype=bool)
        block[top : top + h, left : left + w] = True
        return block.flatten()

    def __call__(self, rng=random) -> torch.Tensor:
        for _ in range(100):
            targets = [self._block(self.target_scale, self.target_aspect, rng) for _ in range(self.targets)]
            context = self._block(self.context_scale, (1.0, 1.0), rng) & ~np.stack(targets).any(axis=0)
            if int(context.sum()) >= self.min_context:
                return torch.from_numpy(np.stack([context, *targets]))
        raise ConfigError(
            f"no context of at least {self.min_context} patches was left beside {self.targets} targets in 100 draws "
            f"on a {self.grid[0]} x {self.grid[1]} grid: use fewer or smaller targets (method.num_targets, "
            "method.target_scale_max), a larger context (method.context_scale_min) or a smaller minimum "
            "(method.min_context_patches)"
        )


@dataclass(frozen=True)
class InverseBlockMask:
    """CAPI's masks (its InverseBlockMasking with `roll`): the visible patches are rolled_block's `patches - hidden`;
    the others, `int(ratio * patches)`, are hidden; `predicted` of them, chosen uniformly (CAPI's prediction subsampling), are
    predicted. Every sample hides and predicts as many, so a batch's patches stack. Returns (2, patches): row 0 the
    hidden patches, row 1 the predicted ones."""

    grid: tuple[int, int]
    ratio: float
    subsampling: float
    min_aspect: float = 0.5

    @property
    def hidden(self) -> int:
        return int(self.ratio * self.grid[0] * self.grid[1])

    @property
    def predicted(self) -> int:
        return int(self.subsampling * self.hidden)

    def __call__(self, rng=random) -> torch.Tensor:
        hidden = ~rolled_block(self.grid, self.grid[0] * self.grid[1] - self.hidden, self.min_aspect, rng)
        predicted = np.zeros_like(hidden)
        predicted[rng.sample(np.flatnonzero(hidden).tolist(), self.predicted)] = True
        return torch.from_numpy(np.stack([hidden, predicted]))


@dataclass(frozen=True)
class Data2Vec2Masks:
    """data2vec 2.0's masks, `masks` per image (its clone_batch), each drawn as the official compute_block_mask_2d
    with inverse_mask: the visible patches are squares of side `block` round `int(patches * (1 - ratio + adjust) /
    block**2)` centres drawn uniformly with replacement (cut at the edges), then made exactly `int(patches * (1 -
    ratio))` by showing or hiding patches chosen uniformly; the others are hidden. Every mask hides as many, so a
    batch's visible patches stack. Returns (masks, patches), True where hidden."""

    grid: tuple[int, int]
    ratio: float
    block: int
    adjust: float
    masks: int

    @property
    def visible(self) -> int:
        return int(self.grid[0] * self.grid[1] * (1 - self.ratio))

    def __call__(self, rng=random) -> torch.Tensor:
        return torch.from_numpy(np.stack([self._one(rng) for _ in range(self.masks)]))

    def _one(self, rng) -> np.ndarray:
        height, width = self.grid
        patches = height * width
        shown = np.zeros((height, width), dtype=bool)
        before = self.block // 2  # a centre's square spans [c - block // 2, c - block // 2 + block)
        for _ in range(int(patches * (1 - self.ratio + self.adjust) / self.block**2)):
            centre = rng.randrange(patches)
            row, col = divmod(centre, width)
            top, left = max(0, row - before), max(0, col - before)
            shown[top : row - before + self.block, left : col - before + self.block] = True
        shown = shown.flatten()
        count = int(shown.sum())
        if count > self.visible:
            shown[rng.sample(np.flatnonzero(shown).tolist(), count - self.visible)] = False
        elif count < self.visible:
            shown[rng.sample(np.flatnonzero(~shown).tolist(), self.visible - count)] = True
        return ~shown
