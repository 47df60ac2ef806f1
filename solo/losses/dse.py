"""DSE, the dense structure estimator (Dai et al., "Exploring Structural Degradation in Dense Representations for
Self-supervised Learning", 2025), as a regulariser: reward dense tokens whose clusters are far apart and spread in
many dimensions. On the patch tokens of a batch of images (each token L2-normalised):

    DSE = inter / l2 + effective_rank - (intra_batch / l2 + intra_image / l2) / 2

- l2: the mean distance of a token to the mean token;
- intra_image: k-means (3 clusters) on each image's tokens; each cluster's centred singular-value sum, divided by
  sqrt(max(size - 1, D)); averaged over an image's clusters of two or more tokens, then over the images;
- inter and intra_batch: k-means (24 clusters) on the tokens of each group of 8 consecutive images (24 // 3); inter is
  the mean distance of a token to the nearest centroid not its own, averaged over the groups; intra_batch the clusters'
  singular-value sums as above, averaged over every cluster of every group;
- effective_rank: exp of the entropy of all tokens' normalised singular values, over min(tokens, D).

The clustering carries no gradient; the rest does. The official code (the paper's repository, read here) computes all
of it on each GPU's images: its groups, means and singular values then change with the number of GPUs. Here every
statistic is the GLOBAL batch's: the images are ordered by view, then by global sample, the groups cut from that
order (a group may span ranks: each rank takes its share of the groups from the gathered tokens, whose gather sums
the gradient back), the per-image terms are summed over ranks, and the effective rank is that of every token of the
global batch. The result is whole on every rank (the convention of solo.losses.vicreg).

k-means as the official code, with three choices that keep it off the host: a fixed number of Lloyd iterations (the
official stops early once the centroids move less than 1e-4: the iterations after that change nothing), an empty
cluster keeps its centroid (the official re-draws it at random), and the k-means++ draws come from `uniforms` for the
whole global batch (the same on every rank; the trainer's hash run and step on the device: solo.losses.uniforms). Initial centroids are drawn with
probability proportional to the distance, as the official code does (lightly squares it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, gather, rank, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES
from solo.losses.uniforms import Uniforms, drawn, seeded_uniforms

__all__ = ["dse_score"]

KMEANS_ITERATIONS = 20  # the official max_iters


def dse_score(
    views: list[torch.Tensor],
    local_clusters: int = 3,
    global_clusters: int = 24,
    uniforms: Uniforms | None = None,
    valid: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """DSE of the GLOBAL batch's dense tokens (higher: better structure); `views`: one (n, P, D) tensor of this rank's
    images per view, the images ordered view by view, then by global sample; `valid`: one (n, P) boolean tensor per
    view, True where a token is the image's (padding elsewhere: I-JEPA's contexts), every token if None. Padding
    counts nowhere: as if each image had its own tokens alone. `uniforms(rows, columns)`: k-means++'s draws, the same
    on every rank (the trainer's: solo.backbones.stochastic.step_uniforms); torch.rand by default. A regulariser adds
    -weight * dse_score. Whole on every rank."""
    with torch.autocast(views[0].device.type, enabled=False):
        views = [F.normalize(full_precision(v), dim=-1) for v in views]
        n, tokens, dim = views[0].shape
        sizes = batch_sizes(n, views[0].device)
        images = sum(sizes) * len(views)
        mine = torch.cat(views)
        if images == 0:
            return mine.sum() * 0
        # Each token's weight: 1 for the image's, 0 for padding; without padding no collective counts them.
        weights = [mine.new_ones(n, tokens)] * len(views) if valid is None else [v.to(mine.dtype) for v in valid]
        mine_weights = torch.cat(weights)
        count = (
            torch.full((), images * tokens, dtype=mine.dtype, device=mine.device)
            if valid is None
            else all_reduce(mine_weights.sum())
        )

        mean = all_reduce((mine * mine_weights[..., None]).sum(dim=(0, 1))) / count
        l2 = all_reduce(((mine - mean).norm(dim=-1) * mine_weights).sum()) / count + 1e-12

        per_image, per_group = min(local_clusters, tokens), max(global_clusters // local_clusters, 1)
        groups = math.ceil(images / per_group)
        draws = drawn(uniforms, images + groups, max(local_clusters, global_clusters), mine.device).to(mine.dtype)
        offset = sum(sizes[: rank()])
        image_draws = torch.cat([draws[v * sum(sizes) + offset :][:n] for v in range(len(views))])
        intra_image = _intra_image(mine, mine_weights, per_image, image_draws[:, :per_image])

        everyone = torch.cat([gather(v, sizes) for v in views])  # view by view, then by global sample
        if valid is None:
            everyones_weights = everyone.new_ones(everyone.shape[:2])
        else:
            everyones_weights = torch.cat([gather(w, sizes) for w in weights])
        first, last = _my_share(groups)
        share = slice(first * per_group, last * per_group)
        inter, intra_batch = _group_terms(
            everyone[share], everyones_weights[share], per_group, global_clusters, draws[images + first :]
        )
        effective_rank = _effective_rank(everyone.flatten(0, 1) * everyones_weights.flatten()[:, None], count)

        intra_image = torch.where(intra_image[1] > 0, intra_image[0] / intra_image[1].clamp_min(1), 0.0)
        inter = torch.where(inter[1] > 0, inter[0] / inter[1].clamp_min(1), 0.0)
        # The official code's value where no cluster of any group has two tokens: 1, not divided by l2.
        intra_batch = torch.where(intra_batch[1] > 0, intra_batch[0] / intra_batch[1].clamp_min(1) / l2, 1.0)
        return inter / l2 + effective_rank - (intra_batch + intra_image / l2) / 2


def _my_share(groups: int) -> tuple[int, int]:
    """This rank's contiguous range of the groups' indices."""
    per_rank, extra = divmod(groups, world_size())
    first = rank() * per_rank + min(rank(), extra)
    return first, first + per_rank + (rank() < extra)


def _intra_image(x: torch.Tensor, weights: torch.Tensor, clusters: int, draws: torch.Tensor) -> torch.Tensor:
    """(sum over this rank's images of the mean of their clusters' singular-value sums, the number of images with a
    cluster of two or more tokens), summed over ranks."""
    members, _, _ = _kmeans(x.detach(), weights, clusters, draws)
    spread, valid = _cluster_spread(x, members)
    has_cluster = valid.any(dim=1)
    per_image = (spread * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1)
    return all_reduce(torch.stack([(per_image * has_cluster).sum(), has_cluster.sum().to(x.dtype)]))


def _group_terms(images: torch.Tensor, weights: torch.Tensor, per_group: int, clusters: int, draws: torch.Tensor):
    """For this rank's groups of `per_group` consecutive images (the last may hold fewer) and their tokens' weights:
    (sum of the groups' inter terms, their number) and (sum of every cluster's singular-value sum, the number of
    clusters of two or more tokens), each summed over ranks."""
    # Zeros on the gathered tokens' graph, also on a rank without a group: every rank's backward then runs the same
    # collectives in the same order (a rank whose sums did not need a gradient would skip the all-reduce's).
    inter_sum = inter_count = spread_sum = spread_count = images.sum() * 0
    whole = len(images) // per_group
    for start, stop, count in ((0, whole * per_group, whole), (whole * per_group, len(images), 1)):
        if stop == start:
            continue
        x = images[start:stop].reshape(count, -1, images.shape[-1])  # (groups, tokens of a group, D)
        w = weights[start:stop].reshape(count, -1)
        k = min(clusters, x.shape[1])
        members, centroids, real = _kmeans(x.detach(), w, k, draws[start // per_group :][:count, :k])
        if k > 1:  # each token's distance to the nearest centroid not its own, averaged over the group's tokens
            others = members.bool() | ~real[:, None]
            distances = torch.cdist(x, centroids).masked_fill(others, float("inf")).min(dim=2).values
            inter = torch.where(w > 0, distances, 0.0).sum(dim=1) / w.sum(dim=1)
            has_others = real[:, 1]  # a group of one token has no other centroid: no inter term, as the official's
            inter_sum = inter_sum + torch.where(has_others, inter, 0.0).sum()
            inter_count = inter_count + has_others.sum()
        spread, valid = _cluster_spread(x, members)
        spread_sum, spread_count = spread_sum + (spread * valid).sum(), spread_count + valid.sum()
    totals = torch.stack([inter_sum, inter_count, spread_sum, spread_count])
    totals = all_reduce(totals)
    return totals[:2], totals[2:]


def _cluster_spread(x: torch.Tensor, members: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each cluster's centred singular-value sum over sqrt(max(size - 1, D)) (the official "centered singular sum"),
    and whether it has two or more tokens; (m, k) each. A cluster's rows are its tokens minus their mean, the others'
    zero: the same singular values as its tokens alone."""
    sizes = members.sum(dim=1)  # (m, k)
    means = (members.transpose(1, 2) @ x) / sizes[..., None].clamp_min(1)
    rows = members.transpose(1, 2)[..., None] * (x[:, None] - means[:, :, None])  # (m, k, tokens, D)
    scale = torch.maximum(sizes - 1, torch.full_like(sizes, x.shape[-1])).sqrt()
    return _singular_values(rows).sum(dim=-1) / scale, sizes > 1


def _effective_rank(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """exp(entropy of the normalised singular values) / min(rows, D), with the official code's 1e-12s; `rows`: how
    many of x's rows are tokens (the others zero: padding, which leaves the singular values as they are)."""
    singular = _singular_values(x)
    p = singular / (singular.sum() + 1e-12) + 1e-12
    return torch.exp(-(p * p.log()).sum()) / rows.clamp_max(x.shape[1])


def _singular_values(x: torch.Tensor) -> torch.Tensor:
    """torch.linalg.svdvals of each matrix of `x`, those numerically zero (below numpy's matrix_rank tolerance: the
    largest x max(rows, columns) x the dtype's eps) without gradient. A singular value's gradient is u v^T, whose
    direction rounding picks where the value is 0, as where every token lies in one hyperplane (a ViT's final
    LayerNorm with its bias at 0, as at initialisation): the official gradient there points anywhere, here nowhere."""
    singular = torch.linalg.svdvals(x)
    tolerance = singular.amax(dim=-1, keepdim=True) * max(x.shape[-2:]) * torch.finfo(x.dtype).eps
    return torch.where(singular > tolerance, singular, singular.detach())


def _kmeans(
    x: torch.Tensor, present: torch.Tensor, k: int, draws: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k-means of each of the m sets of points `x` (m, points, D) whose `present` (m, points) is 1 (the others,
    padding at 0, join no cluster): (m, points, k) one-hot memberships to the nearest of the final centroids, those
    centroids (m, k, D), and (m, k) which are real: a set of fewer points than k has as many clusters as points (the
    official's k = min(k, points)), its other centroids no members and no part in any distance. k-means++ seeds (a point drawn uniformly, then each next with probability proportional
    to its distance to the nearest seed, uniformly where all are zero) from `draws` (m, k) uniforms, then
    KMEANS_ITERATIONS Lloyd steps. A fixed number of operations, whatever m."""
    m, points, _ = x.shape
    rows = torch.arange(m, device=x.device)

    def drawn(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # the point whose weight's share holds u
        cumulative = weights.cumsum(dim=1)
        pick = torch.searchsorted(cumulative, (u * cumulative[:, -1])[:, None], right=True).clamp_max(points - 1)
        return x[rows, pick[:, 0]]

    seeds = [drawn(present, draws[:, 0])]
    nearest = (x - seeds[0][:, None]).square().sum(dim=-1)  # squared distance to the nearest seed
    for j in range(1, k):
        distance = nearest.sqrt() * present
        seeds.append(drawn(torch.where(distance.sum(dim=1, keepdim=True) > 0, distance, present), draws[:, j]))
        nearest = torch.minimum(nearest, (x - seeds[-1][:, None]).square().sum(dim=-1))
    centroids, labels = torch.stack(seeds, dim=1), torch.arange(k, device=x.device)
    real = labels < present.sum(dim=1, keepdim=True)
    for _ in range(KMEANS_ITERATIONS):
        members = (_nearest(x, centroids, real)[..., None] == labels).to(x.dtype) * present[..., None]
        sizes = members.sum(dim=1)[..., None]
        centroids = torch.where(sizes > 0, (members.transpose(1, 2) @ x) / sizes.clamp_min(1), centroids)
    return (_nearest(x, centroids, real)[..., None] == labels).to(x.dtype) * present[..., None], centroids, real


def _nearest(x: torch.Tensor, centroids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(m, points) index of each point's nearest real centroid: argmin of |c|^2 - 2 x.c (|x|^2 is the same for all)."""
    squares = centroids.square().sum(-1).masked_fill(~real, float("inf"))
    return torch.baddbmm(squares[:, None], x, centroids.transpose(1, 2), alpha=-2).argmin(dim=2)


@LOSSES.register("dse")  # a case for the gradient checker (python -m solo.losses.check)
def dse_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each sample an image of 4 tokens in 2 dimensions (2 from each tower); 2 clusters per image, groups of 8 images
    # (as the defaults'): groups span ranks, and with 4 samples a rank some ranks have none to cluster. k-means seeded
    # alike on every rank.
    tokens = torch.cat([z1.unflatten(1, (-1, 2)), z2.unflatten(1, (-1, 2))], dim=1)
    return -dse_score([tokens], 2, 16, seeded_uniforms(0))
