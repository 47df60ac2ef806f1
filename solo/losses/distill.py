"""Feature distillation: the student's features regressed onto a frozen teacher's, sample by sample.

A per-sample loss, so each rank returns W/N times the sum of its samples' losses (N the global batch; ranks may hold
different numbers of samples, or none): the sum over ranks is W times the global mean (see
solo.distributed.collectives). The teacher's side is detached here: a target, not a path for gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES

__all__ = ["feature_distillation_loss"]

KINDS = ("cosine", "mse")


def feature_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """The mean over the global batch of each sample's distance between `student` and `teacher`, (B, D) features or
    (B, T, D) tokens (a sample's distance then the mean over its T tokens): `cosine`, 1 - cos(s, t) per feature
    vector; `mse`, the squared error averaged over the D dimensions (LightlyTrain's distillation, on features that
    are not normalised)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if student.shape != teacher.shape:
        raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} features must match")
    with torch.autocast(student.device.type, enabled=False):
        s, t = full_precision(student), full_precision(teacher.detach())
        if kind == "cosine":
            distance = 1 - F.cosine_similarity(s, t, dim=-1)
        else:
            distance = (s - t).pow(2).mean(dim=-1)
        per_sample = distance.flatten(1).mean(dim=1) if distance.dim() > 1 else distance
        return per_sample.sum() * (world_size() / sum(batch_sizes(student.shape[0], student.device)))


# A case for the gradient checker (python -m solo.losses.check), each distance with either side as the teacher.


@LOSSES.register("distill")
def distill_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return feature_distillation_loss(z1, z2, "cosine") + feature_distillation_loss(z2, z1, "mse")
