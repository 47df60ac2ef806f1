"""Health of the representation, each epoch, on the whole val split: whether the embeddings spread or collapse.

- RankMe (Garrido et al., 2023): the effective rank exp(entropy of the normalised singular values) of the (N, D)
  matrix of embeddings; near 1 when every sample maps to one line, up to min(N, D) when spread evenly.
- Uniformity (Wang and Isola, 2020): log of the mean of exp(-t ||u_i - u_j||^2) over pairs of distinct samples, u the
  L2-normalised embeddings; 0 when every sample is at one point, about -4 (t = 2) when spread over the sphere.
- The per-dimension standard deviation of the L2-normalised embeddings times sqrt(D) (SimSiam's collapse watch): about
  1 when spread, 0 when collapsed.

- Alignment (Wang and Isola, 2020): the mean over samples of ||u_a - u_b||^2 between the L2-normalised backbone features
  of a sample's first two views; 0 when the views agree, 2 for unrelated directions. The val split has one view per
  image, so it is measured on the training batches (`alignment_squares`: summed on the device each step, all-reduced
  and divided by the global count at the logging steps: the global batches' mean at any world size).

- LiDAR (Thilak et al., 2023): the effective rank, as RankMe's, of the linear discriminant matrix
  Sw^(-1/2) Sb Sw^(-1/2) with every sample a class of its augmented views: Sb the scatter of the samples' mean
  features, Sw the scatter of the views about them (plus delta I). It counts the directions that tell samples apart
  more than augmentations move them; 1 when the features collapse, up to min(D, N - 1). Measured on the logging
  steps' training batches, whose views are the augmentations (`lidar_sums`: summed on the device, all-reduced and
  read at the logging step: the global batch's at any world size).

The others are computed on the backbone's features and on the embedding the loss sees (the method's `projector` applied to them,
where it has one), gathered from every rank in dataset order (solo.eval.features.extract_features): the same numbers
at any world size. A method distilled from a frozen teacher also reports the teacher-student agreement, the mean cosine
between the projected student's features and the teacher's (`teacher_agreement`).
"""

from __future__ import annotations

import math

import torch

# Pairs for the uniformity: the first UNIFORMITY_SAMPLES val samples in dataset order (all pairs of N samples are
# N^2 / 2 distances: 8 M here, 1.25 G for ImageNet's 50,000).
UNIFORMITY_SAMPLES = 4096
# Below these the embeddings have collapsed (a spread embedding reads about 1 and tens).
COLLAPSED_STD, COLLAPSED_RANK = 0.05, 1.5


def rankme(z: torch.Tensor, eps: float = 1e-7) -> float:
    """exp(-sum p_k log p_k), p_k = s_k / sum(s) + eps over the singular values s of `z` (N, D) (the paper's eps)."""
    s = torch.linalg.svdvals(z.double())
    p = s / s.sum().clamp_min(torch.finfo(torch.float64).tiny) + eps
    return math.exp(float(-(p * p.log()).sum()))


def uniformity(z: torch.Tensor, t: float = 2.0) -> float:
    """log mean_{i != j} exp(-t ||u_i - u_j||^2) over the first UNIFORMITY_SAMPLES rows, u = z / ||z||."""
    u = torch.nn.functional.normalize(z[:UNIFORMITY_SAMPLES].double(), dim=1)
    n = len(u)
    if n < 2:
        return float("nan")
    squared = torch.pdist(u).square()  # the n (n - 1) / 2 pairs i < j: the mean over i != j is the same
    return float(torch.logsumexp(-t * squared, dim=0) - math.log(len(squared)))


def spread(z: torch.Tensor) -> float:
    """The mean over dimensions of the standard deviation of z / ||z|| over the samples, times sqrt(D)."""
    u = torch.nn.functional.normalize(z.double(), dim=1)
    return float(u.std(dim=0, unbiased=False).mean() * math.sqrt(z.shape[1]))


def teacher_agreement(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """The mean over samples of cos(student_i, teacher_i), rows of (N, D) features: 1 where the student points where
    the teacher does, about 0 for unrelated features."""
    return float(torch.nn.functional.cosine_similarity(student.double(), teacher.double(), dim=1).mean())


def alignment_squares(features: torch.Tensor, per_view: int) -> torch.Tensor:
    """The sum over samples of ||u_a - u_b||^2 (0-dim, in the features' dtype, on their device, no host read) of one
    step's `features`: a method's backbone features of at least two views in view order, `per_view` rows each (the
    convention of Method.forward), u the L2-normalised features of the first two."""
    if len(features) < 2 * per_view:
        raise ValueError(f"alignment_squares: {len(features)} rows are not two views of {per_view}")
    u = torch.nn.functional.normalize(features[: 2 * per_view], dim=1)
    return (u[:per_view] - u[per_view:]).square().sum()


def lidar_sums(features: torch.Tensor, per_view: int) -> torch.Tensor | None:
    """The float64 sums LiDAR needs from one step's `features`, views in order, `per_view` rows each (the convention
    of Method.forward), every sample a class of its views: the class means' sum (D), the sum of their outer products
    (D x D) and the within-class scatter about them (D x D), flattened into one (2 D^2 + D,) tensor on the features'
    device (no host read); None when the features hold fewer than two views."""
    views = len(features) // per_view if per_view else 0
    if views < 2 or len(features) != views * per_view:
        return None
    x = features.detach().double().view(views, per_view, -1)
    means = x.mean(dim=0)
    within = (x - means).flatten(0, 1)
    return torch.cat([means.sum(dim=0), (means.T @ means).flatten(), (within.T @ within).flatten()])


def lidar(sums: torch.Tensor, classes: int, views: int, delta: float = 1e-4, eps: float = 1e-7) -> float:
    """LiDAR from `lidar_sums` summed over `classes` samples of `views` views each: Sb the unbiased scatter of the class
    means, Sw the within-class scatter over classes * (views - 1) plus `delta` I (stable-pretraining's LiDAR callback's
    normalisations and delta), then exp(-sum p log p), p = lambda / sum(lambda) + eps over the eigenvalues of
    Sw^(-1/2) Sb Sw^(-1/2), as RankMe's (the paper's form; adding eps before normalising, as that callback does,
    reads the full width on features that collapsed to one point, whose eigenvalues are all 0)."""
    if classes < 2 or views < 2:
        raise ValueError(f"lidar needs at least 2 classes of at least 2 views, got {classes} and {views}")
    d = round((math.sqrt(1 + 8 * len(sums)) - 1) / 4)
    mean_sum, outer, within = sums.double().split([d, d * d, d * d])
    mean = mean_sum / classes
    between = (outer.view(d, d) - classes * torch.outer(mean, mean)) / (classes - 1)
    within = within.view(d, d) / (classes * (views - 1)) + delta * torch.eye(d, dtype=sums.dtype, device=sums.device)
    w, v = torch.linalg.eigh(within)
    inverse_root = (v * w.rsqrt()) @ v.T
    lam = torch.linalg.eigvalsh(inverse_root @ between @ inverse_root).clamp_min(0)
    p = lam / lam.sum().clamp_min(torch.finfo(torch.float64).tiny) + eps
    return math.exp(float(-(p * p.log()).sum()))


def health(features: torch.Tensor, embedded: torch.Tensor) -> dict:
    return {
        "val/rankme": rankme(features),
        "val/embedding_rankme": rankme(embedded),
        "val/embedding_std": spread(embedded),
        "val/uniformity": uniformity(embedded),
    }


def collapse(metrics: dict) -> str | None:
    """One line saying the embeddings collapsed, when the metrics say so; else None."""
    std, rank = metrics.get("val/embedding_std"), metrics.get("val/embedding_rankme")
    if std is None or rank is None or (std >= COLLAPSED_STD and rank >= COLLAPSED_RANK):
        return None
    return (
        f"the embeddings have collapsed: on the val split their per-dimension std is {std:.3g} (about 1 when spread) "
        f"and their effective rank (RankMe) {rank:.3g}; the loss no longer keeps samples apart: look at the learning "
        "rate, the loss's coefficients and the projector (val/embedding_std, val/embedding_rankme in metrics.jsonl)"
    )
