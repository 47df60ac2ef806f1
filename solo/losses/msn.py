"""MSN's and PMSN's loss: the anchors' prototype probabilities against the target view's sharpened, Sinkhorn-balanced
ones, and a regulariser of the anchors' mean probability over the GLOBAL batch.

Both global terms couple every sample: Sinkhorn-Knopp balances the targets over the global batch (its sums
all-reduced, its count the global one), and the mean probability is one differentiable all-reduce of the sum divided
by the global count. The authors' code all-reduces the mean of each rank's mean (wrong on uneven ranks, NaN on an empty
one) and lightly's, without gather_distributed (its default), takes each rank's own mean and Sinkhorn.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair, check_positive
from solo.losses.checked import LOSSES
from solo.losses.self_distillation import sinkhorn

__all__ = ["msn_loss", "msn_targets", "power_law_prior", "prototype_logits"]


def prototype_logits(x: torch.Tensor, prototypes: torch.Tensor, temperature: float) -> torch.Tensor:
    """(n, K): the cosine of each row of `x` (n, D) with each prototype (K, D), divided by `temperature`."""
    return F.normalize(x, dim=1) @ F.normalize(prototypes, dim=1).T / temperature


def msn_targets(
    target: torch.Tensor, prototypes: torch.Tensor, temperature: float, sharpen: float, sinkhorn_iterations: int
) -> torch.Tensor:
    """(n, K) targets, detached: the target view's prototype probabilities sharpened (p ** (1 / sharpen), renormalised:
    a softmax of the logits divided by `sharpen`), then, with `sinkhorn_iterations` > 0, Sinkhorn-Knopp over the
    GLOBAL batch started from those probabilities (the authors' distributed_sinkhorn)."""
    with torch.no_grad(), torch.autocast(target.device.type, enabled=False):
        logits = prototype_logits(full_precision(target.detach()), full_precision(prototypes.detach()), temperature)
        log_sharpened = F.log_softmax(logits / sharpen, dim=1)
        if not sinkhorn_iterations:
            return log_sharpened.exp()
        # exp(scores / 1) is the sharpened probabilities up to a per-prototype factor, which Sinkhorn's first step
        # (every prototype's mass to 1/K) removes: the authors' iterations from their starting point.
        return sinkhorn(log_sharpened, 1.0, sinkhorn_iterations)


def power_law_prior(k: int, exponent: float, dtype=torch.float64, device=None) -> torch.Tensor:
    """(K,): prototype k's share proportional to k ** -exponent, k = 1..K (lightly's PMSN prior)."""
    shares = torch.arange(1, k + 1, dtype=dtype, device=device) ** -exponent
    return shares / shares.sum()


def msn_loss(
    anchors: list[torch.Tensor],
    target: torch.Tensor,
    prototypes: torch.Tensor,
    temperature: float = 0.1,
    sharpen: float = 0.25,
    sinkhorn_iterations: int = 3,
    regularisation_weight: float = 1.0,
    prior: torch.Tensor | None = None,
) -> torch.Tensor:
    """MSN (Assran et al., 2022): with p = softmax(cos(anchor, prototypes) / temperature) for each anchor row and q its
    sample's target (msn_targets),

        L = mean over the anchor rows of the GLOBAL batch of H(q, p) + regularisation_weight * R(p_mean),

    p_mean the mean of p over every anchor row of the global batch (all views). R is the mean-entropy maximisation
    sum_k p_mean[k] log p_mean[k] + log K (KL(p_mean || uniform)); with `prior` (K,) it is PMSN's (Assran et al.,
    2023) sum_k prior[k] log(prior[k] / p_mean[k]) (KL(prior || p_mean), lightly's direction).

    `anchors`: V (n, D) views of the same n samples (the masked view, then the focal ones); `target`: the teacher's
    (n, D) output on the target view; `prototypes`: (K, D), not normalised (the targets use them detached).
    """
    if not isinstance(anchors, (list, tuple)) or not anchors:
        raise ValueError("anchors must be a non-empty list of (batch, features) tensors")
    for i, view in enumerate(anchors):
        check_pair(target, view, "target", f"anchors[{i}]")
    check_positive(temperature, "temperature")
    check_positive(sharpen, "sharpen")
    check_non_negative(regularisation_weight, "regularisation_weight")
    if isinstance(sinkhorn_iterations, bool) or not isinstance(sinkhorn_iterations, int) or sinkhorn_iterations < 0:
        raise ValueError(f"sinkhorn_iterations must be an int >= 0, got {sinkhorn_iterations!r}")
    k = prototypes.shape[0]
    if prior is not None and prior.shape != (k,):
        raise ValueError(f"prior must be a ({k},) tensor, one share per prototype, got {tuple(prior.shape)}")
    with torch.autocast(target.device.type, enabled=False):
        total = sum(batch_sizes(target.shape[0], target.device))
        if total < 1:
            raise ValueError("msn_loss needs a global batch of at least 1 sample, got 0")
        rows = total * len(anchors)
        targets = msn_targets(target, prototypes, temperature, sharpen, sinkhorn_iterations)
        protos = full_precision(prototypes)
        log_probs = [F.log_softmax(prototype_logits(full_precision(a), protos, temperature), dim=1) for a in anchors]
        cross_entropy = -sum((targets * lp).sum() for lp in log_probs) * (world_size() / rows)
        if not regularisation_weight:
            return cross_entropy
        mean_probs = all_reduce(sum(lp.exp().sum(dim=0) for lp in log_probs)) / rows
        if prior is None:
            regulariser = (mean_probs * mean_probs.log()).sum() + math.log(k)
        else:
            prior = full_precision(prior)
            regulariser = (prior * (prior.log() - mean_probs.log())).sum()
        return cross_entropy + regularisation_weight * regulariser


# Cases for the gradient checker: six fixed prototypes in the checker's 4 dimensions; two anchor views of each sample
# (z1 and z1 + z2), the other tower's output the target; milder temperatures than the papers' (the same formula).
CHECK_PROTOTYPES = (
    (1.0, 0.2, -0.3, 0.0),
    (-0.5, 1.0, 0.1, 0.4),
    (0.3, -0.7, 1.0, -0.2),
    (0.0, 0.4, -0.6, 1.0),
    (-1.0, -0.3, 0.2, 0.5),
    (0.6, 0.6, 0.6, -0.6),
)


def _check_case(z1: torch.Tensor, z2: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor:
    prototypes = torch.tensor(CHECK_PROTOTYPES, dtype=z1.dtype)
    settings = {"temperature": 0.5, "sharpen": 0.5, "sinkhorn_iterations": 3, "prior": prior}
    return msn_loss([z1, z1 + z2], z2.detach(), prototypes, **settings) + msn_loss(
        [z2], z1.detach(), prototypes, **settings
    )


@LOSSES.register("msn")
def msn_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return _check_case(z1, z2, prior=None)


@LOSSES.register("pmsn")
def pmsn_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return _check_case(z1, z2, prior=power_law_prior(len(CHECK_PROTOTYPES), 0.25, z1.dtype))
