"""The popular ways of distributing contrastive losses that give wrong gradients.

Used to show that the gradient checker rejects them: a check that cannot fail proves nothing.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from solo.distributed import rank, world_size
from solo.losses.barlow_twins import _standardise


class GatherRankOnly(torch.autograd.Function):
    """all_gather whose backward keeps only this rank's slice of its own gradient (no sum over ranks)."""

    @staticmethod
    def forward(ctx, x):
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


def gather_rank_only(x):
    return GatherRankOnly.apply(x) if world_size() > 1 else x  # the reference runs without a process group


def _nt_xent_logits(anchors, candidates, self_index, temperature=0.3):
    logits = anchors @ candidates.T / temperature
    return logits.masked_fill(F.one_hot(self_index, candidates.shape[0]).bool(), float("-inf"))


def nt_xent_local_anchors_rank_only_gather(z1, z2):
    """Local anchors, as solo does, but the gather drops the other ranks' gradients: missing cross terms."""
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    n, w, r = z1.shape[0], world_size(), rank()
    total = n * w
    rows = torch.arange(r * n, (r + 1) * n)
    candidates = torch.cat([gather_rank_only(z1), gather_rank_only(z2)])
    logits = _nt_xent_logits(torch.cat([z1, z2]), candidates, torch.cat([rows, rows + total]))
    return F.cross_entropy(logits, torch.cat([rows + total, rows]), reduction="sum") * w / (2 * total)


def nt_xent_full_loss_rank_only_gather(z1, z2):
    """Every rank computes the whole N x N loss and the gather keeps only its slice: 1/W after DDP's mean."""
    z1, z2 = F.normalize(gather_rank_only(z1), dim=1), F.normalize(gather_rank_only(z2), dim=1)
    total = z1.shape[0]
    rows = torch.arange(total)
    logits = _nt_xent_logits(torch.cat([z1, z2]), torch.cat([z1, z2]), torch.cat([rows, rows + total]))
    return F.cross_entropy(logits, torch.cat([rows + total, rows]))


def barlow_twins_plain_all_reduce(z1, z2, lambd=0.05):
    """Global statistics, but the cross-correlation summed with dist.all_reduce, which autograd cannot see: 1/W."""
    n = z1.shape[0] * world_size()
    local = _standardise(z1, n).T @ _standardise(z2, n) / n
    summed = local.detach().clone()
    if world_size() > 1:
        dist.all_reduce(summed)
    c = local + (summed - local.detach())  # the global value, with the gradient of the local term only
    diagonal = torch.diagonal(c)
    return (1 - diagonal).pow(2).sum() + lambd * (c - torch.diag(diagonal)).pow(2).sum()


WRONG = [
    "tests.wrong_losses:nt_xent_local_anchors_rank_only_gather",
    "tests.wrong_losses:nt_xent_full_loss_rank_only_gather",
    "tests.wrong_losses:barlow_twins_plain_all_reduce",
]
