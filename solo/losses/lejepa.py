"""LeJEPA's loss: every view pulled to the centre of the global views, and SIGReg, with the global batch's statistics."""

from __future__ import annotations

import torch

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_pair, check_positive
from solo.losses.checked import LOSSES

__all__ = ["lejepa_loss", "random_directions"]


def random_directions(
    dim: int,
    count: int,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(dim, count): `count` random unit vectors of R^dim as columns, Gaussian draws normalised (uniform on the sphere),
    from `generator` (on `device`; None: torch's generator)."""
    a = torch.randn(dim, count, generator=generator, device=device, dtype=dtype)
    return a / a.norm(dim=0)


def _quadrature(t_max: float, points: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nodes t of [0, t_max], the standard normal's characteristic function exp(-t^2 / 2) at them, and the weights
    of the trapezoid rule on [-t_max, t_max] times that window: the integrand is even in t, so each node but t = 0 also
    stands for -t (twice the usual weight; the end nodes once). Built on the device from no host data."""
    index = torch.arange(points, device=like.device)
    step = t_max / (points - 1)
    t = index.to(like.dtype) * step
    phi = torch.exp(-t.square() / 2)
    ends = ((index == 0) | (index == points - 1)).to(like.dtype)
    return t, phi, (2 - ends) * step * phi


def _global_size(z: torch.Tensor) -> int:
    n = sum(batch_sizes(z.shape[0], z.device))
    if n < 1:
        raise ValueError("lejepa_loss needs a global batch of at least 1 sample, got 0")
    return n


def _sigreg(views: list[torch.Tensor], directions: torch.Tensor, n: int, t_max: float, points: int) -> torch.Tensor:
    """SIGReg with the Epps-Pulley test: for each view and each direction a (a column of `directions`), the
    projections x_n = a . z_n of the global batch's N embeddings are tested against N(0, 1) by

        T = N * integral over t of |phi_N(t) - exp(-t^2 / 2)|^2 exp(-t^2 / 2) dt,   phi_N(t) = (1/N) sum_n exp(i t x_n),

    by the trapezoid rule on [-t_max, t_max] with `points` nodes on [0, t_max] (the reference code's quadrature); the
    mean of T over views and directions.

    phi_N is the GLOBAL batch's: the per-(view, direction, t) sums of cos(t x) and sin(t x) go through one
    differentiable all-reduce and are divided by the global count `n` (a rank with no rows adds zeros). The result is
    whole on every rank: its backward sums to W times its gradient (solo.distributed.collectives).
    """
    t, phi, weights = _quadrature(t_max, points, views[0])
    angles = (torch.stack(views) @ directions).unsqueeze(-1) * t  # (V, n_local, M, T)
    cos_mean, sin_mean = all_reduce(torch.stack([angles.cos().sum(dim=1), angles.sin().sum(dim=1)])) / n
    statistic = ((cos_mean - phi).square() + sin_mean.square()) @ weights * n  # (V, M)
    return statistic.mean()


def lejepa_loss(
    views: list[torch.Tensor],
    directions: torch.Tensor,
    lambd: float = 0.05,
    num_global: int = 2,
    t_max: float = 3.0,
    points: int = 17,
) -> torch.Tensor:
    """LeJEPA (Balestriero and LeCun, 2025): (1 - lambd) * invariance + lambd * SIGReg, on the (N, D) embeddings of
    every view of the batch, the `num_global` global views first (then local crops, if any).

    invariance: the mean over views, samples and dimensions of (z_v - c)^2, c each sample's mean over the global views
    (no stop-gradient: the centre is trained too). SIGReg: the Epps-Pulley statistic of every view along each of the
    columns of `directions` (D x M unit vectors, the same on every rank), t on [-t_max, t_max] (see `_sigreg`),
    averaged. The statistic is N times an integral, as in the reference code, with N the GLOBAL batch (the reference
    takes the local batch times W, the same only when the ranks hold equal batches).

    The invariance is a per-sample term, returned as W times this rank's share (the global batch's N in the
    denominator); SIGReg is whole on every rank, through a differentiable all-reduce: both sum over ranks to W times
    their value, as solo's losses do.
    """
    if not isinstance(views, (list, tuple)) or not 1 <= num_global <= len(views):
        raise ValueError(f"views must be a list of at least num_global={num_global} >= 1 tensors")
    for i, view in enumerate(views[1:], start=1):
        check_pair(views[0], view, "views[0]", f"views[{i}]")
    if directions.dim() != 2 or directions.shape[0] != views[0].shape[1]:
        raise ValueError(
            f"directions must be a (features, count) tensor with features={views[0].shape[1]}, "
            f"got shape {tuple(directions.shape)}"
        )
    if not 0 <= lambd <= 1:
        raise ValueError(f"lambd must be in [0, 1], got {lambd}")
    check_positive(t_max, "t_max")
    if points < 2:
        raise ValueError(f"points must be an int >= 2 (the quadrature's nodes on [0, t_max]), got {points}")
    with torch.autocast(views[0].device.type, enabled=False):
        views = [full_precision(v) for v in views]
        directions = directions.to(views[0].dtype)
        n = _global_size(views[0])
        centre = torch.stack(views[:num_global]).mean(dim=0)
        squares = sum((v - centre).square().sum() for v in views)
        invariance = squares * (world_size() / (len(views) * n * views[0].shape[1]))
        return (1 - lambd) * invariance + lambd * _sigreg(views, directions, n, t_max, points)


@LOSSES.register("lejepa")  # a case for the gradient checker: two global views and a local one, 16 directions
def lejepa_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    directions = random_directions(z1.shape[1], 16, torch.Generator().manual_seed(0), dtype=z1.dtype)
    return lejepa_loss([z1, z2, z1 * z2], directions, lambd=0.5)
