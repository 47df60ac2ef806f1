"""W-MSE (Ermolov et al., 2021): each view's embeddings whitened over sub-batches of the global batch, then the mean
squared error of the unit-normalised whitened views."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, gather
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair, checks_values
from solo.losses.checked import LOSSES

__all__ = ["whiten", "wmse_loss"]


def whiten(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The rows of `x` (m, d) centred and whitened: times the inverse of the Cholesky factor of their covariance
    (unbiased), shrunk towards the identity by `eps` (W-MSE's Whitening2d, with its shrinkage).

    A covariance that is not positive definite raises ValueError; in the training step (host_reads_deferred), where
    reading whether the factorisation failed would stall a GPU, it makes the whitened rows NaN instead, hence the
    loss, which the step records and the trainer reports when it next logs (solo.train.step)."""
    centred = x - x.mean(dim=0)
    covariance = centred.T @ centred / (x.shape[0] - 1)
    eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    factor, info = torch.linalg.cholesky_ex((1 - eps) * covariance + eps * eye)
    if checks_values() and info:
        raise ValueError(
            f"whitening {x.shape[0]} rows of width {x.shape[1]}: their covariance is not positive definite (its "
            f"leading minor of order {int(info)} is not): the rows are (nearly) linearly dependent; shrink it "
            "towards the identity with eps > 0 (method.whitening_eps) or whiten more rows (method.whitening_size)"
        )
    factor = torch.where(info == 0, factor, torch.nan)
    return torch.linalg.solve_triangular(factor, centred.T, upper=False).T


def wmse_loss(z1: torch.Tensor, z2: torch.Tensor, whitening_size: int | None = None, eps: float = 0.0) -> torch.Tensor:
    """W-MSE's loss over the global batch of N pairs: the batch, in its sample order (a random order: the sampler
    shuffles it), is cut into sub-batches of `whitening_size` samples (None: one of N), each view is whitened per
    sub-batch, and the loss is the mean over samples of 2 - 2 cos(w1_i, w2_i). Both views keep their gradient.

    The sub-batches are the global batch's, not a rank's: every rank gathers the whole batch (differentiably) and
    computes the whole loss, so the sum over ranks is W times it (see solo.distributed.collectives). Whitening each
    rank's own rows would change the loss with the number of processes."""
    check_pair(z1, z2, "z1", "z2")
    check_non_negative(eps, "eps")
    with torch.autocast(z1.device.type, enabled=False):
        sizes = batch_sizes(z1.shape[0], z1.device)
        total = sum(sizes)
        size = whitening_size or total
        if total % size or size <= z1.shape[1] * (eps == 0):
            raise ValueError(
                f"wmse_loss whitens sub-batches of {size} samples: the global batch ({total}) must be a "
                f"multiple of it, and without eps it must exceed the embedding width ({z1.shape[1]})"
            )
        views = [gather(full_precision(z), sizes) for z in (z1, z2)]
        w1, w2 = (torch.cat([whiten(chunk, eps) for chunk in v.split(size)]) for v in views)
        return (2 - 2 * F.cosine_similarity(w1, w2, dim=1)).mean()


@LOSSES.register("wmse")  # a case for the gradient checker (python -m solo.losses.check)
def wmse_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # The checker's global batches are as small as 4 rows of width 4: one sub-batch, shrunk towards the identity.
    return wmse_loss(z1, z2, eps=0.1)
