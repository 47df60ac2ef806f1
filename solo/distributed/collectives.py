"""Differentiable collectives.

Gradient convention (the one thing to remember): the objective that autograd differentiates is the
*sum over ranks* of what each rank returns, so every collective's backward is its exact adjoint —
all-gather's is a reduce-scatter sum, all-reduce-sum's is an all-reduce sum. Losses return W times their
share of the global loss, so that sum is W * L and DDP's gradient mean brings it back to exactly grad L.
In a single process (no process group) every function here is the identity.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.distributed as dist

from solo.distributed.env import rank, world_size

# Newer torch renamed the tensor collectives (the old names warn there); older versions have the old names only
# (docs/performance.md lists the torch versions checked).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# The sizes known inside a batch_sizes_remembered block, None outside: scoped to the block (and thread), not the process.
_known_sizes: ContextVar[dict | None] = ContextVar("solo_known_batch_sizes", default=None)


@contextmanager
def batch_sizes_remembered(known: dict):
    """Inside the block, `batch_sizes` exchanges sizes once per local size and then answers from `known`
    (kept by the caller across blocks): one all-gather and host read per shape instead of one per loss call.

    Only for code that every rank runs with the same sequence of local sizes whenever one of them repeats
    (the training step: every rank's batch is data.batch_size); elsewhere ranks may change sizes independently,
    and a rank answering from memory while another exchanges would hang.
    """
    token = _known_sizes.set(known)
    try:
        yield
    finally:
        _known_sizes.reset(token)


def batch_sizes(n_local: int, device: torch.device | None = None) -> list[int]:
    """Every rank's batch size, in rank order (one small all-gather, or none: see batch_sizes_remembered)."""
    if world_size() == 1:
        return [n_local]
    known = _known_sizes.get()
    if known is not None and n_local in known:
        return known[n_local]
    size = torch.tensor([n_local], dtype=torch.long, device=device)
    sizes = torch.empty(world_size(), dtype=torch.long, device=device)
    _all_gather(sizes, size)
    sizes = sizes.tolist()
    if known is not None:
        known[n_local] = sizes
    return sizes


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        ctx.sizes = sizes
        longest = max(sizes)
        # Ragged batches travel padded to the longest one and are trimmed on arrival.
        out = x.new_empty((longest * len(sizes), *x.shape[1:]))
        _all_gather(out, _pad_rows(x.contiguous(), longest))
        if all(s == longest for s in sizes):
            return out
        return torch.cat([chunk[:s] for chunk, s in zip(out.split(longest), sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sizes = ctx.sizes
        longest = max(sizes)
        padded = torch.cat([_pad_rows(g, longest) for g in grad.contiguous().split(sizes)])
        mine = grad.new_empty((longest, *grad.shape[1:]))
        _reduce_scatter(mine, padded, op=dist.ReduceOp.SUM)
        return mine[: sizes[rank()]], None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


def gather(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0, in rank order; backward is a reduce-scatter sum.

    `sizes` (from `batch_sizes`) saves the size exchange when the caller already has it; ranks may
    hold different numbers of rows.
    """
    if world_size() == 1:
        return x
    if sizes is None:
        sizes = batch_sizes(x.shape[0], x.device)
    return _Gather.apply(x, sizes)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over ranks; backward is the same sum of the incoming gradients."""
    if world_size() == 1:
        return x
    return _AllReduceSum.apply(x)


def sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `x`, added here in rank order (the same on every rank); not differentiable. For the
    small tensors it is meant for (a BatchNorm's per-channel sums) one all-gather is the cheapest collective over gloo,
    cheaper than a reduce-scatter or an all-reduce (docs/performance.md)."""
    if world_size() == 1:
        return x
    every = x.new_empty((world_size(), x.numel()))
    _all_gather(every, x.reshape(1, -1).contiguous())
    return every.sum(0).view(x.shape)
