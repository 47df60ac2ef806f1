"""SigLIP's pairwise sigmoid loss over the global batch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from solo.distributed import gather, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_pair, check_positive, checks_values
from solo.losses.checked import LOSSES
from solo.losses.contrastive import _global_rows, _is_column

__all__ = ["siglip_loss"]


def siglip_loss(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_scale: float | torch.Tensor,
    bias: float | torch.Tensor,
) -> torch.Tensor:
    """SigLIP (Zhai et al., 2023): sum over all N x N image-text pairs of -log sigmoid(label * logit), / N.

    logit = logit_scale * <image_i, text_j> + bias, label = +1 on the matching pair (i = j in the global
    batch) and -1 elsewhere. Features are L2-normalised by the caller (as for clip_loss); `logit_scale`
    and `bias` may be learnable tensors, whose gradients are exact too.

    Every image is paired with every text of the GLOBAL batch, so the negatives do not depend on the
    number of GPUs. This rank scores its own images against the gathered texts (memory B_local x N) and
    returns W/N times the sum of its rows; gather's reduce-scatter backward brings every text its
    gradient from all ranks. big_vision and open_clip instead pass chunks of texts around a ring of
    ranks (memory B_local x B_local); gathering gives the same value and the same gradients.
    """
    check_pair(image_features, text_features, "image_features", "text_features")
    check_positive(logit_scale, "logit_scale")
    if checks_values() or not isinstance(bias, torch.Tensor):
        b = float(bias.detach()) if isinstance(bias, torch.Tensor) else float(bias)
        if not math.isfinite(b):
            raise ValueError(f"bias must be a finite number, got {b}")
    with torch.autocast(image_features.device.type, enabled=False):
        image = full_precision(image_features)
        text = full_precision(text_features)
        scale = full_precision(logit_scale) if isinstance(logit_scale, torch.Tensor) else logit_scale
        bias = full_precision(bias) if isinstance(bias, torch.Tensor) else bias
        sizes, rows = _global_rows(image.shape[0], image.device)
        total = sum(sizes)
        logits = scale * image @ gather(text, sizes).T + bias
        labels = 2 * _is_column(rows, total).to(logits.dtype) - 1
        loss_sum = -F.logsigmoid(labels * logits).sum()
        return loss_sum * (world_size() / total)


@LOSSES.register("siglip", learnable={"logit_scale": 10.0, "bias": -10.0})  # SigLIP's initial values
def siglip_check(z1: torch.Tensor, z2: torch.Tensor, logit_scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return siglip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale, bias)
