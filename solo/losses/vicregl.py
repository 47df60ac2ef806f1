"""VICRegL's loss (Bardes, Ponce and LeCun, 2022): VICReg on the pooled embeddings and on the views' local embeddings
matched by location and by feature, every variance and covariance over the global batch."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair
from solo.losses.checked import LOSSES
from solo.losses.vicreg import STD_EPS, _global_size_and_invariance, _variance_and_covariance

__all__ = ["vicregl_loss"]


def nearest_matches(distances: torch.Tensor, count: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """VICRegL's matching (the authors' `neirest_neighbores`): each input cell's nearest candidate cell, then the
    `count` input cells (all: None) closest to theirs, in cell order. `distances`: (B, K_in, K_candidates). Returns
    the (B, count) indices of the kept input cells and of their matches."""
    nearest, match = distances.min(dim=2)
    count = nearest.shape[1] if count is None else min(count, nearest.shape[1])
    kept = torch.sort(nearest, dim=1, stable=True).indices[:, :count].sort(dim=1).values
    return kept, match.gather(1, kept)


def _local_terms(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The authors' `_vicreg_loss` on matched cells `x`, `y` (B, K, C): the mean squared error over the N x K x C
    entries (W times this rank's share), and per side the variance hinge averaged over the K x C (slot, channel)
    pairs and the covariance term (per slot k the off-diagonal squares of the C x C covariance over the batch, / C),
    averaged over the K slots; the two sides averaged. Statistics over the global batch of `n` (N - 1 denominators)."""
    invariance = (x - y).pow(2).sum() * (world_size() / (n * x.shape[1] * x.shape[2]))
    std_terms, cov_terms = [], []
    for side in (x, y):
        centred = side - all_reduce(side.sum(dim=0)) / n
        cov = all_reduce(torch.einsum("bkc,bkd->kcd", centred, centred)) / (n - 1)
        variance = torch.diagonal(cov, dim1=1, dim2=2)  # (K, C)
        std_terms.append(F.relu(1 - torch.sqrt(variance + STD_EPS)).mean())
        off_diagonal = cov - torch.diag_embed(variance)
        cov_terms.append((off_diagonal.pow(2).sum(dim=(1, 2)) / side.shape[2]).mean())
    return invariance, sum(std_terms) / 2, sum(cov_terms) / 2


def _matched(maps_a, maps_b, index_a, index_b):
    take = lambda maps, index: maps.gather(1, index[:, :, None].expand(-1, -1, maps.shape[2]))  # noqa: E731
    return take(maps_a, index_a), take(maps_b, index_b)


def vicregl_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    maps1: torch.Tensor,
    maps2: torch.Tensor,
    centres1: torch.Tensor,
    centres2: torch.Tensor,
    alpha: float = 0.75,
    num_matches: Sequence[int] = (20, 4),
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
) -> torch.Tensor:
    """alpha * global + (1 - alpha) * local, as the authors' code (facebookresearch/VICRegL, main_vicregl.py) weighs
    and matches them, for two views.

    global: VICReg on the pooled embeddings `z1`, `z2` (N, D): sim_coeff * MSE + std_coeff * the two branches' variance
    hinges averaged + cov_coeff * their covariance terms AVERAGED (VICReg's loss sums them: the authors' VICRegL halves
    it). local: on the local embeddings `maps1`, `maps2` (N, K, C) whose cells lie at `centres1`, `centres2` (N, K, 2)
    in the image, two matchings, each in both directions (1 -> 2 and 2 -> 1) averaged: by feature (each cell of one view
    with its nearest cell of the other in embedding space, every cell: the authors' l2_all_matches) and by location (the
    num_matches[0] cells of the pair's first view, num_matches[1] of its second, closest in the image to their nearest
    cell of the other view; averaged over the ordered pairs (1, 2) and (2, 1)); each matched pair of (N, k, C) tensors
    gives sim_coeff * MSE + std_coeff * variance + cov_coeff * covariance as in `_local_terms`. Every mean, variance and covariance is the GLOBAL batch's, through all-reduces whose backward
    sums (solo.distributed.collectives); the matching is per sample. Returns W times this rank's share."""
    check_pair(z1, z2, "z1", "z2")
    if maps1.dim() != 3 or maps1.shape != maps2.shape or centres1.shape != (*maps1.shape[:2], 2):
        raise ValueError(
            f"maps1 and maps2 must be (batch, cells, features) tensors of one shape, and centres1 (batch, cells, 2): got "
            f"{tuple(maps1.shape)}, {tuple(maps2.shape)} and {tuple(centres1.shape)}"
        )
    for value, name in ((sim_coeff, "sim_coeff"), (std_coeff, "std_coeff"), (cov_coeff, "cov_coeff")):
        check_non_negative(value, name)
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2, maps1, maps2 = (full_precision(t) for t in (z1, z2, maps1, maps2))
        n, invariance = _global_size_and_invariance(z1, z2, "vicregl_loss")
        std1, cov1 = _variance_and_covariance(z1, n)
        std2, cov2 = _variance_and_covariance(z2, n)
        global_loss = sim_coeff * invariance + std_coeff * (std1 + std2) / 2 + cov_coeff * (cov1 + cov2) / 2
        with torch.no_grad():
            by_feature = torch.cdist(maps1, maps2)
            by_location = torch.cdist(centres1.to(maps1.dtype), centres2.to(maps1.dtype))
        # The authors' local_loss averages _local_loss over the ordered pairs of views (1, 2) and (2, 1): each gives the
        # feature matching in both directions (1/2 each) and the location matching of its first view's num_matches[0]
        # cells and its second's num_matches[1] (1/2 each); over the two pairs, each of the four location matchings 1/4.
        weighted = [(1 / 2, maps1, maps2, nearest_matches(by_feature, None))]
        weighted.append((1 / 2, maps2, maps1, nearest_matches(by_feature.transpose(1, 2), None)))
        for first, second in ((0, 1), (1, 0)):
            weighted.append((1 / 4, maps1, maps2, nearest_matches(by_location, num_matches[first])))
            weighted.append((1 / 4, maps2, maps1, nearest_matches(by_location.transpose(1, 2), num_matches[second])))
        local_loss = 0.0
        for weight, maps_a, maps_b, indices in weighted:
            invariance, std, cov = _local_terms(*_matched(maps_a, maps_b, *indices), n)
            local_loss = local_loss + weight * (sim_coeff * invariance + std_coeff * std + cov_coeff * cov)
        return alpha * global_loss + (1 - alpha) * local_loss


def _check_maps(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's 4 features as a 2 x 2 map of 3 cells' embeddings (different non-linear functions of them, so that the
    feature matching has something to choose) and the cells' centres, each cell shifted by its own function of the
    row's first values (so that the location matching keeps different cells per row). One shift for every cell of a
    row would tie distances exactly (each cell's to its counterpart in the other view), and which of the tied cells
    is kept would then hang on the last bit of the towers' output, which differs with the batch each process holds."""
    maps = torch.stack([z[:, :3], torch.tanh(z[:, 1:]), z[:, [0, 2, 3]] ** 2 / 2, torch.sin(z[:, :3] + 1)], dim=1)
    grid = torch.tensor([[0.25, 0.25], [0.25, 0.75], [0.75, 0.25], [0.75, 0.75]], dtype=z.dtype, device=z.device)
    phase = torch.arange(4, dtype=z.dtype, device=z.device)[None, :, None]
    return maps, grid + 0.4 * torch.sin(100 * z[:, None, :2].detach() + phase)


@LOSSES.register("vicregl")  # a case for the gradient checker (python -m solo.losses.check)
def vicregl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    (maps1, centres1), (maps2, centres2) = _check_maps(z1), _check_maps(z2)
    return vicregl_loss(z1, z2, maps1, maps2, centres1, centres2, alpha=0.5, num_matches=(2, 3))
