"""EMP-SSL's loss: the total coding rate of each view over the global batch, and each patch pulled to its image's
mean embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair, check_positive
from solo.losses.checked import LOSSES

__all__ = ["emp_ssl_loss"]


def spd_logdet(matrices: torch.Tensor) -> torch.Tensor:
    """log det of symmetric positive definite matrices (..., D, D), through Cholesky: 2 sum log diag(L). The `_ex`
    variant checks nothing on the host (torch.logdet's LU does), so the step reads no value back."""
    factor = torch.linalg.cholesky_ex(matrices).L
    return 2 * factor.diagonal(dim1=-2, dim2=-1).log().sum(dim=-1)


def emp_ssl_loss(views: list[torch.Tensor], eps: float = 0.2, lambd: float = 200.0) -> torch.Tensor:
    """EMP-SSL (Tong et al., 2023): with u_v the L2-normalised (N, D) embeddings of each of the V patches (views) of
    the N images (normalised here) and c_n = (1/V) sum_v u_{v,n} each image's mean patch embedding,

        L = -(1/V) sum_v TCR(u_v) - lambd (1/(V N)) sum_v sum_n cos(u_{v,n}, c_n),
        TCR(u) = 1/2 log det(I + D / (N eps) u^T u),

    `eps` the paper's epsilon squared (its code's eps, 0.2), `lambd` the invariance's weight (200).

    u_v^T u_v is the GLOBAL batch's: the V (D, D) sums go through one differentiable all-reduce (a rank with no rows
    adds zeros) and N is the global count, so every rank takes the whole log-determinants; their backward sums to W
    times their gradient (solo.distributed.collectives). The image means are per sample (local); the invariance is
    returned as W/N times this rank's sum: both sum over ranks to W times their value, as solo's losses do.
    """
    if not isinstance(views, (list, tuple)) or len(views) < 2:
        raise ValueError("views must be a list of at least 2 (batch, features) tensors: the patches of each image")
    for i, view in enumerate(views[1:], start=1):
        check_pair(views[0], view, "views[0]", f"views[{i}]")
    check_positive(eps, "eps")
    check_non_negative(lambd, "lambd")
    with torch.autocast(views[0].device.type, enabled=False):
        units = torch.stack([F.normalize(full_precision(v), dim=1) for v in views])  # (V, n, D)
        total = sum(batch_sizes(units.shape[1], units.device))
        if total < 1:
            raise ValueError("emp_ssl_loss needs a global batch of at least 1 sample, got 0")
        num_views, d = units.shape[0], units.shape[2]
        grams = all_reduce(units.transpose(1, 2) @ units)  # (V, D, D), the global batch's
        identity = torch.eye(d, dtype=grams.dtype, device=grams.device)
        coding_rate = spd_logdet(identity + grams * (d / (total * eps))) / 2
        similarity = F.cosine_similarity(units, units.mean(dim=0, keepdim=True), dim=-1)  # (V, n)
        invariance = similarity.sum() * (world_size() / (num_views * total))
        return -coding_rate.mean() - lambd * invariance


@LOSSES.register("emp_ssl")  # a case for the gradient checker: three views (z1 * z2 a third one), a small lambda
def emp_ssl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return emp_ssl_loss([z1, z2, z1 * z2], eps=0.2, lambd=2.0)
