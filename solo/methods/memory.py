"""State that methods carry from step to step, kept the same on every number of processes."""

from __future__ import annotations

import torch
import torch.nn as nn

from solo.distributed import gather


class GlobalQueue(nn.Module):
    """A FIFO of the last `size` rows pushed (MoCo's queue of negatives), identical on every rank.

    `push` gathers every rank's rows in rank order, which is the global batch's sample order (each rank reads a
    contiguous slice of it), so the queue holds exactly what one process on the whole batch would hold; a queue
    filled with each rank's own rows would hold other negatives at every world size. Its rows and the count of
    rows pushed are buffers: in the model's state_dict, hence in checkpoints (resume is exact). Methods push in
    `joint`, after the loss: under trainer.accumulate the step runs `joint` on the whole batch and restores the
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
            raise ValueError(f"pushed {len(rows)} rows at once into a queue of {self.size}: the queue must hold a global batch")
        index = (self.count + torch.arange(len(rows), device=rows.device)) % self.size
        self.rows.index_copy_(0, index, rows.to(self.rows.dtype))
        self.count += len(rows)
