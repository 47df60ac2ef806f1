"""State that methods carry from step to step, kept the same on every number of processes."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.distributed import all_reduce, gather, rank, world_size
from solo.distributed.env import detect
from solo.errors import ConfigError


def check_queue_size(cfg) -> None:
    """A queue method's `method.queue_size` must hold a global batch: each step pushes all of its rows at once."""
    global_batch = cfg.data.batch_size * detect().world_size
    if cfg.method.queue_size < global_batch:
        raise ConfigError(
            f"method.queue_size={cfg.method.queue_size} is smaller than the global batch ({global_batch}): "
            f"each step pushes the whole global batch's rows into method={cfg.method.name}'s queue; raise "
            "method.queue_size"
        )


class GlobalQueue(nn.Module):
    """A FIFO of the last `size` rows pushed (MoCo's queue of negatives, NNCLR's support set), identical on every rank.

    `push` gathers every rank's rows in rank order, which is the global batch's sample order (each rank reads a
    contiguous slice of it), so the queue holds exactly what one process on the whole batch would hold; a queue
    filled with each rank's own rows would hold other negatives at every world size. Its rows and the count of
    rows pushed are buffers: in the model's state_dict, hence in checkpoints (resume is exact). Methods push in
    `batch_loss`, after the loss: under trainer.accumulate the step runs `batch_loss` on the whole batch and restores the
    buffers after its gradient-only passes, so the queue moves once per optimizer step, with the step's batch.
    Until `size` rows have been pushed, `valid()` marks the rows that hold something (no host read).
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.size = size
        self.register_buffer("rows", torch.zeros(size, dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))  # rows pushed since the start

    def valid(self) -> torch.Tensor:
        """(size,) booleans: the rows that hold a pushed row."""
        return torch.arange(self.size, device=self.rows.device) < self.count

    @torch.no_grad()
    def push(self, rows: torch.Tensor) -> None:
        """Append every rank's `rows` (in rank order), dropping the oldest; at most `size` rows per push."""
        rows = gather(rows.detach())
        if len(rows) > self.size:
            raise ValueError(
                f"pushed {len(rows)} rows at once into a queue of {self.size}: the queue must hold a global batch"
            )
        index = (self.count + torch.arange(len(rows), device=rows.device)) % self.size
        self.rows.index_copy_(0, index, rows.to(self.rows.dtype))
        self.count += len(rows)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Each row of `z`'s nearest pushed row by cosine similarity (NNCLR's support-set lookup; the rows are pushed
        unit-norm), without gradient. Before anything was pushed, the row of `z` itself, normalised."""
        return self.neighbours(z, 1)[:, 0]

    def neighbours(self, z: torch.Tensor, k: int) -> torch.Tensor:
        """(len(z), k, dim): each row's k nearest pushed rows, nearest first, without gradient; while fewer than k
        rows were pushed, the row of `z` itself (normalised) fills the places left."""
        z = F.normalize(z.detach(), dim=1)
        rows = self.rows.to(z.dtype)
        scores, index = (z @ rows.T).masked_fill(~self.valid(), float("-inf")).topk(k, dim=1)
        return torch.where(torch.isfinite(scores)[..., None], rows[index], z[:, None])


class MemoryBank(nn.Module):
    """Every training sample's latest embedding of each view, by dataset index (DeepClusterV2's memory), identical on
    every rank: `store` gathers every rank's indices and rows, so the bank is what one process on the whole batch
    would hold. Buffers, hence in checkpoints; written in `batch_loss`, so once per optimizer step under accumulation."""

    def __init__(self, num_samples: int, views: int, dim: int):
        super().__init__()
        self.register_buffer("rows", torch.zeros(views, num_samples, dim))
        self.register_buffer("filled", torch.zeros(num_samples, dtype=torch.bool))

    @torch.no_grad()
    def store(self, index: torch.Tensor, views: list[torch.Tensor]) -> None:
        index = gather(index)
        for bank, rows in zip(self.rows, views):
            bank.index_copy_(0, index, gather(rows.detach()).to(bank.dtype))
        self.filled[index] = True


class MomentumMemoryBank(nn.Module):
    """Every training sample's running average of its embeddings, by dataset index, as unit rows (NPID's and PIRL's
    memory), identical on every rank. It starts as random unit rows (the same on every rank: drawn from torch's
    generator while the model is built, before the ranks' streams part). `update` gathers every rank's indices and
    rows and moves each entry to normalise(momentum * entry + (1 - momentum) * row), so the bank is what one process on
    the whole batch would hold; a bank updated with each rank's own rows would differ at every world size. A buffer,
    hence in checkpoints; updated in `batch_loss`, after the loss, so once per optimizer step under accumulation."""

    def __init__(self, num_samples: int, dim: int, momentum: float):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("rows", F.normalize(torch.rand(num_samples, dim) * 2 - 1, dim=1))

    @torch.no_grad()
    def update(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        index, rows = gather(index), F.normalize(gather(rows.detach()), dim=1).to(self.rows.dtype)
        blended = self.momentum * self.rows[index] + (1 - self.momentum) * rows
        self.rows.index_copy_(0, index, F.normalize(blended, dim=1))


@torch.no_grad()
def kmeans(points: torch.Tensor, k: int, iterations: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means of the unit rows `points` (identical on every rank): (k unit centroids, each point's cluster).

    The work is split: each rank assigns its share of the points (shares differ by at most one point, a rank may have
    none) and the centroids' sums and counts are all-reduced, so every rank ends with the same centroids, those of one
    process on all the points up to the order of the sums' additions. The start is k distinct points drawn with
    `seed`, the same on every rank; an emptied cluster keeps its centroid."""
    n = len(points)
    world, me = world_size(), rank()
    shares = [n // world + (r < n % world) for r in range(world)]
    start = sum(shares[:me])
    mine = points[start : start + shares[me]]
    generator = torch.Generator().manual_seed(seed)
    centroids = points[torch.randperm(n, generator=generator)[:k].to(points.device)]
    for _ in range(iterations):
        assigned = (mine @ centroids.T).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, assigned, mine)
        counts = torch.bincount(assigned, minlength=k).to(points.dtype)
        sums, counts = all_reduce(sums), all_reduce(counts)
        centroids = torch.where(counts[:, None] > 0, F.normalize(sums, dim=1), centroids)
    return centroids, gather((mine @ centroids.T).argmax(dim=1), shares)
