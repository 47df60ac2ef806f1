"""InfoNCE-style losses over the global batch: local anchors against gathered candidates.

Each rank scores only its own anchors (memory B_local x N), against candidates gathered with a
reduce-scatter backward, and returns W/N times the sum of its anchors' losses. The sum over ranks is
then W * L, which DDP's gradient mean turns into exactly grad L (see solo.distributed.collectives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, gather, rank, world_size
from solo.losses.registry import LOSSES
from solo.losses._checks import check_pair, check_positive, full_precision


def _global_rows(n_local: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
    """Per-rank sizes and this rank's row indices within the gathered batch."""
    sizes = batch_sizes(n_local, device)
    offset = sum(sizes[: rank()])
    return sizes, torch.arange(offset, offset + n_local, device=device)


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """SimCLR's NT-Xent over the global batch of N pairs.

    All 2N views are anchors; each anchor's positive is the other view of its sample and the other
    2N - 2 views are its negatives. Similarities are cosine (features are normalised here), divided by
    `temperature`. Returns this rank's share, scaled so that the mean over ranks is the global loss.
    """
    check_pair(z1, z2, "z1", "z2")
    check_positive(temperature, "temperature")
    with torch.autocast(z1.device.type, enabled=False):
        z1 = F.normalize(full_precision(z1), dim=1)
        z2 = F.normalize(full_precision(z2), dim=1)
        sizes, rows = _global_rows(z1.shape[0], z1.device)
        total = sum(sizes)
        candidates = torch.cat([gather(z1, sizes), gather(z2, sizes)])  # (2N, D): all first views, then all second
        anchors = torch.cat([z1, z2])  # (2n, D)
        logits = anchors @ candidates.T / temperature
        self_index = torch.cat([rows, rows + total])
        positive_index = torch.cat([rows + total, rows])
        is_self = F.one_hot(self_index, 2 * total).bool()
        logits = logits.masked_fill(is_self, float("-inf"))
        loss_sum = F.cross_entropy(logits, positive_index, reduction="sum")
        return loss_sum * (world_size() / (2 * total))


def clip_loss(
    image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: float | torch.Tensor
) -> torch.Tensor:
    """Symmetric InfoNCE of CLIP over the global batch: mean of image->text and text->image.

    Features are L2-normalised by the caller; `logit_scale` multiplies the cosine similarities and
    may be a learnable tensor (its gradient is exact too).
    """
    check_pair(image_features, text_features, "image_features", "text_features")
    check_positive(logit_scale, "logit_scale")
    with torch.autocast(image_features.device.type, enabled=False):
        image = full_precision(image_features)
        text = full_precision(text_features)
        scale = full_precision(logit_scale) if isinstance(logit_scale, torch.Tensor) else logit_scale
        sizes, rows = _global_rows(image.shape[0], image.device)
        image_to_text = scale * image @ gather(text, sizes).T
        text_to_image = scale * text @ gather(image, sizes).T
        loss_sum = F.cross_entropy(image_to_text, rows, reduction="sum") + F.cross_entropy(
            text_to_image, rows, reduction="sum"
        )
        return loss_sum * (world_size() / (2 * sum(sizes)))


# Cases for the gradient checker (python -m solo.distributed.check): the losses at fixed settings.


@LOSSES.register("nt_xent")
def nt_xent_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return nt_xent_loss(z1, z2, temperature=0.3)


@LOSSES.register("clip", learnable={"logit_scale": 1 / 0.07})  # the temperature is learnt, as in CLIP
def clip_check(z1: torch.Tensor, z2: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale)
