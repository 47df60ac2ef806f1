"""Process-group setup and differentiable collectives; see collectives.py for the gradient convention."""

from solo.distributed.collectives import all_reduce, batch_sizes, batch_sizes_remembered, gather
from solo.distributed.env import DistEnv, detect, init_distributed, rank, world_size

__all__ = [
    "DistEnv",
    "all_reduce",
    "batch_sizes",
    "batch_sizes_remembered",
    "detect",
    "gather",
    "init_distributed",
    "rank",
    "world_size",
]
