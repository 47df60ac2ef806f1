"""InfoNCE-style losses over the global batch: local anchors against gathered candidates.

Each rank scores only its own anchors (memory B_local x N), against candidates gathered with a
reduce-scatter backward, and returns W/N times the sum of its anchors' losses. The sum over ranks is
then W * L, which DDP's gradient mean turns into exactly grad L (see solo.distributed.collectives).

With `tile=` (an int, or "auto") the losses stream over tiles of candidates instead (solo.losses.tiled):
the same value and gradient to rounding, in memory B_local x tile, for global batches whose B_local x N
logits would not fit. Each anchor's loss is lse_i - logit_i(positive): the log-sum-exp goes through the
tiled function, the positive logit is a row-wise dot product through plain autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, gather, rank, world_size
from solo.distributed.collectives import sum_over_ranks
from solo.dtypes import full_precision
from solo.losses._checks import check_non_negative, check_pair, check_positive
from solo.losses.checked import LOSSES
from solo.losses.tiled import resolve_tile, tiled_logsumexp

__all__ = [
    "align_uniform_loss",
    "clip_loss",
    "dcl_loss",
    "directclr_loss",
    "macl_loss",
    "nnclr_loss",
    "nt_xent_loss",
    "supcon_loss",
]


def _global_rows(n_local: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
    """Per-rank sizes and this rank's row indices within the gathered batch."""
    sizes = batch_sizes(n_local, device)
    offset = sum(sizes[: rank()])
    return sizes, torch.arange(offset, offset + n_local, device=device)


def _unit_pairs(z1: torch.Tensor, z2: torch.Tensor, loss: str):
    """The L2-normalised views in full precision, this rank's rows in the global batch, its size N (at least 2: the
    negatives), and the (2N, D) candidates, all first views then all second, gathered with a reduce-scatter backward:
    the anchors and candidates of SimCLR-style losses over the global batch (DCL, MACL)."""
    z1 = F.normalize(full_precision(z1), dim=1)
    z2 = F.normalize(full_precision(z2), dim=1)
    sizes, rows = _global_rows(z1.shape[0], z1.device)
    total = sum(sizes)
    if total < 2:
        raise ValueError(f"{loss} needs a global batch of at least 2 samples (its negatives), got {total}")
    return z1, z2, rows, total, sizes, torch.cat([gather(z1, sizes), gather(z2, sizes)])


def _is_column(index: torch.Tensor, columns: int) -> torch.Tensor:
    """(len(index), columns) bool: row i is True at column index[i] only. F.one_hot would give the same, but it
    checks the indices' range on the host (a synchronisation on a GPU)."""
    return index[:, None] == torch.arange(columns, device=index.device)


def _check_tile(tile: int | str | None) -> None:
    if tile is not None:
        resolve_tile(tile, 1, 1, torch.float32)  # raises on anything but a positive int or "auto"


def nt_xent_loss(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float | torch.Tensor, *, tile: int | str | None = None
) -> torch.Tensor:
    """SimCLR's NT-Xent over the global batch of N pairs.

    All 2N views are anchors; each anchor's positive is the other view of its sample and the other
    2N - 2 views are its negatives. Similarities are cosine (features are normalised here), divided by
    `temperature`. Returns this rank's share, scaled so that the mean over ranks is the global loss.
    `tile` (candidates per tile, or "auto") streams the softmax over tiles in memory 2B_local x tile
    instead of 2B_local x 2N; None (the default) materialises the logits.
    """
    check_pair(z1, z2, "z1", "z2")
    check_positive(temperature, "temperature")
    _check_tile(tile)
    with torch.autocast(z1.device.type, enabled=False):
        z1 = F.normalize(full_precision(z1), dim=1)
        z2 = F.normalize(full_precision(z2), dim=1)
        sizes, rows = _global_rows(z1.shape[0], z1.device)
        total = sum(sizes)
        if tile is not None:
            return _nt_xent_tiled(z1, z2, temperature, sizes, rows, tile)
        candidates = torch.cat([gather(z1, sizes), gather(z2, sizes)])  # (2N, D): all first views, then all second
        anchors = torch.cat([z1, z2])  # (2n, D)
        logits = anchors @ candidates.T / temperature
        self_index = torch.cat([rows, rows + total])
        positive_index = torch.cat([rows + total, rows])
        is_self = _is_column(self_index, 2 * total)
        logits = logits.masked_fill(is_self, float("-inf"))
        loss_sum = F.cross_entropy(logits, positive_index, reduction="sum")
        return loss_sum * (world_size() / (2 * total))


def _nt_xent_tiled(z1, z2, temperature, sizes, rows, tile) -> torch.Tensor:
    """nt_xent_loss's value on normalised views, with the log-sum-exp streamed over candidate tiles."""
    total = sum(sizes)
    anchors = torch.cat([z1, z2])  # (2n, D)
    # In one process the anchors are all the candidates: one tensor for both saves a (2N, D) copy.
    candidates = anchors if world_size() == 1 else torch.cat([gather(z1, sizes), gather(z2, sizes)])
    # As untiled, where the float32 logits are divided by it: a bf16 temperature's reciprocal in float32.
    scale = 1 / (full_precision(temperature) if isinstance(temperature, torch.Tensor) else temperature)
    lse = tiled_logsumexp(anchors, candidates, scale, tile, exclude=torch.cat([rows, rows + total]))
    # Anchor z1[i]'s positive is z2[i] and z2[i]'s is z1[i]: the same dot product, twice; a local one,
    # so it needs no gather (its gradient is the one the untiled loss routes through gather to this rank).
    positive = scale * torch.linalg.vecdot(z1, z2)
    # Row by row, then summed: lse comes in float64 (see solo.losses.tiled), so the sum of the anchors'
    # losses is not the float32 difference of two large sums. The loss in the features' dtype, as untiled.
    loss_sum = (lse - torch.cat([positive, positive])).sum()
    return (loss_sum * (world_size() / (2 * total))).to(z1.dtype)


def dcl_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1, sigma: float | None = None) -> torch.Tensor:
    """Decoupled contrastive learning (Yeh et al., 2022; their Equation 6) over the global batch of N pairs: NT-Xent
    with the positive taken out of the denominator. Each of the 2N views is an anchor; its loss is

        -w_i <u_k, u_p(k)> / temperature + log sum over its 2N - 2 negatives of exp(<u_k, u_m> / temperature),

    u the L2-normalised views (normalised here), p(k) the other view of its sample; the mean over the 2N anchors.
    DCL: w_i = 1. DCLW (`sigma` given): the negative von Mises-Fisher weight w_i = 2 - N softmax_i(<u1_i, u2_i> /
    sigma), the softmax over the N pairs of the GLOBAL batch; a constant of the step, without gradient (as lightly's
    DCLWLoss; the authors' code lets the gradient through it).

    The negatives are every other view of the global batch, gathered with a reduce-scatter backward; each rank
    returns W/N times its anchors' summed loss, as `nt_xent_loss`.
    """
    check_pair(z1, z2, "z1", "z2")
    check_positive(temperature, "temperature")
    if sigma is not None:
        check_positive(sigma, "sigma")
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2, rows, total, sizes, candidates = _unit_pairs(z1, z2, "dcl_loss")
        logits = torch.cat([z1, z2]) @ candidates.T / temperature
        self_or_positive = _is_column(torch.cat([rows, rows + total]), 2 * total) | _is_column(
            torch.cat([rows + total, rows]), 2 * total
        )
        negatives = logits.masked_fill(self_or_positive, float("-inf")).logsumexp(dim=1)
        # Out of the log-sum-exp, the positive is a row-wise dot product of this rank's own views: no gather.
        positive = torch.linalg.vecdot(z1, z2) / temperature
        if sigma is not None:
            similarity = positive.detach() * (temperature / sigma)
            every = gather(similarity, sizes)  # (N,): the global batch's pairs
            positive = positive * (2 - total * torch.exp(similarity - every.logsumexp(dim=0)))
        loss_sum = negatives.sum() - 2 * positive.sum()  # both anchors of a pair share its positive
        return loss_sum * (world_size() / (2 * total))


def macl_loss(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1, alpha: float = 0.5, a0: float = 0.0
) -> torch.Tensor:
    """Model-aware contrastive learning (Huang et al., 2023) over the global batch of N pairs: NT-Xent's anchors and
    candidates (each of the 2N views against the other 2N - 1), with two changes that follow the model.

    - The temperature follows the alignment A, the mean cosine of the N positive pairs of the GLOBAL batch (no
      gradient): t = temperature * (1 + alpha * (A - a0)), the authors' MACLb form with lightly's threshold a0.
    - Each anchor's -log P(positive) is weighted by 1 / (1 - P(positive)), without gradient: the authors' reweighting
      of the uniformity-tolerance dilemma (their code divides by the negatives' summed probability, the same number;
      lightly adds 1e-8 to it).

    The alignment's sum goes through one all-reduce of the ranks' sums; the candidates are gathered with a
    reduce-scatter backward, and each rank returns W/N times its anchors' summed loss, as `nt_xent_loss`.
    """
    check_pair(z1, z2, "z1", "z2")
    check_positive(temperature, "temperature")
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2, rows, total, _, candidates = _unit_pairs(z1, z2, "macl_loss")
        alignment = sum_over_ranks(torch.linalg.vecdot(z1, z2).detach().sum()) / total
        t = temperature * (1 + alpha * (alignment - a0))
        logits = (torch.cat([z1, z2]) @ candidates.T / t).masked_fill(
            _is_column(torch.cat([rows, rows + total]), 2 * total), float("-inf")
        )
        log_p = logits.log_softmax(dim=1).gather(1, torch.cat([rows + total, rows])[:, None]).squeeze(1)
        weight = 1 / -torch.expm1(log_p.detach())  # 1 / (1 - P), P the positive's probability
        return -(weight * log_p).sum() * (world_size() / (2 * total))


def clip_loss(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_scale: float | torch.Tensor,
    *,
    tile: int | str | None = None,
) -> torch.Tensor:
    """Symmetric InfoNCE of CLIP over the global batch: mean of image->text and text->image.

    Features are L2-normalised by the caller; `logit_scale` multiplies the cosine similarities and
    may be a learnable tensor (its gradient is exact too). `tile` (candidates per tile, or "auto")
    streams each direction's softmax over tiles in memory B_local x tile instead of B_local x N; None
    (the default) materialises the logits.
    """
    check_pair(image_features, text_features, "image_features", "text_features")
    check_positive(logit_scale, "logit_scale")
    _check_tile(tile)
    with torch.autocast(image_features.device.type, enabled=False):
        image = full_precision(image_features)
        text = full_precision(text_features)
        scale = full_precision(logit_scale) if isinstance(logit_scale, torch.Tensor) else logit_scale
        sizes, rows = _global_rows(image.shape[0], image.device)
        if tile is not None:
            # Both directions' positive logit of pair i is scale * <image[i], text[i]>; the rows' losses
            # are summed in float64, lse's dtype (see _nt_xent_tiled).
            positive = scale * torch.linalg.vecdot(image, text)
            image_to_text = tiled_logsumexp(image, gather(text, sizes), scale, tile) - positive
            text_to_image = tiled_logsumexp(text, gather(image, sizes), scale, tile) - positive
            loss_sum = image_to_text.sum() + text_to_image.sum()
            return (loss_sum * (world_size() / (2 * sum(sizes)))).to(image.dtype)
        image_to_text = scale * image @ gather(text, sizes).T
        text_to_image = scale * text @ gather(image, sizes).T
        loss_sum = F.cross_entropy(image_to_text, rows, reduction="sum") + F.cross_entropy(
            text_to_image, rows, reduction="sum"
        )
        return loss_sum * (world_size() / (2 * sum(sizes)))


def directclr_loss(r1: torch.Tensor, r2: torch.Tensor, d0: int, temperature: float = 0.1) -> torch.Tensor:
    """DirectCLR (Jing et al., 2022): InfoNCE on the first `d0` dimensions of the representations themselves (no
    projector), as the authors' code computes it: each view's subvectors (L2-normalised here) against the other view's
    of the whole global batch, the positive its own sample's, cosine similarities over `temperature`; the mean of both
    directions. That is CLIP's loss at the fixed scale 1 / temperature: `clip_loss`'s local anchors against gathered
    candidates, with its reduce-scatter backward.
    """
    check_pair(r1, r2, "r1", "r2")
    if not 1 <= d0 <= r1.shape[1]:
        raise ValueError(f"d0 must be in [1, {r1.shape[1]}] (the representation's width), got {d0}")
    check_positive(temperature, "temperature")
    with torch.autocast(r1.device.type, enabled=False):
        u1 = F.normalize(full_precision(r1[:, :d0]), dim=1)
        u2 = F.normalize(full_precision(r2[:, :d0]), dim=1)
        return clip_loss(u1, u2, 1 / temperature)


def nnclr_loss(anchors: torch.Tensor, p: torch.Tensor, temperature: float) -> torch.Tensor:
    """NNCLR (Dwibedi et al., 2021): InfoNCE of each sample's anchor (its support-set neighbour,
    solo.methods.memory_banks.GlobalQueue.nearest, which has no gradient; All4One's attended embedding, which has) against
    the predictions `p` of the whole global batch, its positive being its own sample's; averaged over the global
    batch. Both are L2-normalised here."""
    check_pair(anchors, p, "anchors", "p")
    check_positive(temperature, "temperature")
    with torch.autocast(p.device.type, enabled=False):
        anchors = F.normalize(full_precision(anchors), dim=1)
        p = F.normalize(full_precision(p), dim=1)
        sizes, rows = _global_rows(p.shape[0], p.device)
        logits = anchors @ gather(p, sizes).T / temperature
        return F.cross_entropy(logits, rows, reduction="sum") * (world_size() / sum(sizes))


def supcon_loss(z1: torch.Tensor, z2: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al., 2020; their L_out) over the 2N views of the global batch: for
    each view, the mean over its positives (every other view of the same label, its own other view included) of
    -log softmax, the softmax over all other views; averaged over the 2N views. Cosine similarities (features
    normalised here) divided by `temperature`."""
    check_pair(z1, z2, "z1", "z2")
    check_positive(temperature, "temperature")
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = F.normalize(full_precision(z1), dim=1), F.normalize(full_precision(z2), dim=1)
        sizes, rows = _global_rows(z1.shape[0], z1.device)
        total = sum(sizes)
        candidates = torch.cat([gather(z1, sizes), gather(z2, sizes)])
        all_labels = gather(labels, sizes).repeat(2)
        is_self = _is_column(torch.cat([rows, rows + total]), 2 * total)
        logits = (torch.cat([z1, z2]) @ candidates.T / temperature).masked_fill(is_self, float("-inf"))
        log_prob = logits - logits.logsumexp(dim=1, keepdim=True)
        positive = (labels.repeat(2)[:, None] == all_labels[None, :]) & ~is_self
        per_view = -log_prob.masked_fill(~positive, 0.0).sum(dim=1) / positive.sum(dim=1)
        return per_view.sum() * (world_size() / (2 * total))


def align_uniform_loss(
    z1: torch.Tensor, z2: torch.Tensor, alpha: float = 2.0, t: float = 2.0, lambd: float = 1.0
) -> torch.Tensor:
    """Alignment and uniformity (Wang and Isola, 2020) over the global batch of N pairs, u1, u2 the L2-normalised
    views (normalised here):

        L = (1/N) sum_i ||u1_i - u2_i||^alpha + lambd * (U(u1) + U(u2)) / 2,
        U(u) = log( 1 / (N (N - 1)) sum over i != j of exp(-t ||u_i - u_j||^2) ),

    each view's uniformity over every pair of the GLOBAL batch (the authors' code: the mean over torch.pdist's pairs).
    This rank's rows are scored against the view gathered from all ranks (a reduce-scatter backward); the two views'
    sums go through one differentiable all-reduce and over the global count, so U is whole on every rank (ranks may
    hold different numbers of rows, or none). The alignment is returned as W/N times this rank's sum: both sum over
    ranks to W times their value, as solo's losses do.
    """
    check_pair(z1, z2, "z1", "z2")
    for value, name in ((alpha, "alpha"), (t, "t")):
        check_positive(value, name)
    check_non_negative(lambd, "lambd")
    with torch.autocast(z1.device.type, enabled=False):
        u1 = F.normalize(full_precision(z1), dim=1)
        u2 = F.normalize(full_precision(z2), dim=1)
        sizes, rows = _global_rows(u1.shape[0], u1.device)
        total = sum(sizes)
        if total < 2:
            raise ValueError(f"align_uniform_loss needs a global batch of at least 2 samples (its pairs), got {total}")
        is_self = _is_column(rows, total)
        candidates = gather(torch.cat([u1, u2], dim=1), sizes).split(u1.shape[1], dim=1)  # both views, one gather
        # ||u_i - u_j||^2 = 2 - 2 <u_i, u_j> on the sphere; a sample's pair with itself is left out.
        sums = [torch.exp(-t * (2 - 2 * u @ c.T)).masked_fill(is_self, 0.0).sum() for u, c in zip((u1, u2), candidates)]
        uniformity = torch.log(all_reduce(torch.stack(sums)) / (total * (total - 1))).mean()
        alignment = torch.linalg.vector_norm(u1 - u2, dim=1).pow(alpha).sum() * (world_size() / total)
        return alignment + lambd * uniformity


# Cases for the gradient checker (python -m solo.losses.check): the losses at fixed settings.


@LOSSES.register("nt_xent")
def nt_xent_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return nt_xent_loss(z1, z2, temperature=0.3)


@LOSSES.register("dcl")
def dcl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return dcl_loss(z1, z2, temperature=0.1)


@LOSSES.register("dclw")
def dclw_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return dcl_loss(z1, z2, temperature=0.1, sigma=0.5)


@LOSSES.register("macl")
def macl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return macl_loss(z1, z2, temperature=0.1, alpha=0.5, a0=0.2)


@LOSSES.register("directclr")  # the first 3 of the checker's 4 features
def directclr_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return directclr_loss(z1, z2, d0=3, temperature=0.1)


@LOSSES.register("align_uniform")
def align_uniform_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return align_uniform_loss(z1, z2, alpha=2.0, t=2.0, lambd=1.0)


@LOSSES.register("clip", learnable={"logit_scale": 1 / 0.07})  # the temperature is learnt, as in CLIP
def clip_check(z1: torch.Tensor, z2: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale)


@LOSSES.register("nnclr")
def nnclr_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each tower's output stands for the other's anchors.
    return (nnclr_loss(z1, z2, 0.2) + nnclr_loss(z2, z1, 0.2)) / 2


@LOSSES.register("supcon")
def supcon_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # The checker's batches have no labels: two classes by the sign of the first input feature's projection.
    return supcon_loss(z1, z2, (z1.detach()[:, 0] > 0).long(), 0.3)


# The tiled paths at a tile of 3: with the checker's 2..6 samples per rank, N is rarely a multiple of 3,
# so the last tile is short, and a rank's anchors' excluded columns fall in different tiles.


@LOSSES.register("nt_xent_tiled")
def nt_xent_tiled_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return nt_xent_loss(z1, z2, temperature=0.3, tile=3)


@LOSSES.register("clip_tiled", learnable={"logit_scale": 1 / 0.07})
def clip_tiled_check(z1: torch.Tensor, z2: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), logit_scale, tile=3)
