"""A batch's raw images of several sizes as one tensor, for the trip from a DataLoader worker to the training process.

A list of tensors crosses the process boundary one shared-memory file each, and is then pinned one tensor at a time:
for a batch of 64 JPEGs still encoded, about 14 ms of the training process's time per batch on this project's CPU
against 1.8 ms for one tensor of the same bytes (docs/performance.md), time taken from the thread that launches the
step's kernels. Packed, the batch's bytes are one tensor: one file, one pinned copy; the images come back as views of
it, each with its own shape and strides (an image decoded in the worker keeps its memory layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_DIMS = 3  # JPEG bytes (1-D) or pixels (3, H, W)


@dataclass
class PackedImages:
    """uint8 tensors of any shapes (up to MAX_DIMS dimensions) in one: `data` holds their bytes end to end, each in its
    own memory order; `layout` (N, 2 + 2 * MAX_DIMS) int64 holds each one's start, dimensions, sizes and strides."""

    data: torch.Tensor
    layout: torch.Tensor

    @classmethod
    def pack(cls, tensors: list[torch.Tensor]) -> PackedImages:
        dense = [_dense(t) for t in tensors]
        rows, start = [], 0
        for t in dense:
            pad = [0] * (MAX_DIMS - t.dim())
            rows.append([start, t.dim(), *t.shape, *pad, *t.stride(), *pad])
            start += t.numel()
        data = torch.cat([t if t.dim() == 1 else t.as_strided((t.numel(),), (1,)) for t in dense])
        return cls(data, torch.tensor(rows, dtype=torch.int64).view(-1, 2 + 2 * MAX_DIMS))

    def unpack(self) -> list[torch.Tensor]:
        """The tensors, as views of `data` (pinned where it is)."""
        out = []
        for start, dims, *rest in self.layout.tolist():
            out.append(self.data.as_strided(rest[:dims], rest[MAX_DIMS : MAX_DIMS + dims], start))
        return out

    def pin_memory(self) -> PackedImages:  # called by the DataLoader's pin-memory thread
        return PackedImages(self.data.pin_memory(), self.layout)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` itself where its elements fill its memory without gaps in some order of its dimensions (a (3, H, W) view of
    (H, W, 3) pixels, say), else a contiguous copy; either way its memory read in order is `t.numel()` elements."""
    if t.is_contiguous():  # JPEG bytes: no view made (a dispatched operation) per image
        return t
    order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
    return t if t.permute(order).is_contiguous() else t.contiguous()
