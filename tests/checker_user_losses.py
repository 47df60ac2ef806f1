"""A dozen small user losses for the gradient checker, written the way a user would, all exact.

Seven are registered with learnable scalars (a logit scale, a bias, a temperature, a weight), so the
checker compares those gradients too; the others are plain `fn(z1, z2)` functions (one is registered
without scalars). Each follows solo's convention: in a process group every rank returns W times its
share of the global loss (see solo.distributed.collectives).
"""

import math

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, gather, rank, world_size
from solo.losses import LOSSES, barlow_twins_loss, clip_loss, nt_xent_loss


def _sizes_and_offset(n_local: int) -> tuple[list[int], int]:
    sizes = batch_sizes(n_local)
    return sizes, sum(sizes[: rank()])


# --- SigLIP: pairwise sigmoid loss, learnable scale and bias -----------------------------------------


def siglip_terms(z1, z2, logit_scale, bias):
    """-log sigmoid(label * (scale * cos + bias)) of this rank's images against every text of the
    global batch (label +1 on the matching pair, -1 elsewhere), and the global batch size N.

    `bias` may be a scalar or an (n_local, N) tensor (tests.wrong_losses builds a wrong one).
    """
    image, text = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    sizes, offset = _sizes_and_offset(image.shape[0])
    logits = logit_scale * image @ gather(text, sizes).T + bias
    labels = 2 * torch.eye(sum(sizes), dtype=logits.dtype)[offset : offset + image.shape[0]] - 1
    return -F.logsigmoid(labels * logits), sum(sizes)


@LOSSES.register("user_siglip", learnable={"logit_scale": 10.0, "bias": -10.0})
def siglip(z1, z2, logit_scale, bias):
    """SigLIP: the sum over all N^2 pairs divided by N; this rank's rows, times W."""
    terms, total = siglip_terms(z1, z2, logit_scale, bias)
    return terms.sum() * (world_size() / total)


@LOSSES.register("user_siglip_log_scale", learnable={"log_scale": math.log(10.0), "bias": -10.0})
def siglip_log_scale(z1, z2, log_scale, bias):
    """SigLIP as published: the scale is learnt through its logarithm."""
    return siglip(z1, z2, log_scale.exp(), bias)


# --- solo's own losses at other settings, some with a learnt scalar ----------------------------------


def nt_xent_t01(z1, z2):
    return nt_xent_loss(z1, z2, temperature=0.1)


@LOSSES.register("user_nt_xent_learnt_temperature", learnable={"temperature": 0.5})
def nt_xent_learnt_temperature(z1, z2, temperature):
    return nt_xent_loss(z1, z2, temperature)


@LOSSES.register("user_clip_scale_10", learnable={"logit_scale": 10.0})
def clip_scale_10(z1, z2, logit_scale):
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale)


def clip_fixed_scale(z1, z2):
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), 20.0)


@LOSSES.register("user_barlow_twins_diagonal")  # registered, with no learnable scalar
def barlow_twins_diagonal(z1, z2):
    return barlow_twins_loss(z1, z2, lambd=0.0)


@LOSSES.register("user_barlow_twins_weighted", learnable={"weight": 0.5})
def barlow_twins_weighted(z1, z2, weight):
    """Every rank returns the whole loss (as barlow_twins_loss does), times a learnt weight."""
    return weight * barlow_twins_loss(z1, z2, lambd=0.005)


@LOSSES.register("user_clip_plus_barlow", learnable={"logit_scale": 5.0, "mix": 0.1})
def clip_plus_barlow(z1, z2, logit_scale, mix):
    """A W-times-share loss plus a whole-loss-on-every-rank one: both conventions sum to W * L."""
    return clip_scale_10(z1, z2, logit_scale) + mix * barlow_twins_loss(z1, z2, lambd=0.005)


# --- written from scratch with solo.distributed ------------------------------------------------------


def _alignment_share(z1, z2):
    """Mean over the global batch of |n1 - n2|^2 (n: normalised); this rank's share, times W."""
    n1, n2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    total = sum(batch_sizes(z1.shape[0]))
    return (n1 - n2).pow(2).sum() * (world_size() / total)


def alignment(z1, z2):
    return _alignment_share(z1, z2)


@LOSSES.register("user_alignment_uniformity", learnable={"t": 2.0})
def alignment_uniformity(z1, z2, t):
    """Wang & Isola: alignment + log mean_{i != j} exp(-t |n_i - n_j|^2) over the global batch.

    The log of a global mean is not a sum over samples: the sum is all-reduced, so every rank returns
    the whole uniformity term (and the all-reduce's backward makes the sum over ranks W times its gradient).
    """
    n = F.normalize(z1, dim=1)
    sizes, offset = _sizes_and_offset(n.shape[0])
    total = sum(sizes)
    kernel = torch.exp(-t * (2 - 2 * n @ gather(n, sizes).T))  # |a - b|^2 of unit vectors, smooth at a = b
    is_self = F.one_hot(torch.arange(offset, offset + n.shape[0]), total).bool()
    pair_sum = all_reduce(kernel.masked_fill(is_self, 0.0).sum())
    return _alignment_share(z1, z2) + torch.log(pair_sum / (total * (total - 1)))


def vicreg_invariance_variance(z1, z2):
    """VICReg's invariance (global mean squared error) plus its variance hinge on global standard deviations."""
    total = sum(batch_sizes(z1.shape[0]))
    invariance = (z1 - z2).pow(2).sum() * (world_size() / (total * z1.shape[1]))
    variance = 0.0
    for z in (z1, z2):
        mean = all_reduce(z.sum(dim=0)) / total
        var = all_reduce((z - mean).pow(2).sum(dim=0)) / (total - 1)
        variance = variance + F.relu(1 - torch.sqrt(var + 1e-4)).mean()
    return invariance + variance


NAMES = [
    "siglip",
    "siglip_log_scale",
    "nt_xent_t01",
    "nt_xent_learnt_temperature",
    "clip_scale_10",
    "clip_fixed_scale",
    "barlow_twins_diagonal",
    "barlow_twins_weighted",
    "clip_plus_barlow",
    "alignment",
    "alignment_uniformity",
    "vicreg_invariance_variance",
]
SPECS = [f"tests.checker_user_losses:{name}" for name in NAMES]
