"""TiCo's loss: invariance, and covariance contrast against a running covariance of the global batch's embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES

__all__ = ["tico_loss"]


def tico_loss(
    z1: torch.Tensor, z2: torch.Tensor, covariance: torch.Tensor, beta: float = 0.9, rho: float = 8.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """TiCo (Zhu et al., 2022): with u1, u2 the L2-normalised (N, D) embeddings of the two views
    (normalised here) and C the running covariance of earlier steps (`covariance`, D x D, a constant),

        B = (1/N) u1^T u1,   C' = beta * C + (1 - beta) * B,
        L = -(1/N) sum_i <u1_i, u2_i> + rho * (1/N) sum_i u1_i^T C' u1_i.

    B takes gradient, as in the TiCo-pytorch code that lightly's TiCoLoss cites (C' is detached only after the step;
    lightly detaches B too). Returns
    (L, C' without gradient): the caller keeps C' for the next step.

    B is the GLOBAL batch's: u1^T u1 goes through one differentiable all-reduce and is divided by the global count N
    (a rank with no rows adds zeros), so C' is the same on every rank at any world size. The covariance term, equal
    to rho <C', B> (the sum of their elementwise product), is whole on every rank; the invariance is returned as W/N
    times this rank's sum: both sum over ranks to W times their value, as solo's losses do.
    """
    check_pair(z1, z2, "z1", "z2")
    d = z1.shape[1]
    if covariance.shape != (d, d):
        raise ValueError(
            f"covariance must be a ({d}, {d}) tensor for {d} features, got shape {tuple(covariance.shape)}"
        )
    if not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    check_non_negative(rho, "rho")
    with torch.autocast(z1.device.type, enabled=False):
        u1 = F.normalize(full_precision(z1), dim=1)
        u2 = F.normalize(full_precision(z2), dim=1)
        total = sum(batch_sizes(u1.shape[0], u1.device))
        if total < 1:
            raise ValueError("tico_loss needs a global batch of at least 1 sample, got 0")
        batch = all_reduce(u1.T @ u1) / total
        running = beta * covariance.detach().to(batch.dtype) + (1 - beta) * batch
        invariance = -torch.linalg.vecdot(u1, u2).sum() * (world_size() / total)
        return invariance + rho * (running * batch).sum(), running.detach()


def earlier_covariance(d: int, like: torch.Tensor) -> torch.Tensor:
    """tico_check's running covariance of earlier steps: the same fixed symmetric D x D matrix on every rank."""
    return 0.1 * torch.eye(d, dtype=like.dtype, device=like.device) + 0.05


@LOSSES.register(
    "tico"
)  # a case for the gradient checker: a running covariance from earlier steps, the paper's weights
def tico_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return tico_loss(z1, z2, earlier_covariance(z1.shape[1], z1), beta=0.9, rho=8.0)[0]
