"""Stateful data sources: where the trainer reads its batches from, and where it stands in the data.

A source yields, for this rank, its share of each global batch, from its current position to the end of
the current epoch; `state_dict()` is that position, so a resumed run reads exactly the batches that
were not trained on yet, on any world size that keeps the global batch.
"""

from __future__ import annotations

import os
from typing import Iterator, Protocol

from torch.utils.data import DataLoader

from solo.data.sampling.sampler import GlobalBatchSampler


def loader_workers(configured: int | None) -> int:
    """data.num_workers, or when unset what the machine has: one less than its CPUs per local process, at most 8."""
    if configured is not None:
        return configured
    per_process = len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return min(8, max(0, per_process - 1))


class DataSource(Protocol):
    """What the trainer reads batches from; every source implements it (MapDataSource: the map-style datasets,
    WebDataset shards and Hugging Face datasets alike). Opening one reads no samples."""

    global_batch: int
    steps_per_epoch: int | None  # None: a stream without epochs
    epoch: int
    batch_in_epoch: int  # the position: batches of this epoch already read

    def __iter__(self) -> Iterator[dict]:
        """This rank's share of each global batch, from the position to the end of the epoch."""

    def set_epoch(self, epoch: int) -> None:
        """Go to the first batch of `epoch`."""

    def state_dict(self) -> dict:
        """The position: a resumed run reads exactly the batches not trained on yet, on any world size."""

    def load_state_dict(self, state: dict) -> None: ...


class MapDataSource:
    """A DataSource over a map-style dataset keyed by (epoch, index), read through the global-batch sampler and a
    DataLoader."""

    def __init__(self, dataset, batch_size: int, rank: int, world_size: int, seed: int, order=None, **loader_args):
        self.epoch, self.batch_in_epoch = 0, 0
        self.sampler = GlobalBatchSampler(len(dataset), batch_size, rank, world_size, seed, order)
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, **loader_args)
        self.global_batch = self.sampler.global_batch
        self.steps_per_epoch = len(dataset) // self.global_batch

    def __iter__(self) -> Iterator[dict]:
        self.sampler.set_epoch(self.epoch, self.batch_in_epoch)
        for batch in self.loader:
            self.batch_in_epoch += 1  # counted before the step runs: a checkpoint after it resumes past it
            yield batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batch_in_epoch = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
