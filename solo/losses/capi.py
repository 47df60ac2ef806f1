"""CAPI (Darcet et al., 2025): a student predicts, for each masked patch, the cluster its teacher's token falls in.

Two losses, both means over the GLOBAL batch (each rank returns W / M times its sum, M the global count; see
solo.distributed.collectives):
- the clustering loss trains an online clustering head (a linear layer on L2-normalised teacher tokens): the
  cross-entropy of its softmax against its own Sinkhorn-Knopp assignments, over every patch token of the global batch;
- the CAPI loss trains the student: the cross-entropy of its prediction for each predicted (masked) patch against
  that assignment, over every predicted patch of the global batch.
The assignments are global statistics: Sinkhorn-Knopp equipartitions the prototypes over the global batch's tokens
(`capi_sinkhorn`, column sums all-reduced). Per rank, they and the means would depend on the number of GPUs and on
how the batch is split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, world_size
from solo.dtypes import full_precision
from solo.losses.checked import LOSSES
from solo.losses.self_distillation import global_max

__all__ = ["capi_clustering", "capi_loss", "capi_sinkhorn"]

# The official code's stable exponent: each prototype's largest score over the global batch becomes exp(50) (its value
# for float32, float64 and bfloat16), so that the epsilon of the first normalisation weighs as little as there.
EXP_CEILING = 50.0


def _mean_cross_entropy(targets: torch.Tensor, scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """The mean over every row of the global batch of sum_k -targets[k] log softmax(scores / temperature)[k], for
    rows (..., K): W / M times this rank's sum, M the global count of rows (one all-reduce, no host read)."""
    log_probs = F.log_softmax(full_precision(scores) / temperature, dim=-1)
    total = -(full_precision(targets.detach()) * log_probs).sum()
    rows = torch.full((), scores[..., 0].numel(), dtype=torch.float64, device=scores.device)  # no host-data copy
    return total * (world_size() / all_reduce(rows).clamp_min(1)).to(total.dtype)


def capi_sinkhorn(scores: torch.Tensor, temperature: float, iterations: int, epsilon: float = 1e-8) -> torch.Tensor:
    """CAPI's Sinkhorn-Knopp in the official form (facebookresearch/capi, `sinkhorn_knopp`): Q = exp(scores /
    temperature), each prototype's global max moved to EXP_CEILING, then `iterations` rounds of dividing every column
    by its sum over the global batch (all-reduced) plus `epsilon` and every row by its sum plus `epsilon`. Over dim -2
    of (..., n, K): the leading dimensions are independent problems. Rows end summing to 1 but where a token's mass is
    of the order of epsilon, which epsilon keeps small (SwAV's form, epsilon = 0, scales every row to 1): at a target
    temperature of 0.06 the two differ by up to 0.07. Detached, in full precision."""
    with torch.no_grad(), torch.autocast(scores.device.type, enabled=False):
        q = full_precision(scores.detach()) / temperature
        *groups, n, k = q.shape
        # A rank with no rows contributes -inf to the max (amax of nothing would raise) and still joins the all-reduces.
        local_max = q.amax(dim=-2) if n else q.new_full((*groups, k), float("-inf"))
        q = torch.exp(q - global_max(local_max).unsqueeze(-2) + EXP_CEILING)
        for _ in range(iterations):
            q = q / (all_reduce(q.sum(dim=-2, keepdim=True)) + epsilon)
            q = q / (q.sum(dim=-1, keepdim=True) + epsilon)
        return q


def capi_clustering(
    scores: torch.Tensor,
    target_temperature: float,
    prediction_temperature: float,
    iterations: int,
    positionwise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CAPI's online clustering of the teacher's patch tokens. `scores`: (n, P, K), the clustering head's logits for
    each image's P patch tokens. Returns the targets (n, P, K), `capi_sinkhorn` of scores / target_temperature
    over the global batch (per position, `positionwise`, as the authors' code by default; else over every token),
    rows summing to 1 (but for tokens of almost no mass), detached; and the clustering loss, the mean over every token of the global batch of the
    cross-entropy of softmax(scores / prediction_temperature) against its target."""
    with torch.autocast(scores.device.type, enabled=False):
        if positionwise:  # one problem per position over the global batch's images: (P, n, K)
            targets = capi_sinkhorn(scores.transpose(0, 1), target_temperature, iterations).transpose(0, 1)
        else:
            targets = capi_sinkhorn(scores.flatten(0, 1), target_temperature, iterations).view(scores.shape)
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
