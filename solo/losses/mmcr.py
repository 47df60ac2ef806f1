"""MMCR's loss: the nuclear norm of the global batch's centroid matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, gather, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES

__all__ = ["mmcr_loss"]


def mmcr_loss(views: list[torch.Tensor], lambd: float = 0.0) -> torch.Tensor:
    """Maximum Manifold Capacity Representations (Yerxa et al., 2023): with u the L2-normalised (N, D) embeddings of
    each of the V views (normalised here) and c_n = (1/V) sum_v u_{v,n} each sample's centroid,

        L = -||C||_* + lambd * (1/N) sum_n ||U_n||_*,

    C the (N, D) matrix of the GLOBAL batch's centroids, U_n the (V, D) matrix of sample n's views and ||.||_* the
    nuclear norm (the sum of the singular values). Any views of one sample count alike (global and local crops).

    ||C||_* couples every sample of the global batch: the centroids are gathered (a reduce-scatter backward; ranks
    may hold different numbers of rows, or none) and every rank takes the singular values of the whole C, so the term
    is whole on every rank and its backward sums to W times its gradient (solo.distributed.collectives). The
    per-sample term is returned as W/N times this rank's sum: both sum over ranks to W times their value.
    """
    if not isinstance(views, (list, tuple)) or not views:
        raise ValueError("views must be a non-empty list of (batch, features) tensors")
    for i, view in enumerate(views[1:], start=1):
        check_pair(views[0], view, "views[0]", f"views[{i}]")
    check_non_negative(lambd, "lambd")
    with torch.autocast(views[0].device.type, enabled=False):
        units = torch.stack([F.normalize(full_precision(v), dim=1) for v in views], dim=1)  # (n, V, D)
        sizes = batch_sizes(units.shape[0], units.device)
        total = sum(sizes)
        if total < 1:
            raise ValueError("mmcr_loss needs a global batch of at least 1 sample, got 0")
        centroids = gather(units.mean(dim=1), sizes)  # (N, D), on every rank
        loss = -torch.linalg.svdvals(centroids).sum()
        if lambd:
            loss = loss + lambd * torch.linalg.svdvals(units).sum() * (world_size() / total)
        return loss


@LOSSES.register("mmcr")  # a case for the gradient checker: three views (z1 * z2 a third one), both terms
def mmcr_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return mmcr_loss([z1, z2, z1 * z2], lambd=0.5)
