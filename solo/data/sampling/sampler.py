"""Which samples each rank reads: a rank's slice of one global batch, the same for every world size."""

from __future__ import annotations

from typing import Callable, List

import torch

from solo.errors import ConfigError


class GlobalBatchSampler:
    """Yields, for one rank, its contiguous slice of each global batch as a list of (epoch, index) keys.

    The global order depends only on (seed, epoch): a random permutation, or `order(seed, epoch)` when
    given (e.g. shards shuffled with locality, solo.data.sources.shards). Global batch k is split into W
    consecutive slices of `batch_size`: one process with batch 2b sees exactly the samples of two
    processes with batch b, in rank order. The last incomplete global batch is dropped so every step
    has the same size.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        order: Callable[[int, int], List[int]] | None = None,
    ):
        self.global_batch = batch_size * world_size
        if self.global_batch > num_samples:
            raise ConfigError(
                f"the global batch ({batch_size} per process x {world_size} processes = {self.global_batch}) "
                f"is larger than the dataset ({num_samples} samples); lower data.batch_size"
            )
        self.num_samples, self.batch_size, self.rank, self.seed = num_samples, batch_size, rank, seed
        self.order = order
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Start `epoch` at batch `start_batch` (resuming mid-epoch skips the batches already trained on)."""
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        return self.num_samples // self.global_batch - self.start_batch

    def __iter__(self):
        if self.order is not None:
            order = self.order(self.seed, self.epoch)
        else:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        for b in range(self.start_batch, self.num_samples // self.global_batch):
            start = b * self.global_batch + self.rank * self.batch_size
            yield [(self.epoch, i) for i in order[start : start + self.batch_size]]
