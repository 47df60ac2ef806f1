"""Barlow Twins' redundancy-reduction loss, and All4One's feature term, with global-batch statistics."""

from __future__ import annotations

import torch

from solo.distributed import all_reduce, batch_sizes
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES

__all__ = ["all4one_feature_loss", "barlow_twins_loss"]

BN_EPS = 1e-5


def _standardise(z: torch.Tensor, n: int) -> torch.Tensor:
    """As BatchNorm1d(affine=False) in training mode on the whole global batch (biased variance)."""
    mean = all_reduce(z.sum(dim=0)) / n
    centred = z - mean
    var = all_reduce((centred * centred).sum(dim=0)) / n
    return centred / torch.sqrt(var + BN_EPS)


def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """sum_i (1 - c_ii)^2 + lambd * sum_{i != j} c_ij^2, with c the cross-correlation of the
    standardised embeddings over the global batch.

    Every rank returns the full global loss; the differentiable all-reduces make the sum over ranks
    of the gradients W times the true one, which DDP's mean cancels.
    """
    check_pair(z1, z2, "z1", "z2")
    check_non_negative(lambd, "lambd")
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = full_precision(z1), full_precision(z2)
        n = sum(batch_sizes(z1.shape[0], z1.device))
        if n < 2:
            raise ValueError(f"barlow_twins_loss needs a global batch of at least 2 samples, got {n}")
        c = all_reduce(_standardise(z1, n).T @ _standardise(z2, n)) / n
        diagonal = torch.diagonal(c)
        on_diagonal = (1 - diagonal).pow(2).sum()
        off_diagonal = (c - torch.diag(diagonal)).pow(2).sum()  # no cancellation against the ~1 diagonal
        return on_diagonal + lambd * off_diagonal


def all4one_feature_loss(t1: torch.Tensor, t2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """All4One's feature contrast (Estepa et al., 2023): the cross-correlations c of each view's teacher embedding
    (`t1`, `t2`, detached) with the other view's student embedding (`z2`, `z1`), every feature (column) scaled to unit
    L2 norm over the global batch (not centred); the loss is 5 (sqrt(mean (c_ii - 1)^2) + sqrt(mean_{i != j} c_ij^2)),
    each mean over both correlations. Per-GPU norms and correlations would change with the number of processes."""
    check_pair(t1, z2, "t1", "z2")
    check_pair(t2, z1, "t2", "z1")
    with torch.autocast(z1.device.type, enabled=False):

        def unit(x):
            x = full_precision(x)
            return x / all_reduce(x.pow(2).sum(dim=0)).sqrt().clamp_min(1e-12)

        correlations = [all_reduce(unit(t.detach()).T @ unit(z)) for t, z in ((t1, z2), (t2, z1))]
        d = correlations[0].shape[0]
        on = sum((torch.diagonal(c) - 1).pow(2).sum() for c in correlations) / (2 * d)
        off = sum((c - torch.diag(torch.diagonal(c))).pow(2).sum() for c in correlations) / (2 * (d * d - d))
        return 5 * (on.sqrt() + off.sqrt())


@LOSSES.register("barlow_twins")  # a case for the gradient checker (python -m solo.losses.check)
def barlow_twins_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return barlow_twins_loss(z1, z2, lambd=0.05)


@LOSSES.register("all4one_feature")
def all4one_feature_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return all4one_feature_loss(z1, z2, z1, z2)
