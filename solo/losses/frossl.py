"""FroSSL's loss: the log of the squared Frobenius norm of each view's covariance over the global batch, and the mean
squared error between the views."""

from __future__ import annotations

import torch

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES

__all__ = ["frossl_loss"]


def frossl_loss(z1: torch.Tensor, z2: torch.Tensor, invariance_weight: float = 1.0) -> torch.Tensor:
    """FroSSL (Skean et al., 2024), as its authors' two-view code computes it: each view's (N, D) embeddings centred
    with their column means and each column scaled to norm sqrt(D) (the code standardises first, which this scaling
    undoes: the same), then with K_v = (1/N) z_v^T z_v the (D, D) covariance,

        L = invariance_weight * (1/(N D)) ||z_1 - z_2||_F^2 + sum_v log ||K_v||_F^2.

    Every statistic is the GLOBAL batch's: the column sums go through one differentiable all-reduce, the centred
    (D, D) products through another (the column norms are their diagonal), N the global count, so K_v is whole on
    every rank (a rank with no rows adds zeros); its backward sums to W times the gradient. The D x D covariance is the
    one that sums over ranks (the N x N Gram, with the same norm, would need the rows gathered). The squared error is
    returned as W/N times this rank's sum: both sum over ranks to W times their value, as solo's losses do.
    """
    check_pair(z1, z2, "z1", "z2")
    check_non_negative(invariance_weight, "invariance_weight")
    with torch.autocast(z1.device.type, enabled=False):
        views = torch.stack([full_precision(z1), full_precision(z2)])  # (2, n, D)
        total = sum(batch_sizes(views.shape[1], views.device))
        if total < 2:
            raise ValueError(f"frossl_loss needs a global batch of at least 2 samples (its covariance), got {total}")
        d = views.shape[2]
        centred = views - all_reduce(views.sum(dim=1, keepdim=True)) / total
        products = all_reduce(centred.transpose(1, 2) @ centred)  # (2, D, D)
        scale = (d / products.diagonal(dim1=1, dim2=2)).sqrt()  # (2, D): each column to norm sqrt(D)
        scaled = centred * scale.unsqueeze(1)
        covariance = products * (scale.unsqueeze(2) * scale.unsqueeze(1)) / total
        regulariser = covariance.square().sum(dim=(1, 2)).log().sum()
        invariance = (scaled[0] - scaled[1]).square().sum() * (world_size() / (total * d))
        return invariance_weight * invariance + regulariser


@LOSSES.register("frossl")  # a case for the gradient checker: the authors' weights
def frossl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return frossl_loss(z1, z2, invariance_weight=1.0)
