"""CAPI (Darcet et al., 2025): a student predicts, for each masked patch, the cluster its teacher's token falls in.

Two losses, both means over the GLOBAL batch (each rank returns W / M times its sum, M the global count; see
solo.distributed.collectives):
- the clustering loss trains an online clustering head (a linear layer on L2-normalised teacher tokens): the
  cross-entropy of its softmax against its own Sinkhorn-Knopp assignments, over every patch token of the global batch;
- the CAPI loss trains the student: the cross-entropy of its prediction for each predicted (masked) patch against
  that assignment, over every predicted patch of the global batch.
The assignments are global statistics: Sinkhorn-Knopp equipartitions the prototypes over the global batch's tokens
(solo.losses.self_distillation.sinkhorn, column sums all-reduced). Per rank, they and the means would depend on the
number of GPUs and on how the batch is split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES
from solo.losses.self_distillation import sinkhorn

__all__ = ["capi_clustering", "capi_loss"]


def _mean_cross_entropy(targets: torch.Tensor, scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """The mean over every row of the global batch of sum_k -targets[k] log softmax(scores / temperature)[k], for
    rows (..., K): W / M times this rank's sum, M the global count of rows (one all-reduce, no host read)."""
    log_probs = F.log_softmax(full_precision(scores) / temperature, dim=-1)
    total = -(full_precision(targets.detach()) * log_probs).sum()
    rows = torch.full((), scores[..., 0].numel(), dtype=torch.float64, device=scores.device)  # no host-data copy
    return total * (world_size() / all_reduce(rows).clamp_min(1)).to(total.dtype)


def capi_clustering(
    scores: torch.Tensor,
    target_temperature: float,
    prediction_temperature: float,
    iterations: int,
    positionwise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CAPI's online clustering of the teacher's patch tokens. `scores`: (n, P, K), the clustering head's logits for
    each image's P patch tokens. Returns the targets (n, P, K), Sinkhorn-Knopp on exp(scores / target_temperature)
    over the global batch (per position, `positionwise`, as the authors' code by default; else over every token),
    rows summing to 1, detached; and the clustering loss, the mean over every token of the global batch of the
    cross-entropy of softmax(scores / prediction_temperature) against its target."""
    with torch.autocast(scores.device.type, enabled=False):
        if positionwise:  # one problem per position over the global batch's images: (P, n, K)
            targets = sinkhorn(scores.transpose(0, 1), target_temperature, iterations).transpose(0, 1)
        else:
            targets = sinkhorn(scores.flatten(0, 1), target_temperature, iterations).view(scores.shape)
        return targets, _mean_cross_entropy(targets, scores, prediction_temperature)


def capi_loss(student: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """CAPI's loss: the mean over every predicted patch of the global batch of sum_k -targets[k] log
    softmax(student / temperature)[k]. `student`, `targets`: (..., K), one row per predicted patch."""
    with torch.autocast(student.device.type, enabled=False):
        return _mean_cross_entropy(targets, student, temperature)


# A case for the gradient checker (python -m solo.losses.check): each row as 2 patches of 2 prototype scores. Tower 2
# is the clustering head's scores (trained by the clustering loss) and its targets; tower 1 the student's predictions
# for a pseudo-random subset of the patches (0, 1 or 2 per image), so ranks hold uneven counts of predicted patches.
def _check(z1: torch.Tensor, z2: torch.Tensor, positionwise: bool) -> torch.Tensor:
    student, teacher = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    targets, clustering = capi_clustering(teacher, 0.5, 0.3, 3, positionwise)
    predicted = torch.sin(100 * student[..., 0].detach()) > 0
    return capi_loss(student[predicted], targets[predicted], 0.2) + clustering


@LOSSES.register("capi")
def capi_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return _check(z1, z2, positionwise=True)


@LOSSES.register("capi_tokens")
def capi_tokens_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return _check(z1, z2, positionwise=False)
