"""VICReg's variance-invariance-covariance loss, VIbCReg's, and VCReg's variance-covariance regulariser, with
global-batch statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES

__all__ = ["vcreg_loss", "vibcreg_loss", "vicreg_loss"]

STD_EPS = 1e-4


def _check(z1: torch.Tensor, z2: torch.Tensor, sim_coeff: float, std_coeff: float, cov_coeff: float) -> None:
    check_pair(z1, z2, "z1", "z2")
    for value, name in ((sim_coeff, "sim_coeff"), (std_coeff, "std_coeff"), (cov_coeff, "cov_coeff")):
        check_non_negative(value, name)


def _global_size_and_invariance(z1: torch.Tensor, z2: torch.Tensor, loss: str) -> tuple[int, torch.Tensor]:
    """The global batch size, and the invariance term (mean squared error over the N x D entries) as W times this
    rank's share."""
    n = sum(batch_sizes(z1.shape[0], z1.device))
    if n < 2:
        raise ValueError(f"{loss} needs a global batch of at least 2 samples, got {n}")
    return n, (z1 - z2).pow(2).sum() * (world_size() / (n * z1.shape[1]))


def _global_covariance(z: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The covariance matrix of the global batch of `n` rows (unbiased: / (n - 1)), through differentiable
    all-reduces, and its diagonal."""
    centred = z - all_reduce(z.sum(dim=0)) / n
    cov = all_reduce(centred.T @ centred) / (n - 1)
    return cov, torch.diagonal(cov)


def _variance_and_covariance(z: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One branch's hinge on the standard deviations and its off-diagonal covariance term, over the
    global batch of `n` samples."""
    cov, variance = _global_covariance(z, n)
    std_term = F.relu(1 - torch.sqrt(variance + STD_EPS)).mean()
    cov_term = (cov - torch.diag(variance)).pow(2).sum() / z.shape[1]
    return std_term, cov_term


def vicreg_loss(
    z1: torch.Tensor, z2: torch.Tensor, sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0
) -> torch.Tensor:
    """VICReg (Bardes et al., 2022): sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance.

    invariance: mean squared error over the N x D entries; variance: per branch, the mean over dimensions
    of relu(1 - sqrt(var + 1e-4)), the two branches averaged; covariance: per branch, the sum of the
    squared off-diagonal entries of the covariance matrix divided by D, the two branches summed.

    Variances and covariances are those of the GLOBAL batch (N - 1 denominators): per-GPU statistics
    would make the loss depend on the number of GPUs. The invariance is a per-sample term, returned as
    W times this rank's share; the statistics' terms are whole on every rank, through all-reduces whose
    backward sums (see solo.distributed.collectives): both sum over ranks to W times their value.
    """
    _check(z1, z2, sim_coeff, std_coeff, cov_coeff)
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = full_precision(z1), full_precision(z2)
        n, invariance = _global_size_and_invariance(z1, z2, "vicreg_loss")
        std1, cov1 = _variance_and_covariance(z1, n)
        std2, cov2 = _variance_and_covariance(z2, n)
        return sim_coeff * invariance + std_coeff * (std1 + std2) / 2 + cov_coeff * (cov1 + cov2)


def vcreg_loss(h: torch.Tensor, var_weight: float, cov_weight: float) -> torch.Tensor:
    """VCReg (Zhu, Evtimova, Chen, Shwartz-Ziv and LeCun, 2024) on one representation `h` (rows, features): var_weight
    times the mean over features of relu(1 - sqrt(var + 1e-4)), plus cov_weight times the mean of the squared
    off-diagonal covariances (the sum over the d(d - 1) entries, divided by their number, so that layers of any width
    weigh alike). Variances and covariances are the global batch's (all rows of every rank, N - 1 denominators), as in
    vicreg_loss: whole on every rank, through all-reduces whose backward sums."""
    if h.dim() != 2 or not h.is_floating_point():
        raise ValueError(
            f"vcreg_loss takes a 2-D (rows, features) floating-point tensor, got {h.dtype} {tuple(h.shape)}"
        )
    check_non_negative(var_weight, "var_weight")
    check_non_negative(cov_weight, "cov_weight")
    n, d = sum(batch_sizes(h.shape[0], h.device)), h.shape[1]
    if n < 2 or d < 2:
        raise ValueError(f"vcreg_loss needs at least 2 rows and 2 features over the global batch, got {n} x {d}")
    with torch.autocast(h.device.type, enabled=False):
        cov, variance = _global_covariance(full_precision(h), n)
        std_term = F.relu(1 - torch.sqrt(variance + STD_EPS)).mean()
        cov_term = (cov - torch.diag(variance)).pow(2).sum() / (d * (d - 1))
        return var_weight * std_term + cov_weight * cov_term


def _variance_and_normalised_covariance(z: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """VIbCReg's terms of one branch, through all-reduces: VICReg's hinge on the standard deviations, and the mean of
    the squared off-diagonal entries of the correlation matrix (columns centred and scaled to unit L2 norm over the
    global batch of `n`). Both from one centring: the column norms give the variances."""
    centred = z - all_reduce(z.sum(dim=0)) / n
    squares = all_reduce(centred.pow(2).sum(dim=0))
    std_term = F.relu(1 - torch.sqrt(squares / (n - 1) + STD_EPS)).mean()
    norms = squares.sqrt().clamp_min(1e-12)
    correlation = all_reduce(centred.T @ centred) / (norms[:, None] * norms[None, :])
    return std_term, (correlation - torch.diag(torch.diagonal(correlation))).pow(2).mean()


def vibcreg_loss(
    z1: torch.Tensor, z2: torch.Tensor, sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 200.0
) -> torch.Tensor:
    """VIbCReg (Lee and Aune, 2021), as the authors' code (ML4ITS/vibcreg) computes it: VICReg's invariance term, the
    two branches' variance hinges SUMMED (VICReg averages them), and a normalised covariance term (per branch the mean
    over the D x D entries of the squared off-diagonal correlations, the two branches summed) that does not grow with
    the width. Every statistic is the global batch's, as in vicreg_loss."""
    _check(z1, z2, sim_coeff, std_coeff, cov_coeff)
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = full_precision(z1), full_precision(z2)
        n, invariance = _global_size_and_invariance(z1, z2, "vibcreg_loss")
        std1, cov1 = _variance_and_normalised_covariance(z1, n)
        std2, cov2 = _variance_and_normalised_covariance(z2, n)
        return sim_coeff * invariance + std_coeff * (std1 + std2) + cov_coeff * (cov1 + cov2)


@LOSSES.register("vicreg")  # a case for the gradient checker (python -m solo.losses.check)
def vicreg_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return vicreg_loss(z1, z2)


@LOSSES.register("vibcreg")
def vibcreg_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return vibcreg_loss(z1, z2)


@LOSSES.register("vcreg")
def vcreg_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return vcreg_loss(z1 * 0.3, 1.0, 1.0) + vcreg_loss(z2, 0.5, 2.0)  # z1 * 0.3: the hinge active
