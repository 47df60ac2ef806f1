"""IterNorm (Huang et al., 2019), VIbCReg's last projector layer: features whitened in groups over the global batch."""

from __future__ import annotations

import torch
import torch.nn as nn

from solo.distributed import all_reduce, batch_sizes
from solo.dtypes import full_precision


class IterNorm(nn.Module):
    """Each group of `num_features // num_groups` features is centred and multiplied by an approximation of the
    inverse square root of its covariance: `iterations` Newton-Schulz steps on the trace-normalised covariance.

    The mean and covariance are the global batch's, through differentiable all-reduces (solo.distributed), so the
    output and its gradient are those of one process on the whole batch; per-rank statistics would whiten another
    set of samples on every world size. Running estimates (momentum `momentum`) serve evaluation, as BatchNorm's."""

    def __init__(
        self, num_features: int, num_groups: int = 64, iterations: int = 5, eps: float = 1e-5, momentum: float = 0.1
    ):
        super().__init__()
        if num_features % num_groups:
            raise ValueError(
                f"IterNorm whitens {num_features} features in {num_groups} groups: make the width a multiple of the groups"
            )
        self.groups, self.width = num_groups, num_features // num_groups
        self.iterations, self.eps, self.momentum = iterations, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_whitening", torch.eye(self.width).repeat(num_groups, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = full_precision(x)
        if self.training:
            mean, whitening = self._batch_statistics(x32)
            with torch.no_grad():
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
                self.running_whitening.lerp_(whitening.to(self.running_whitening.dtype), self.momentum)
        else:
            mean, whitening = self.running_mean, self.running_whitening
        grouped = (x32 - mean).view(len(x), self.groups, self.width)
        y = torch.einsum("gcd,ngd->ngc", whitening.to(x32.dtype), grouped).flatten(1)  # not reshape(n, -1): n may be 0
        return (y * self.weight + self.bias).to(x.dtype)

    def _batch_statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = sum(batch_sizes(len(x), x.device))
        mean = all_reduce(x.sum(dim=0)) / n
        grouped = (x - mean).view(len(x), self.groups, self.width)
        eye = torch.eye(self.width, dtype=x.dtype, device=x.device)
        covariance = all_reduce(torch.einsum("ngc,ngd->gcd", grouped, grouped)) / n + self.eps * eye
        trace = torch.diagonal(covariance, dim1=1, dim2=2).sum(dim=1)[:, None, None]
        normalised = covariance / trace
        p = eye.expand_as(covariance)
        for _ in range(self.iterations):
            p = 1.5 * p - 0.5 * torch.linalg.matrix_power(p, 3) @ normalised
        return mean, p / trace.sqrt()
