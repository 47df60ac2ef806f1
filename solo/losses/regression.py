"""Losses against a target branch's outputs: BYOL's and SimSiam's regression, MoCo's InfoNCE and CO2's consistency,
PIRL's memory bank, ReSSL's relations, NEPA's next embeddings, RASA's patch positions.

The teacher's side (`z`, `k`) is detached here: it is a target, not a path for gradients. Both are
per-sample losses, so each rank returns W/N times the sum of its samples' losses (N the global batch,
ranks may hold different numbers of samples): the sum over ranks is W * L, which DDP's gradient mean
turns into exactly grad L (see solo.distributed.collectives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.distributed import batch_sizes, gather, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_pair, check_positive
from solo.losses.checked import LOSSES
from solo.losses.contrastive import _global_rows

__all__ = [
    "byol_loss",
    "co2_batch_loss",
    "co2_loss",
    "fastsiam_loss",
    "memory_bank_loss",
    "moco_queue_loss",
    "mocov3_loss",
    "next_embedding_loss",
    "position_loss",
    "ressl_loss",
    "simsiam_loss",
]


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


def simsiam_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam (Chen and He, 2021): mean over the global batch of -cos(p_i, z_i), `z` detached (the stop-gradient).

    The same objective as BYOL's up to an affine map, -cos = (2 - 2 cos) / 2 - 1, so it is written through
    byol_loss; each rank's share still sums over ranks to W times the global value."""
    return byol_loss(p, z) / 2 - 1


def fastsiam_loss(predictions: list[torch.Tensor], projections: list[torch.Tensor]) -> torch.Tensor:
    """FastSiam (Pototzky et al., 2022): SimSiam over V >= 2 views whose target is the mean of the other views'
    projections: the mean over views i and over the global batch of -cos(p_i, mean over j != i of z_j), the targets
    detached. Averaging V - 1 views steadies the target (the paper's point); at V = 2 it is SimSiam's loss.

    Each sample's target comes from its own views only: a per-sample loss, W/N times this rank's sum as simsiam_loss.
    """
    if len(predictions) < 2 or len(predictions) != len(projections):
        raise ValueError(
            f"fastsiam_loss needs as many predictions as projections, 2 or more, got {len(predictions)} and "
            f"{len(projections)}"
        )
    with torch.no_grad():
        total = torch.stack([full_precision(z) for z in projections]).sum(dim=0)
    views = len(projections)
    targets = [(total - full_precision(z.detach())) / (views - 1) for z in projections]
    return sum(simsiam_loss(p, t) for p, t in zip(predictions, targets)) / views


def _unit_queries_and_keys(q: torch.Tensor, k: torch.Tensor, temperature: float | torch.Tensor):
    """q and k L2-normalised in full precision (k detached: the teacher's), and the temperature in full precision."""
    t = full_precision(temperature) if isinstance(temperature, torch.Tensor) else temperature
    return F.normalize(full_precision(q), dim=1), F.normalize(full_precision(k.detach()), dim=1), t


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
        q, k, t = _unit_queries_and_keys(q, k, temperature)
        sizes, rows = _global_rows(q.shape[0], q.device)
        logits = q @ gather(k, sizes).T / t
        loss_sum = F.cross_entropy(logits, rows, reduction="sum")
        return loss_sum * (world_size() / sum(sizes)) * (2 * t)


def moco_queue_loss(
    q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, valid: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """MoCo v2 (Chen, Fan, Girshick and He, 2020): InfoNCE of each query against its own key (the positive) and the
    `valid` rows of `queue` (the negatives: earlier steps' keys, identical on every rank, see
    solo.methods.memory_banks.GlobalQueue), averaged over the global batch. q and k are L2-normalised here, k detached;
    the queue's rows are taken as they are (normalised when pushed)."""
    check_pair(q, k, "q", "k")
    check_positive(temperature, "temperature")
    with torch.autocast(q.device.type, enabled=False):
        q, k, t = _unit_queries_and_keys(q, k, temperature)
        negatives = (q @ full_precision(queue.detach()).T).masked_fill(~valid, float("-inf"))
        logits = torch.cat([torch.linalg.vecdot(q, k)[:, None], negatives], dim=1) / t
        loss_sum = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device), reduction="sum")
        return loss_sum * (world_size() / sum(batch_sizes(q.shape[0], q.device)))


def co2_loss(
    q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, valid: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """CO2 (Wei, Wang, Shen and Yuille, 2021): the symmetric Kullback-Leibler divergence, halved, between the query's
    and its positive key's similarity distributions over [the positive, the `valid` rows of `queue`] at `temperature`
    (softmaxes of [q.k, q.n_j] and [k.q, k.n_j]), averaged over the global batch: the key's similarities to the
    negatives are a soft label for the query's. q and k are L2-normalised here, k detached (the teacher's); the queue's
    rows are taken as they are; `valid` (Q,) holds for every query, (B, Q) row by row. A per-sample term: W/N times
    this rank's sum, as moco_queue_loss."""
    check_pair(q, k, "q", "k")
    check_positive(temperature, "temperature")
    with torch.autocast(q.device.type, enabled=False):
        q, k, t = _unit_queries_and_keys(q, k, temperature)
        queue = full_precision(queue.detach())
        positive = torch.linalg.vecdot(q, k)[:, None]
        columns = torch.cat([valid.new_ones(*valid.shape[:-1], 1), valid], dim=-1)
        log_p = F.log_softmax(torch.cat([positive, q @ queue.T], dim=1).masked_fill(~columns, float("-inf")) / t, 1)
        log_r = F.log_softmax(torch.cat([positive, k @ queue.T], dim=1).masked_fill(~columns, float("-inf")) / t, 1)
        # KL(p||r) + KL(r||p) = sum (p - r)(log p - log r); the rows not yet filled count 0 (and pass no NaN back).
        terms = (log_p.exp() - log_r.exp()) * torch.where(columns, log_p - log_r, 0.0)
        return terms.sum() / 2 * (world_size() / sum(batch_sizes(q.shape[0], q.device)))


def co2_batch_loss(q: torch.Tensor, k: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """CO2's consistency term for a method without a queue (SimCLR, MoCo v3): co2_loss with the other samples' keys of
    the whole global batch as the negatives (gathered, detached: each sample's own key is its positive, not one of
    them). Keys from one rank's batch only would make the soft labels, hence the term, depend on the number of GPUs."""
    check_pair(q, k, "q", "k")
    with torch.autocast(q.device.type, enabled=False):
        sizes, rows = _global_rows(q.shape[0], q.device)
        keys = gather(F.normalize(full_precision(k.detach()), dim=1), sizes)
        others = torch.ones(q.shape[0], keys.shape[0], dtype=torch.bool, device=q.device)
        others[torch.arange(q.shape[0], device=q.device), rows] = False
        return co2_loss(q, k, keys, others, temperature)


def next_embedding_loss(outputs: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """NEPA (Xu et al., 2025): each position's output predicts the input embedding of the next position in raster
    order (a target: detached), scored by their negative cosine similarity, averaged over each image's L - 1
    predictions and then over the global batch. `outputs`, `embeddings`: (B, L, D); row i of `outputs` predicts row
    i + 1 of `embeddings` (the last output predicts nothing, the first embedding is no target), the authors'
    `prediction_loss`. Every image makes L - 1 predictions, so this is the mean over every prediction of the global
    batch too: W/B_global times this rank's sum of image means."""
    if outputs.dim() != 3 or outputs.shape != embeddings.shape:
        raise ValueError(
            f"outputs and embeddings must be (batch, positions, width) alike: {outputs.shape}, {embeddings.shape}"
        )
    with torch.autocast(outputs.device.type, enabled=False):
        predicted = F.normalize(full_precision(outputs[:, :-1]), dim=-1)
        target = F.normalize(full_precision(embeddings[:, 1:].detach()), dim=-1)
        per_image = -torch.linalg.vecdot(predicted, target).mean(dim=1)
        return per_image.sum() * (world_size() / sum(batch_sizes(outputs.shape[0], outputs.device)))


def position_loss(predicted: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RASA (Franca, Venkataramanan et al., 2025): the squared error of each patch's predicted position (B, N, 2) to
    its place in the grid (N, 2), averaged over the two coordinates, the N patches and the global batch (the official
    code's mse_loss over one rank's batch). Every image has N patches, so W/B_global times this rank's sum of image
    means."""
    if predicted.dim() != 3 or predicted.shape[1:] != positions.shape:
        raise ValueError(f"predicted must be (batch, *positions.shape): {predicted.shape}, {positions.shape}")
    with torch.autocast(predicted.device.type, enabled=False):
        per_image = (full_precision(predicted) - positions).pow(2).mean(dim=(1, 2))
        return per_image.sum() * (world_size() / sum(batch_sizes(predicted.shape[0], predicted.device)))


def memory_bank_loss(
    z: torch.Tensor, bank: torch.Tensor, index: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """PIRL (Misra and van der Maaten, 2020) and NPID (Wu et al., 2018): InfoNCE of each row of `z` against every
    entry of a memory bank of the training samples (`bank`, (N, d) unit rows, identical on every rank), its positive
    being its own sample's entry (`index`, the rows' dataset indices), averaged over the global batch. z is
    L2-normalised here; the bank is a target (detached). A per-sample loss: W/N times this rank's sum."""
    check_positive(temperature, "temperature")
    with torch.autocast(z.device.type, enabled=False):
        z = F.normalize(full_precision(z), dim=1)
        logits = z @ full_precision(bank.detach()).T / temperature
        loss_sum = F.cross_entropy(logits, index, reduction="sum")
        return loss_sum * (world_size() / sum(batch_sizes(z.shape[0], z.device)))


def ressl_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    valid: torch.Tensor,
    temperature_q: float,
    temperature_k: float,
) -> torch.Tensor:
    """ReSSL (Zheng et al., 2021): the cross-entropy from the teacher's relation to the queue (softmax of k's
    similarities to the `valid` rows of `queue` at `temperature_k`, a target) to the student's (q's at
    `temperature_q`), averaged over the global batch. q and k are L2-normalised here, k detached; the queue's rows
    (earlier steps' keys, the same on every rank: solo.methods.memory_banks.GlobalQueue) are taken as they are. Before
    any row was pushed every similarity counts as 0: the loss is log(size), with no gradient."""
    check_pair(q, k, "q", "k")
    check_positive(temperature_q, "temperature_q")
    check_positive(temperature_k, "temperature_k")
    with torch.autocast(q.device.type, enabled=False):
        q, k, _ = _unit_queries_and_keys(q, k, 1.0)
        queue = full_precision(queue.detach())
        usable = valid | ~valid.any()  # every row when none is valid, with similarities 0 below
        student = torch.where(valid, q @ queue.T, 0.0).masked_fill(~usable, float("-inf")) / temperature_q
        teacher = torch.where(valid, k @ queue.T, 0.0).masked_fill(~usable, float("-inf")) / temperature_k
        terms = F.softmax(teacher, dim=1) * F.log_softmax(student, dim=1)
        loss_sum = -torch.where(usable, terms, 0.0).sum()
        return loss_sum * (world_size() / sum(batch_sizes(q.shape[0], q.device)))


# Cases for the gradient checker (python -m solo.losses.check): symmetrised, as the methods use them.


@LOSSES.register("byol")
def byol_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return byol_loss(z1, z2) + byol_loss(z2, z1)


@LOSSES.register("mocov3")
def mocov3_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return mocov3_loss(z1, z2, 0.5) + mocov3_loss(z2, z1, 0.5)


@LOSSES.register("mocov2plus")
def mocov2plus_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    queue, valid = _checker_queue(z1)
    return moco_queue_loss(z1, z2, queue, valid, 0.2) + moco_queue_loss(z2, z1, queue, valid, 0.2)


@LOSSES.register("co2")  # MoCo v2+'s option: the queue's negatives as the consistency's unlabelled entries
def co2_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    queue, valid = _checker_queue(z1)
    return co2_loss(z1, z2, queue, valid, 0.1) + co2_loss(z2, z1, queue, valid, 0.1)


@LOSSES.register("pirl")  # z1 the jigsaw's embeddings, z2 the image's, against a fixed bank of 6 samples
def pirl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    bank, _ = _checker_queue(z1)
    index = checker_bank_index(z2)
    return (memory_bank_loss(z1, bank, index, 0.07) + memory_bank_loss(z2, bank, index, 0.07)) / 2


def checker_bank_index(z: torch.Tensor) -> torch.Tensor:
    """Each row's sample in the checker's bank of 6, from the row's own values: the same at any world size."""
    return (z.detach()[:, 0] * 1000).abs().long() % 6


def _checker_queue(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed queue of 6 unit rows of z's width and dtype, the last one not yet filled."""
    queue = F.normalize(torch.linspace(-1.0, 1.0, 6 * z.shape[1], dtype=z.dtype).reshape(6, -1).sin() + 0.1, dim=1)
    return queue, torch.arange(6) < 5


@LOSSES.register("simsiam")
def simsiam_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return (simsiam_loss(z1, z2) + simsiam_loss(z2, z1)) / 2


@LOSSES.register("fastsiam")  # three views: the third one's prediction and projection mix the two inputs
def fastsiam_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return fastsiam_loss([z1, z2, z1 * z2], [z2, z1 - z2, z1 + z2])


@LOSSES.register("ressl")
def ressl_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    queue, valid = _checker_queue(z1)
    return ressl_loss(z1, z2, queue, valid, 0.1, 0.04) + ressl_loss(z2, z1, queue, valid, 0.1, 0.04)


@LOSSES.register("co2_batch")  # SimCLR's and MoCo v3's option: the global batch's other keys as the negatives
def co2_batch_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return co2_batch_loss(z1, z2, 0.1) + co2_batch_loss(z2, z1, 0.1)


@LOSSES.register("nepa")
def nepa_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as 2 positions of 2 values: the first position's output against the other's second embedding.
    a, b = z1.unflatten(1, (2, -1)), z2.unflatten(1, (2, -1))  # (an empty rank's 0 rows too)
    return next_embedding_loss(a, b) + next_embedding_loss(b, a)


@LOSSES.register("rasa")
def rasa_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as 2 patches' predicted coordinates in (0, 1); z2 the sample's own targets (the grid in the method).
    predicted = torch.sigmoid(z1 - z2).unflatten(1, (-1, 2))
    grid = torch.linspace(0, 1, predicted.shape[1] * 2, dtype=z1.dtype, device=z1.device).unflatten(0, (-1, 2))
    return position_loss(predicted, grid)
