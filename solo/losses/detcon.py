"""DetCon-S's loss (Hénaff et al., 2021): a contrastive loss between the views' region embeddings, each region's
positive the same region of the same image in the other view, its negatives every other region of the global batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, gather, rank, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_positive
from solo.losses.checked import LOSSES

__all__ = ["detcon_loss"]


def detcon_loss(
    regions1: torch.Tensor,
    regions2: torch.Tensor,
    present1: torch.Tensor,
    present2: torch.Tensor,
    temperature: float = 0.1,
) -> torch.Tensor:
    """DetCon-S for two views: `regions1`, `regions2` (n, R, D) the region embeddings of each view (L2-normalised
    here), `present1`, `present2` (n, R) bool whether the region shows in the view.

    Each region present in both views is an anchor, in each view: with s = cosine / temperature, its loss is

        -log exp(s(anchor, positive)) / sum over the candidates c of exp(s(anchor, c)),

    the positive being the same region of the same image in the other view, the candidates every region present in
    its view, of both views of every image of the GLOBAL batch, but the anchor itself (the paper's negatives: the
    other regions of its image and all regions of the other images). The loss is the mean over the global batch's
    anchors. Regions absent from a view are neither anchors nor candidates: their rows are weighted out (no sampling).
    The candidates are gathered with a reduce-scatter backward (solo.distributed.gather), the anchor count
    all-reduced; each rank returns W times its anchors' share."""
    if regions1.dim() != 3 or regions1.shape != regions2.shape or present1.shape != regions1.shape[:2]:
        raise ValueError(
            f"regions1 and regions2 must be (batch, regions, features) tensors of one shape, and present1 and "
            f"present2 (batch, regions): got {tuple(regions1.shape)}, {tuple(regions2.shape)} and "
            f"{tuple(present1.shape)}"
        )
    if present2.shape != present1.shape:
        raise ValueError(
            f"present1 and present2 must have one shape: got {tuple(present1.shape)}, {tuple(present2.shape)}"
        )
    check_positive(temperature, "temperature")
    with torch.autocast(regions1.device.type, enabled=False):
        u = F.normalize(torch.stack([full_precision(regions1), full_precision(regions2)], dim=1), dim=3)  # (n, 2, R, D)
        present = torch.stack([present1, present2], dim=1)  # (n, 2, R)
        n, _, r, _ = u.shape
        sizes = batch_sizes(n, u.device)
        offset = sum(sizes[: rank()])
        candidates = gather(u, sizes).flatten(0, 2)  # (N * 2 * R,): image, then view, then region
        with torch.no_grad():
            shown = gather(present.to(u.dtype), sizes).flatten() > 0
        # This rank's anchors in the same order, and where they and their positives sit among the candidates.
        image = torch.arange(offset, offset + n, device=u.device)[:, None, None]
        view = torch.arange(2, device=u.device)[None, :, None]
        region = torch.arange(r, device=u.device)[None, None, :]
        self_index = ((image * 2 + view) * r + region).flatten()
        anchor = (present & present.flip(1)).flatten()  # the region shows in both views
        logits = u.flatten(0, 2) @ candidates.T / temperature
        excluded = ~shown[None, :] | (self_index[:, None] == torch.arange(len(candidates), device=u.device))
        # Rows of regions that are not anchors are zeroed before the log-sum-exp: finite values, no gradient.
        logits = torch.where(anchor[:, None], logits.masked_fill(excluded, float("-inf")), 0.0)
        positive = torch.linalg.vecdot(u, u.flip(1), dim=3).flatten() / temperature  # the other view's, no gather
        losses = torch.where(anchor, logits.logsumexp(dim=1) - positive, 0.0)
        count = all_reduce(anchor.sum().to(u.dtype)).clamp(min=1)
        return losses.sum() * world_size() / count


def _check_regions(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's 4 features as 3 regions' embeddings (different non-linear functions of them), the first two present
    or not by a function of the row (so that anchors and candidates differ per row and view), the third always."""
    regions = torch.stack([z[:, :3], torch.tanh(z[:, 1:]), z[:, [0, 2, 3]] ** 2 / 2], dim=1)
    shown = torch.sin(100 * z[:, :2].detach()) > -0.3
    return regions, torch.cat([shown, torch.ones_like(shown[:, :1])], dim=1)


@LOSSES.register("detcon")  # a case for the gradient checker (python -m solo.losses.check)
def detcon_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    (regions1, present1), (regions2, present2) = _check_regions(z1), _check_regions(z2)
    return detcon_loss(regions1, regions2, present1, present2, temperature=0.1)
