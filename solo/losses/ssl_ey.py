"""SSL-EY's loss: the Eckhart-Young objective of CCA on the global batch's covariances of the two views."""

from __future__ import annotations

import torch

from solo.distributed import all_reduce, batch_sizes
from solo.dtypes import full_precision
from solo.losses._checks import check_pair
from solo.losses.checked import LOSSES

__all__ = ["ssl_ey_loss"]


def ssl_ey_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """SSL-EY (Chapman et al., 2023): with Sigma_ab the (D, D) sample covariance of views a and b over the N pairs
    (centred with the batch's means, divided by N - 1),

        Gamma = Sigma_12 + Sigma_21,   Delta = Sigma_11 + Sigma_22,   L = -2 tr(Gamma) + ||Delta||_F^2,

    as the authors' code (jameschapman19/SSL-EY) and lightly's SSLEYLoss compute it: both covariances from the one
    batch (the paper's unbiased estimate takes Delta from two independent batches; its code does not).

    The covariances are the GLOBAL batch's: the column sums go through one differentiable all-reduce (the global
    means), then Delta's (D, D) sum and tr(Gamma)'s scalar through another, N the global count (a rank with no rows
    adds zeros); the loss is whole on every rank and its backward sums to W times its gradient.
    """
    check_pair(z1, z2, "z1", "z2")
    with torch.autocast(z1.device.type, enabled=False):
        views = torch.stack([full_precision(z1), full_precision(z2)])  # (2, n, D)
        total = sum(batch_sizes(views.shape[1], views.device))
        if total < 2:
            raise ValueError(f"ssl_ey_loss needs a global batch of at least 2 samples (its covariances), got {total}")
        d = views.shape[2]
        centred = views - all_reduce(views.sum(dim=1, keepdim=True)) / total
        delta = centred[0].T @ centred[0] + centred[1].T @ centred[1]
        cross = torch.linalg.vecdot(centred[0], centred[1]).sum(dim=0, keepdim=True)  # tr(z1^T z2)
        sums = all_reduce(torch.cat([delta.flatten(), cross])) / (total - 1)
        return -4 * sums[-1] + sums[:-1].view(d, d).square().sum()  # tr(Gamma) = 2 tr(Sigma_12)


@LOSSES.register("ssl_ey")
def ssl_ey_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return ssl_ey_loss(z1, z2)
