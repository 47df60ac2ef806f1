"""One way to wrap a model for data-parallel training: global BatchNorm statistics, then DDP."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from solo.distributed import world_size
from solo.distributed.batchnorm import convert_sync_batchnorm

# Buffers need no sync in the forward: with SyncBatchNorm every rank computes the same running statistics.
# torch >= 2.15 names this forward_sync_buffers (broadcast_buffers warns there); older versions the other.
_DDP_ARGS = inspect.signature(nn.parallel.DistributedDataParallel).parameters
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_ARGS else {"broadcast_buffers": False}
)


def distribute(model: nn.Module, device: torch.device, *, sync_batchnorm: bool, keep_local: tuple = ()) -> nn.Module:
    """Convert `model`'s BatchNorms to SyncBatchNorm in place (W > 1 and `sync_batchnorm`, except inside the
    `keep_local` submodules) and wrap it in DDP; returns what to call (`model` itself on one process)."""
    if world_size() == 1:
        return model
    if sync_batchnorm:
        convert_sync_batchnorm(model, skip=keep_local)
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None, **NO_BUFFER_SYNC
    )
