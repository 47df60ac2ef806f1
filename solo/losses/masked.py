"""Losses over masked patches (MAE's, I-JEPA's, SimMIM's, AIM's): a mean over every masked patch of the global batch.

The usual implementation takes each rank's mean over its own masked patches and lets DDP average the ranks: the
global mean only when every rank holds as many masked patches, which uneven or empty ranks (and masks whose size
varies per sample) break. Here each rank returns W / M times the sum over its masked patches, M the global count
(one all-reduce of a count, no host read), so the sum over ranks is W times the global mean (see
solo.distributed.collectives).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from solo.distributed import batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES

__all__ = [
    "data2vec2_loss",
    "masked_token_cross_entropy",
    "masked_patch_l1",
    "masked_patch_mse",
    "masked_patch_smooth_l1",
    "next_patch_mse",
    "normalised_patches",
]


def masked_count(mask: torch.Tensor) -> torch.Tensor:
    """The number of True entries of `mask` over every rank (at least 1: no masked patch gives a loss of 0)."""
    count = mask.sum().to(torch.float64)
    if world_size() > 1:
        dist.all_reduce(count)
    return count.clamp_min(1)


def _masked_patch_mean(error: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of the per-patch `error` (B, N) over the patches where `mask` is True, over the global batch: W / M
    times this rank's sum."""
    total = (error * mask).sum()
    return total * (world_size() / masked_count(mask)).to(total.dtype)


def masked_patch_mse(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MAE (He et al., 2022): the squared error per pixel of each patch, averaged within the patch, then averaged over
    every masked patch of the global batch. `prediction`, `target`: (B, N, P); `mask`: (B, N), True where hidden."""
    with torch.autocast(prediction.device.type, enabled=False):
        error = (full_precision(prediction) - full_precision(target.detach())).pow(2).mean(dim=-1)
        return _masked_patch_mean(error, mask)


def masked_token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BEiT (Bao et al., 2022): the cross-entropy of each hidden patch's predicted visual token, averaged over every
    masked patch of the global batch (the official code's mean is its GPU batch's). `logits`: (B, N, V); `tokens`: (B,
    N) integer token ids, no gradient; `mask`: (B, N), True where hidden."""
    with torch.autocast(logits.device.type, enabled=False):
        error = F.cross_entropy(full_precision(logits).transpose(1, 2), tokens.detach(), reduction="none")
        return _masked_patch_mean(error, mask)


def masked_patch_smooth_l1(
    prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, beta: float = 1.0
) -> torch.Tensor:
    """I-JEPA's loss as the official code computes it (`F.smooth_l1_loss(z, h)`: beta 1, the mean over every element):
    the smooth-L1 error per feature (0.5 x^2 / beta below beta, |x| - 0.5 beta above), averaged within the patch, then
    averaged over every masked patch of the global batch (the official code's mean is its GPU batch's). Shapes as
    masked_patch_mse's."""
    with torch.autocast(prediction.device.type, enabled=False):
        pred, tgt = full_precision(prediction), full_precision(target.detach())
        error = F.smooth_l1_loss(pred, tgt, reduction="none", beta=beta).mean(dim=-1)
        return _masked_patch_mean(error, mask)


def masked_patch_l1(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SimMIM (Xie et al., 2022): the absolute error per pixel, averaged over every masked pixel of the global batch
    (every patch holds as many pixels: the mean within each patch, then over the masked patches). Shapes as
    masked_patch_mse's."""
    with torch.autocast(prediction.device.type, enabled=False):
        error = (full_precision(prediction) - full_precision(target.detach())).abs().mean(dim=-1)
        return _masked_patch_mean(error, mask)


def next_patch_mse(prediction: torch.Tensor, target: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """AIM (El-Nouby et al., 2024): each position's output predicts the next patch in raster order; the squared error
    per pixel, averaged within the patch, then over every predicted patch of the global batch (those after each
    sample's prefix). `prediction`: (B, N, P), row i the prediction of patch i + 1 (the last row predicts nothing);
    `target`: (B, N, P); `predicted`: (B, N), True at the patches to predict (never the first)."""
    return masked_patch_mse(prediction[:, :-1], target[:, 1:], predicted[:, 1:])


def data2vec2_loss(
    prediction: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    class_prediction: torch.Tensor,
    class_target: torch.Tensor,
    class_weight: float,
) -> torch.Tensor:
    """data2vec 2.0 (Baevski et al., 2023): the squared error of each hidden patch's prediction, summed over its D
    features and scaled by 1 / sqrt(D), averaged over every hidden patch of the global batch; plus `class_weight`
    times the class token's squared error to the mean of its image's targets, alike summed and scaled, averaged over
    the global batch's rows. `prediction`, `target`: (B, N, D); `mask`: (B, N), True where hidden;
    `class_prediction`, `class_target`: (B, D). The targets are detached.

    The official code weighs the class term by each GPU's count of hidden patches and sums it over the GPU's rows:
    per GPU, hence a weight that depends on the per-GPU batch. Here it is a mean over the global batch."""
    width = prediction.shape[-1]
    loss = math.sqrt(width) * masked_patch_mse(prediction, target, mask)  # the mean over D, times D / sqrt(D)
    if class_weight == 0:
        return loss
    with torch.autocast(class_prediction.device.type, enabled=False):
        error = (full_precision(class_prediction) - full_precision(class_target.detach())).pow(2).sum(dim=-1)
        rows = sum(batch_sizes(class_prediction.shape[0], class_prediction.device))
        return loss + class_weight / math.sqrt(width) * error.sum() * (world_size() / max(rows, 1))


def normalised_patches(patches: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each patch's pixels standardised by the patch's own mean and (unbiased) variance: MAE's norm_pix_loss target."""
    mean, var = patches.mean(dim=-1, keepdim=True), patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps).sqrt()


# A case for the gradient checker (python -m solo.losses.check): each row as 2 patches of 2 values, a patch masked by a
# pseudo-random function of its target's first value, so the number of masked patches varies from sample to sample;
# both ways round, so both towers get a gradient (the target takes none).
def _check_mask(target: torch.Tensor) -> torch.Tensor:
    return torch.sin(100 * target[..., 0].detach()) > 0


@LOSSES.register("mae")
def mae_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return masked_patch_mse(a, b, _check_mask(b)) + masked_patch_mse(b, a, _check_mask(a))


@LOSSES.register("beit")
def beit_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # As mae's case, each patch's 2 values the logits of 2 tokens; the other tower's larger value its token.
    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return masked_token_cross_entropy(a, b.argmax(-1), _check_mask(b)) + masked_token_cross_entropy(
        b, a.argmax(-1), _check_mask(a)
    )


@LOSSES.register("ijepa")
def ijepa_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # As mae's case, with a beta that puts about half of the errors on each side of smooth-L1's bend.
    def loss(prediction, target):
        return masked_patch_smooth_l1(prediction, target, _check_mask(target), beta=0.3)

    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return loss(a, b) + loss(b, a)


@LOSSES.register("simmim")
def simmim_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return masked_patch_l1(a, b, _check_mask(b)) + masked_patch_l1(b, a, _check_mask(a))


@LOSSES.register("data2vec2")
def data2vec2_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # As mae's case, each row's mean patch as its class token, the class term at a weight of the patches' order.
    def loss(prediction, target):
        return data2vec2_loss(prediction, target, _check_mask(target), prediction.mean(1), target.mean(1), 0.5)

    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return loss(a, b) + loss(b, a)


def _check_prefix(target: torch.Tensor) -> torch.Tensor:
    """Each row's 4 patches with a prefix of 1 to 3 of them, a pseudo-random function of its target's first value."""
    length = 1 + ((torch.sin(100 * target[:, 0, 0].detach()) + 1) * 1.5).long().clamp(max=2)
    return torch.arange(target.shape[1], device=target.device) >= length[:, None]


@LOSSES.register("aim")
def aim_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as 4 patches of 1 value, so that the prefix, hence the number of predicted patches, varies per row.
    a, b = z1.reshape(len(z1), 4, 1), z2.reshape(len(z2), 4, 1)
    return next_patch_mse(a, b, _check_prefix(b)) + next_patch_mse(b, a, _check_prefix(a))
