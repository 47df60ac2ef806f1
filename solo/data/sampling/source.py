"""Stateful data sources: where the trainer reads its batches from, and where it stands in the data.

A source yields, for this rank, its share of each global batch, from its current position to the end of
the current epoch; `state_dict()` is that position, so a resumed run reads exactly the batches that
were not trained on yet, on any world size that keeps the global batch.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Protocol

import torch
from torch.utils.data import DataLoader

from solo.data.sampling.sampler import GlobalBatchSampler


def cores_per_process() -> int:
    """This process's share of the cores it may run on: those of its CPU affinity over the processes on the node."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def loader_workers(configured: int | None) -> int:
    """data.num_workers, or when unset what the machine has: one less than its CPUs per local process, at most 8."""
    if configured is not None:
        return configured
    return min(8, max(0, cores_per_process() - 1))


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
        self.prepare, self.ahead = None, False

    def prepare_with(self, prepare: Callable[[dict], dict], ahead: bool) -> None:
        """Yield `prepare(batch)` (the batch on the training device) rather than the loader's batch. With `ahead`,
        the next batch is read and prepared in a thread of its own while the consumer works on this one: on a GPU,
        the views' kernels are launched while the step launches its own, where one thread would launch both in turn.
        Only for a `prepare` that draws no random numbers and a loader whose workers read the samples: the samples'
        seeding (solo.data.sampling.seeding) sets the process's generators, which the step's thread also uses."""
        self.prepare, self.ahead = prepare, ahead

    def __iter__(self) -> Iterator[dict]:
        self.sampler.set_epoch(self.epoch, self.batch_in_epoch)
        if self.prepare is None:
            batches = iter(self.loader)
        else:
            batches = read_ahead(self.loader, self.prepare) if self.ahead else map(self.prepare, self.loader)
        for batch in batches:
            # Counted as the consumer receives it (not when read ahead), before the step runs: a checkpoint after the
            # step resumes past it, and never past the batch read ahead.
            self.batch_in_epoch += 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batch_in_epoch = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]


def read_ahead(batches: Iterable[dict], prepare: Callable[[dict], dict]) -> Iterator[dict]:
    """`prepare` of each of `batches`, in order, each read and prepared in a worker thread while the consumer holds
    the one before it. An exception from either is raised to the consumer at that batch's turn; closing the
    iterator waits for the batch in hand (the loader's workers are never left mid-batch)."""
    batches = iter(batches)
    end = object()

    def next_prepared():
        batch = next(batches, end)
        return end if batch is end else prepare(batch)

    with ThreadPoolExecutor(1, thread_name_prefix="solo-read-ahead") as thread:
        pending = thread.submit(next_prepared)
        while (batch := pending.result()) is not end:
            pending = thread.submit(next_prepared)
            yield batch


class EvenShards:
    """A dataset of dict samples dealt to `world_size` ranks in equal shares: rank r reads positions r, r + W, ...
    of ceil(N / W) * W positions, those past the end repeating the last sample with `"padding": True` (the real
    ones carry `"padding": False`). Every rank then runs the same number of batches of the same sizes, so a model
    sharded over the ranks (FSDP) gathers its parameters as often on each, and no rank is left without rows;
    evaluation drops the padding rows, so each sample counts once."""

    def __init__(self, dataset, world_size: int):
        self.dataset = dataset
        self.padded_len = -(-len(dataset) // world_size) * world_size

    def __getattr__(self, name: str):  # the wrapped dataset's own attributes (classes, prompts) stay visible
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __len__(self) -> int:
        return self.padded_len

    def __getitem__(self, position: int) -> dict:
        padding = position >= len(self.dataset)
        return self.dataset[len(self.dataset) - 1 if padding else position] | {"padding": padding}


def real_rows(batch: dict) -> torch.Tensor:
    """The rows of an eval_loader batch that are samples: not padding, nor an unreadable image skipped (solo.data
    EvalDataset's `"readable"`); a bool mask on the CPU."""
    return ~batch["padding"] & batch["readable"]


def eval_loader(dataset, batch_size: int, rank: int, world_size: int, **loader_args) -> DataLoader:
    """This rank's share of `dataset` (not empty), in batches of `batch_size`: as many batches, of the same sizes,
    as every other rank's (EvenShards). Consumers keep the rows whose `"padding"` is False."""
    shards = EvenShards(dataset, world_size)
    return DataLoader(shards, batch_size=batch_size, sampler=range(rank, len(shards), world_size), **loader_args)
