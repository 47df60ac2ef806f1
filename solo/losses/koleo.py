"""KoLeo (Sablayrolles et al., 2019), DINOv2's regulariser: spread the embeddings by rewarding the distance from
each to its nearest neighbour, -mean log d(x_i, nearest other x_j).

DINOv2's code looks for the neighbour inside each GPU's batch, so the loss changes with the number of GPUs (DINOv3
moved to a distributed version). Here each rank's embeddings look for their neighbour in the gathered GLOBAL batch,
and the gradient reaches the neighbour wherever it lives (the gather's backward is a reduce-scatter): the loss and
its gradient are those of one process on the whole batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import gather, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES
from solo.losses.contrastive import _global_rows

__all__ = ["koleo_loss"]


def koleo_loss(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """-mean over the global batch of log ||x_i - x_nn(i) + eps||, rows L2-normalised first, nn(i) the nearest other
    row of the global batch (by cosine); W times this rank's share."""
    with torch.autocast(x.device.type, enabled=False):
        x = F.normalize(full_precision(x), dim=-1, eps=eps)
        sizes, rows = _global_rows(x.shape[0], x.device)
        everyone = gather(x, sizes)
        with torch.no_grad():
            similarity = x @ everyone.T
            similarity[torch.arange(len(x), device=x.device), rows] = -2.0  # not itself: cosines are >= -1
            nearest = similarity.argmax(dim=1)
        distance = F.pairwise_distance(x, everyone[nearest], eps=eps)
        return -torch.log(distance + eps).sum() * (world_size() / sum(sizes))


@LOSSES.register("koleo")  # a case for the gradient checker (python -m solo.losses.check)
def koleo_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return koleo_loss(z1) + koleo_loss(z2)
