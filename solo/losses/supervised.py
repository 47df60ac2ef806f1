"""The supervised cross-entropy (method=supervised, main_linear.py's fine-tuning), averaged over the global batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES

__all__ = ["supervised_loss"]


def supervised_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `logits` against `labels`, the mean over the global batch: each rank returns W/N times the sum
    of its samples' losses, which DDP's gradient mean turns into the gradient of the global mean. The mean of the ranks'
    means differs as soon as their batches do."""
    with torch.autocast(logits.device.type, enabled=False):
        loss_sum = F.cross_entropy(full_precision(logits), labels, reduction="sum")
        return loss_sum * (world_size() / sum(batch_sizes(len(labels), labels.device)))


@LOSSES.register("supervised")
def supervised_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # The checker's batches have no labels: each tower's logits are labelled by the other tower's argmax.
    return supervised_loss(z1, z2.detach().argmax(dim=1)) + supervised_loss(z2, z1.detach().argmax(dim=1))
