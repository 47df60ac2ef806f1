"""VICReg's variance-invariance-covariance loss with global-batch statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.registry import LOSSES
from solo.dtypes import full_precision

STD_EPS = 1e-4


def _variance_and_covariance(z: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One branch's hinge on the standard deviations and its off-diagonal covariance term, over the
    global batch of `n` samples (unbiased: / (n - 1)), through differentiable all-reduces."""
    centred = z - all_reduce(z.sum(dim=0)) / n
    cov = all_reduce(centred.T @ centred) / (n - 1)
    variance = torch.diagonal(cov)
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
    check_pair(z1, z2, "z1", "z2")
    for value, name in ((sim_coeff, "sim_coeff"), (std_coeff, "std_coeff"), (cov_coeff, "cov_coeff")):
        check_non_negative(value, name)
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = full_precision(z1), full_precision(z2)
        n = sum(batch_sizes(z1.shape[0], z1.device))
        if n < 2:
            raise ValueError(f"vicreg_loss needs a global batch of at least 2 samples, got {n}")
        invariance = (z1 - z2).pow(2).sum() * (world_size() / (n * z1.shape[1]))
        std1, cov1 = _variance_and_covariance(z1, n)
        std2, cov2 = _variance_and_covariance(z2, n)
        return sim_coeff * invariance + std_coeff * (std1 + std2) / 2 + cov_coeff * (cov1 + cov2)


@LOSSES.register("vicreg")  # a case for the gradient checker (python -m solo.losses.check)
def vicreg_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return vicreg_loss(z1, z2)
