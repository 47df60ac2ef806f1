"""LeJEPA's and VISReg's losses: every view pulled to the centre of the global views, and a regulariser towards an
isotropic Gaussian (SIGReg; VISReg's centre, scale and sliced-Wasserstein shape), with the global batch's statistics."""

from __future__ import annotations

import math

import torch

from solo.distributed import all_reduce, batch_sizes, gather, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_pair, check_positive
from solo.losses.checked import LOSSES
from solo.losses.uniforms import Uniforms, drawn, seeded_uniforms

__all__ = ["lejepa_loss", "random_directions", "visreg_loss"]


def random_directions(
    dim: int,
    count: int,
    uniforms: Uniforms | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(dim, count): `count` random unit vectors of R^dim as columns (uniform on the sphere), Gaussian draws normalised:
    the Box-Muller transform (both its cosine and sine) of `uniforms(2, ceil(dim * count / 2))`, uniforms in [0, 1)
    (the trainer's are hashed on the device from the step: solo.losses.uniforms; torch.rand on `device` by default)."""
    u = drawn(uniforms, 2, (dim * count + 1) // 2, device)
    radius, angle = torch.sqrt(-2 * torch.log1p(-u[0])), 2 * math.pi * u[1]
    gaussian = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[: dim * count].view(dim, count)
    return (gaussian / gaussian.norm(dim=0)).to(dtype)


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


def _global_size(z: torch.Tensor, loss: str, least: int = 1) -> int:
    n = sum(batch_sizes(z.shape[0], z.device))
    if n < least:
        raise ValueError(f"{loss} needs a global batch of at least {least} sample(s), got {n}")
    return n


def _check_views(views, directions, lambd: float, num_global: int) -> None:
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


def _invariance(views: list[torch.Tensor], num_global: int, n: int) -> torch.Tensor:
    """The mean over views, samples and dimensions of (z_v - c)^2, c each sample's mean over the first `num_global`
    views (no stop-gradient: the centre is trained too); a per-sample term, W times this rank's share (the global
    batch's `n` in the denominator)."""
    centre = torch.stack(views[:num_global]).mean(dim=0)
    squares = sum((v - centre).square().sum() for v in views)
    return squares * (world_size() / (len(views) * n * views[0].shape[1]))


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
    _check_views(views, directions, lambd, num_global)
    check_positive(t_max, "t_max")
    if points < 2:
        raise ValueError(f"points must be an int >= 2 (the quadrature's nodes on [0, t_max]), got {points}")
    with torch.autocast(views[0].device.type, enabled=False):
        views = [full_precision(v) for v in views]
        directions = directions.to(views[0].dtype)
        n = _global_size(views[0], "lejepa_loss")
        return (1 - lambd) * _invariance(views, num_global, n) + lambd * _sigreg(views, directions, n, t_max, points)


def visreg_loss(
    views: list[torch.Tensor],
    directions: torch.Tensor,
    lambd: float = 0.9,
    num_global: int = 2,
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
    eps: float = 1e-4,
) -> torch.Tensor:
    """VISReg (Wu et al., 2026): (1 - lambd) * LeJEPA's invariance + lambd * (scale, shape and centre terms weighted by
    `weights`), on the (N, D) embeddings of every view of the batch, the `num_global` global views first.

    For each view, with mu and sigma its per-dimension mean and (biased) standard deviation over the global batch:
    centre, the mean of mu^2; scale, the mean of (1 - sigma)^2; shape, the sliced 2-Wasserstein distance to N(0, 1):
    the embeddings standardised by (z - mu) / (sigma + eps), sigma without gradient (shape does not move the scale),
    projected on the columns of `directions` (D x M unit vectors, the same on every rank), each projection's N values
    sorted and compared with the standard normal's quantiles at i / (N + 1), i = 1..N, in squares; all three averaged
    over views (and dimensions, or samples and directions).

    The sort ranks the GLOBAL batch: the standardised embeddings are gathered (reduce-scatter backward), and mu and
    sigma come from differentiable all-reduces of the ranks' sums over the global count. The regulariser is whole on
    every rank, the invariance W/N times this rank's sum: both sum over ranks to W times their value, as solo's losses
    do. (The paper and lightly draw other directions on every device, and lightly gathers the embeddings only when
    asked: their loss changes with the world size.)
    """
    _check_views(views, directions, lambd, num_global)
    check_positive(eps, "eps")
    with torch.autocast(views[0].device.type, enabled=False):
        views = [full_precision(v) for v in views]
        z = torch.stack(views)  # (V, n_local, D)
        n = _global_size(views[0], "visreg_loss", least=2)
        mean = all_reduce(z.sum(dim=1)) / n  # (V, D)
        centred = z - mean[:, None]
        std = (all_reduce(centred.square().sum(dim=1)) / n).sqrt()
        standardised = centred / (std.detach()[:, None] + eps)
        every = gather(standardised.transpose(0, 1), batch_sizes(z.shape[1], z.device))  # (N, V, D)
        projected = (every @ directions.to(z.dtype)).sort(dim=0).values  # (N, V, M)
        positions = torch.arange(1, n + 1, device=z.device, dtype=z.dtype) / (n + 1)
        shape = (projected - torch.special.ndtri(positions)[:, None, None]).square().mean()
        scale_weight, shape_weight, centre_weight = weights
        regulariser = (
            scale_weight * (1 - std).square().mean() + shape_weight * shape + centre_weight * mean.square().mean()
        )
        return (1 - lambd) * _invariance(views, num_global, n) + lambd * regulariser


@LOSSES.register("visreg")  # as lejepa's case: two global views and a local one, 16 directions
def visreg_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    directions = random_directions(z1.shape[1], 16, seeded_uniforms(0), dtype=z1.dtype)
    return visreg_loss([z1, z2, z1 * z2], directions, lambd=0.5, weights=(1.0, 0.5, 2.0))


@LOSSES.register("lejepa")  # a case for the gradient checker: two global views and a local one, 16 directions
def lejepa_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    directions = random_directions(z1.shape[1], 16, seeded_uniforms(0), dtype=z1.dtype)
    return lejepa_loss([z1, z2, z1 * z2], directions, lambd=0.5)
