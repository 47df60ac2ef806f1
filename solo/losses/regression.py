"""Losses against a momentum teacher's outputs: BYOL's regression and MoCo v3's InfoNCE.

The teacher's side (`z`, `k`) is detached here: it is a target, not a path for gradients. Both are
per-sample losses, so each rank returns W/N times the sum of its samples' losses (N the global batch,
ranks may hold different numbers of samples): the sum over ranks is W * L, which DDP's gradient mean
turns into exactly grad L (see solo.distributed.collectives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, gather, world_size
from solo.losses._checks import check_pair, check_positive
from solo.losses.contrastive import _global_rows
from solo.losses.registry import LOSSES
from solo.dtypes import full_precision


def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL (Grill et al., 2020): mean over the global batch of 2 - 2 cos(p_i, z_i).

    `p` is the online prediction, `z` the target projection (detached here). A mean over the global
    batch, not the mean of the ranks' means: those differ as soon as the ranks' batches do.
    """
    check_pair(p, z, "p", "z")
    with torch.autocast(p.device.type, enabled=False):
        p = F.normalize(full_precision(p), dim=1)
        z = F.normalize(full_precision(z.detach()), dim=1)
        total = sum(batch_sizes(p.shape[0], p.device))
        loss_sum = (2 - 2 * torch.linalg.vecdot(p, z)).sum()
        return loss_sum * (world_size() / total)


def mocov3_loss(q: torch.Tensor, k: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """MoCo v3 (Chen, Xie & He, 2021): 2 * temperature * InfoNCE of the queries against the global batch's keys.

    q and k are L2-normalised here and k (the momentum teacher's keys) is detached. Every query is
    scored against the keys of the whole global batch (gathered; no gradient flows back to them), its
    positive being the key of the same sample; the cross-entropy is averaged over the global batch and
    multiplied by 2 * temperature, as in the paper's code. Local keys only would make the negatives,
    hence the loss, depend on the number of GPUs.
    """
    check_pair(q, k, "q", "k")
    check_positive(temperature, "temperature")
    with torch.autocast(q.device.type, enabled=False):
        q = F.normalize(full_precision(q), dim=1)
        k = F.normalize(full_precision(k.detach()), dim=1)
        t = full_precision(temperature) if isinstance(temperature, torch.Tensor) else temperature
        sizes, rows = _global_rows(q.shape[0], q.device)
        logits = q @ gather(k, sizes).T / t
        loss_sum = F.cross_entropy(logits, rows, reduction="sum")
        return loss_sum * (world_size() / sum(sizes)) * (2 * t)


# Cases for the gradient checker (python -m solo.losses.check): symmetrised, as the methods use them.


@LOSSES.register("byol")
def byol_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return byol_loss(z1, z2) + byol_loss(z2, z1)


@LOSSES.register("mocov3")
def mocov3_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return mocov3_loss(z1, z2, 0.5) + mocov3_loss(z2, z1, 0.5)
