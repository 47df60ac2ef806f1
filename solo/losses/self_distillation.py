"""Cross-view prediction of soft targets: DINO (teacher softmax, centred) and SwAV (Sinkhorn codes).

Both losses average, over pairs of views (target view i, predicting view v != i), the global-batch mean
of the cross-entropy sum_k -q_i[k] log p_v[k]: a per-sample loss, so each rank returns W/N times the
sum of its samples' terms (see solo.distributed.collectives). The targets carry no gradient but are
GLOBAL statistics: DINO's centre is the mean of the teacher's outputs over the whole global batch, and
SwAV's Sinkhorn-Knopp balances the prototypes over the whole global batch. Computed per GPU, either
would make the targets, hence the loss, depend on the number of GPUs and on how the batch is split.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, rank, world_size
from solo.dtypes import full_precision
from solo.losses._checks import check_pair, check_positive, checks_values
from solo.losses.checked import LOSSES

__all__ = [
    "centred_softmax",
    "deepcluster_loss",
    "dino_center",
    "dino_cross_entropy",
    "dino_loss",
    "gram_loss",
    "ibot_patch_loss",
    "masked_center",
    "momentum_groups",
    "patch_kernel_alignment_loss",
    "sinkhorn",
    "smog_loss",
    "swav_loss",
]


def _check_views(views: list[torch.Tensor], name: str, at_least: int = 1) -> None:
    """A list of at least `at_least` finite (batch, K) tensors of one shape."""
    if not isinstance(views, (list, tuple)) or len(views) < at_least:
        got = f"a {type(views).__name__}" if not isinstance(views, (list, tuple)) else f"{len(views)}"
        raise ValueError(f"{name} must be a list of at least {at_least} (batch, K) tensors, got {got}")
    for i, view in enumerate(views):
        check_pair(views[0], view, f"{name}[0]", f"{name}[{i}]")


def _scalar(x: float | torch.Tensor) -> float | torch.Tensor:
    return full_precision(x) if isinstance(x, torch.Tensor) else x


def _cross_view_loss(targets: list[torch.Tensor], log_probs: list[torch.Tensor], n_total: int) -> torch.Tensor:
    """Average over pairs (i, v), v != i, of the global-batch mean of sum_k -targets[i] * log_probs[v];
    W times this rank's share. Every pair at once, a fixed number of operations for any number of views: the sum
    over all pairs (i, v) is (sum_i targets_i) . (sum_v log_probs_v), less the pairs v = i."""
    shared = min(len(targets), len(log_probs))
    every = (torch.stack(targets).sum(0) * torch.stack(log_probs).sum(0)).sum()
    same = (torch.stack(targets[:shared]) * torch.stack(log_probs[:shared])).sum()
    pairs = len(targets) * len(log_probs) - shared
    return (same - every) * (world_size() / (n_total * pairs))


# --- DINO ---------------------------------------------------------------------------------------------


def dino_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    center: torch.Tensor,
    student_temperature: float | torch.Tensor,
    teacher_temperature: float | torch.Tensor,
) -> torch.Tensor:
    """DINO (Caron et al., 2021): average over pairs (g, v), v != g, of the global-batch mean of
    sum_k -q_g[k] log softmax(student_v / student_temperature)[k], with q_g = softmax((teacher_g - center)
    / teacher_temperature).

    `student`: V (n, K) outputs on all crops, the G global ones first; `teacher`: the teacher's G (n, K)
    outputs on the global crops (detached here); `center`: (K,), e.g. from dino_center (detached here).
    """
    _check_views(student, "student", at_least=2)
    _check_views(teacher, "teacher")
    check_pair(student[0], teacher[0], "student[0]", "teacher[0]")
    if len(teacher) > len(student):
        raise ValueError(
            f"teacher has {len(teacher)} views but student only {len(student)}: the teacher's are its first ones"
        )
    _check_center(center, student[0].shape[1])
    check_positive(student_temperature, "student_temperature")
    check_positive(teacher_temperature, "teacher_temperature")
    with torch.autocast(student[0].device.type, enabled=False):
        targets = [centred_softmax(t, center, teacher_temperature) for t in teacher]
        return dino_cross_entropy(student, targets, student_temperature)


def centred_softmax(
    teacher: torch.Tensor, center: torch.Tensor, teacher_temperature: float | torch.Tensor
) -> torch.Tensor:
    """DINO's targets: softmax((teacher - center) / teacher_temperature) over the last dimension, detached, in full
    precision."""
    with torch.no_grad(), torch.autocast(teacher.device.type, enabled=False):
        c = full_precision(center.detach())
        return F.softmax((full_precision(teacher.detach()) - c) / _scalar(teacher_temperature), dim=-1)


def dino_cross_entropy(
    student: list[torch.Tensor], targets: list[torch.Tensor], student_temperature: float | torch.Tensor
) -> torch.Tensor:
    """DINO's loss from the teacher's targets (probabilities, e.g. DINOv2's Sinkhorn-Knopp ones) of the G global crops:
    the average over pairs (g, v), v != g, of the global-batch mean of sum_k -targets_g[k] log softmax(student_v /
    student_temperature)[k]."""
    with torch.autocast(student[0].device.type, enabled=False):
        log_probs = [F.log_softmax(full_precision(s) / _scalar(student_temperature), dim=1) for s in student]
        n_total = sum(batch_sizes(student[0].shape[0], student[0].device))
        return _cross_view_loss([full_precision(t.detach()) for t in targets], log_probs, n_total)


def ibot_patch_loss(
    student: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, student_temperature: float | torch.Tensor
) -> torch.Tensor:
    """iBOT's masked-patch loss (Zhou et al., 2022; DINOv2's weighting): for each image, the mean over its masked
    patches of sum_k -targets[k] log softmax(student / student_temperature)[k], averaged over every image of the
    GLOBAL batch (an image with no masked patch counts 0). `student`, `targets`: (n, m, K), each image's candidate
    patches; `valid`: (n, m), which of them are masked. A per-rank mean would depend on how the masked patches and
    the images fall on the ranks."""
    with torch.autocast(student.device.type, enabled=False):
        log_probs = F.log_softmax(full_precision(student) / _scalar(student_temperature), dim=-1)
        per_patch = -(full_precision(targets.detach()) * log_probs).sum(dim=-1) * valid
        per_image = per_patch.sum(dim=1) / valid.sum(dim=1).clamp_min(1)
        return per_image.sum() * (world_size() / sum(batch_sizes(student.shape[0], student.device)))


def gram_loss(student: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DINOv3's Gram anchoring (Simeoni et al., 2025): for each image, the mean squared difference between the Gram
    matrices (every pair's cosine) of its patch tokens, the student's and a frozen earlier teacher's; averaged over
    every image of the GLOBAL batch. `student`, `target`: (n, P, D). The reference's MSE over its rank's images
    would weigh an image by how many share its rank."""
    with torch.autocast(student.device.type, enabled=False):
        s = F.normalize(full_precision(student), dim=-1)
        t = F.normalize(full_precision(target.detach()), dim=-1)
        per_image = (s @ s.transpose(1, 2) - t @ t.transpose(1, 2)).square().mean(dim=(1, 2))
        return per_image.sum() * (world_size() / sum(batch_sizes(student.shape[0], student.device)))


def patch_kernel_alignment_loss(student: torch.Tensor, teacher: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PaKA (patch kernel alignment, 2025): for each image, 1 minus the centred kernel alignment (CKA) of the linear
    kernels of its patch tokens, the student's and the teacher's: <H K_s H, H K_t H>_F / (||H K_s H||_F ||H K_t H||_F)
    with K = Z Z^T and H the centring matrix; averaged over every image of the GLOBAL batch. `student`, `teacher`:
    (n, P, D), P >= 2; the teacher is detached. Each squared norm is clamped at `eps` before its root (lightly's), so a
    constant image passes no infinite gradient. lightly averages over its rank's images only."""
    with torch.autocast(student.device.type, enabled=False):

        def centred_kernel(z: torch.Tensor) -> torch.Tensor:
            z = z - z.mean(dim=1, keepdim=True)  # H Z: then (H Z)(H Z)^T = H K H
            return z @ z.transpose(1, 2)

        k_s = centred_kernel(full_precision(student))
        k_t = centred_kernel(full_precision(teacher.detach()))
        cross = (k_s * k_t).sum(dim=(1, 2))
        norms = (k_s * k_s).sum(dim=(1, 2)).clamp_min(eps).sqrt() * (k_t * k_t).sum(dim=(1, 2)).clamp_min(eps).sqrt()
        per_image = 1 - cross / norms
        return per_image.sum() * (world_size() / sum(batch_sizes(student.shape[0], student.device)))


def _check_center(center: torch.Tensor, k: int) -> None:
    if not isinstance(center, torch.Tensor) or center.shape != (k,):
        shape = tuple(center.shape) if isinstance(center, torch.Tensor) else type(center).__name__
        raise ValueError(f"center must be a ({k},) tensor, one entry per output dimension, got {shape}")
    if checks_values() and not bool(torch.isfinite(center).all()):
        raise ValueError("center has non-finite values (NaN or inf)")


def dino_center(teacher: list[torch.Tensor], center: torch.Tensor, momentum: float) -> torch.Tensor:
    """DINO's new centre: momentum * center + (1 - momentum) * the mean of the teacher's outputs over
    all its views and the GLOBAL batch (one all-reduce of the sum, divided by the global count).

    No gradient; returns a new tensor (in center's dtype) and leaves `center` as it is.
    """
    _check_views(teacher, "teacher")
    _check_center(center, teacher[0].shape[1])
    if not 0 <= float(momentum) <= 1:
        raise ValueError(f"momentum must be a number in [0, 1], got {momentum}")
    with torch.no_grad(), torch.autocast(teacher[0].device.type, enabled=False):
        local_sum = sum(full_precision(t.detach()).sum(dim=0) for t in teacher)
        count = sum(batch_sizes(teacher[0].shape[0], teacher[0].device)) * len(teacher)
        mean = all_reduce(local_sum) / count
        return (momentum * full_precision(center) + (1 - momentum) * mean).to(center.dtype)


def masked_center(scores: torch.Tensor, valid: torch.Tensor, center: torch.Tensor, momentum: float) -> torch.Tensor:
    """iBOT's new patch centre: as dino_center over the rows of `scores` (n, K) where `valid` (n,) is true, their mean
    over the GLOBAL batch; the centre stays as it is when no rank has such a row. A new tensor, no gradient."""
    _check_center(center, scores.shape[1])
    with torch.no_grad(), torch.autocast(scores.device.type, enabled=False):
        rows = valid.to(torch.float64)
        totals = all_reduce(torch.cat([(full_precision(scores.detach()) * rows[:, None]).sum(0), rows.sum()[None]]))
        mean = totals[:-1] / totals[-1].clamp_min(1)
        moved = momentum * full_precision(center) + (1 - momentum) * mean
        return torch.where(totals[-1] > 0, moved, full_precision(center)).to(center.dtype)


# --- SwAV ---------------------------------------------------------------------------------------------


def global_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise max of `x` over the ranks (no gradient: for shifts out of an exponent)."""
    if world_size() > 1:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def _sinkhorn(
    scores: torch.Tensor, epsilon: float, iterations: int, n_total, valid: torch.Tensor | None = None
) -> torch.Tensor:
    *groups, n, k = scores.shape  # (..., n, K): the leading dimensions are independent problems
    # Each prototype's global max out of the exponent: a per-column factor, which the first column
    # normalisation removes exactly (SwAV's first division by the total sum is redundant for the same reason).
    # A rank with no rows contributes -inf (amax of nothing would raise), so that it still joins the all-reduces.
    local_max = scores.amax(dim=-2) if n else scores.new_full((*groups, k), float("-inf"))
    q = torch.exp((scores - global_max(local_max).unsqueeze(-2)) / epsilon)
    if valid is not None:  # rows that are not samples (iBOT's unmasked patches) hold no mass
        q = q * valid[:, None]
    for _ in range(iterations):
        q = q / (all_reduce(q.sum(dim=-2, keepdim=True)) * k)  # every prototype 1/K of the mass, over the global batch
        q = q / (q.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny) * n_total)  # every sample 1/N
    return q * n_total


def sinkhorn(
    scores: torch.Tensor, epsilon: float | torch.Tensor, iterations: int, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """SwAV's codes: Sinkhorn-Knopp on exp(scores / epsilon) over the GLOBAL batch, equipartitioned.

    Alternately every prototype's column is scaled to hold 1/K of the mass (its sum over the samples of
    all ranks, all-reduced) and every sample's row to hold 1/N; `iterations` rounds. Returns this rank's
    (n, K) codes scaled so that each row sums to 1 (SwAV's Q * B), detached, in full precision. With `valid` (n,),
    only those rows are samples (N their global count, all-reduced): the others get codes of 0 (DINOv2's centring
    of the masked patches' targets). Scores of shape (G, n, K) are G problems solved apart, each over the global
    batch (CAPI's Sinkhorn-Knopp per patch position).
    """
    if scores.dim() == 3:
        check_pair(scores.flatten(0, 1), scores.flatten(0, 1), "scores", "scores")
    else:
        check_pair(scores, scores, "scores", "scores")
    check_positive(epsilon, "epsilon")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    with torch.no_grad(), torch.autocast(scores.device.type, enabled=False):
        if valid is None:
            n_total = sum(batch_sizes(scores.shape[-2], scores.device))
        else:
            n_total = all_reduce(valid.sum().to(torch.float64)).clamp_min(1)
        return _sinkhorn(full_precision(scores.detach()), _scalar(epsilon), iterations, n_total, valid)


def swav_loss(
    scores: list[torch.Tensor],
    temperature: float | torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 3,
    code_views: int = 2,
    queue: list[torch.Tensor] | None = None,
    queue_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """SwAV (Caron et al., 2020): average over pairs (i, v), i < code_views, v != i, of the global-batch
    mean of sum_k -q_i[k] log softmax(scores_v / temperature)[k], with q_i = sinkhorn(scores_i).

    `scores`: V (n, K) prototype scores, the first `code_views` (the global crops) also give codes. `queue`: for each
    code view, the (Q, K) scores of earlier steps' embeddings against the current prototypes, the same on every rank
    (solo.methods.memory_banks.GlobalQueue), the rows where `queue_valid` (Q,) is true joining that view's
    Sinkhorn-Knopp as SwAV's queue does: its equipartition then spans Q + N rows, of which the batch's N take their
    codes. The queue's rows are counted once, by rank 0: on every rank they would weigh W times.
    """
    _check_views(scores, "scores", at_least=2)
    check_positive(temperature, "temperature")
    check_positive(epsilon, "epsilon")
    if isinstance(code_views, bool) or not isinstance(code_views, int) or not 1 <= code_views <= len(scores):
        raise ValueError(f"code_views must be an int in [1, {len(scores)}] (the number of views), got {code_views!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    if (queue is None) != (queue_valid is None) or (queue is not None and len(queue) != code_views):
        raise ValueError(
            f"queue and queue_valid go together, queue with one (Q, K) tensor per code view ({code_views})"
        )
    with torch.autocast(scores[0].device.type, enabled=False):
        scores = [full_precision(s) for s in scores]
        n_total = sum(batch_sizes(scores[0].shape[0], scores[0].device))
        with torch.no_grad():
            if queue is None:
                targets = [_sinkhorn(s.detach(), epsilon, iterations, n_total) for s in scores[:code_views]]
            else:
                counted = torch.cat([queue_valid & (rank() == 0), queue_valid.new_ones(len(scores[0]))])
                rows = n_total + queue_valid.sum().to(torch.float64)
                targets = [
                    _sinkhorn(torch.cat([full_precision(q.detach()), s.detach()]), epsilon, iterations, rows, counted)[
                        len(q) :
                    ]
                    for q, s in zip(queue, scores)
                ]
        log_probs = [F.log_softmax(s / _scalar(temperature), dim=1) for s in scores]
        return _cross_view_loss(targets, log_probs, n_total)


# --- SMoG ---------------------------------------------------------------------------------------------


@torch.no_grad()
def momentum_groups(groups: torch.Tensor, rows: torch.Tensor, beta: float) -> torch.Tensor:
    """SMoG's synchronous momentum grouping (Pang et al., 2022): each of the (K, d) `groups` that some row of `rows`
    chooses (the highest cosine similarity) in the GLOBAL batch moves to beta * group + (1 - beta) * the mean of the
    rows that chose it; the others stay. The per-group sums and counts are all-reduced (device tensors, no host read),
    so every rank returns what one process on the whole batch would; updated from each rank's own rows, the groups
    would differ at every world size. No gradient: the groups are state, not a path into the encoder."""
    dtype = groups.dtype
    groups, rows = full_precision(groups), full_precision(rows.detach())
    chosen = (F.normalize(rows, dim=1) @ F.normalize(groups, dim=1).T).argmax(dim=1)
    sums = all_reduce(torch.zeros_like(groups).index_add_(0, chosen, rows))
    # Counted by index_add, not bincount: bincount's length depends on the values, a host read.
    ones = torch.ones_like(chosen, dtype=groups.dtype)
    counts = all_reduce(torch.zeros(len(groups), dtype=groups.dtype, device=groups.device).index_add_(0, chosen, ones))
    counts = counts[:, None]
    moved = beta * groups + (1 - beta) * sums / counts.clamp_min(1)
    return torch.where(counts > 0, moved, groups).to(dtype)


def smog_loss(
    predictions: torch.Tensor, groups: torch.Tensor, assignments: torch.Tensor, temperature: float
) -> torch.Tensor:
    """SMoG's group-level contrast: the global-batch mean of the cross-entropy of the cosine similarities between each
    row of `predictions` (n, d) and the `groups` (K, d, no gradient), divided by `temperature`, against the row's
    group in `assignments` (n,: the other view's teacher embedding's nearest group). W / N times this rank's sum."""
    check_positive(temperature, "temperature")
    with torch.autocast(predictions.device.type, enabled=False):
        logits = F.normalize(full_precision(predictions), dim=1) @ F.normalize(full_precision(groups.detach()), dim=1).T
        total = F.cross_entropy(logits / temperature, assignments, reduction="sum")
        return total * (world_size() / sum(batch_sizes(len(predictions), predictions.device)))


# Cases for the gradient checker (python -m solo.losses.check).

CHECK_CENTER = (0.3, -0.2, 0.1, 0.5)  # a non-zero start, so that the checked centre update matters


def deepcluster_loss(scores: list[torch.Tensor], assignments: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """DeepClusterV2 (Caron et al., 2020), as SwAV's main_deepclusterv2.py computes it: for each clustering h, the mean
    over the rows that have a cluster (`assignments[h]`, -1: none yet) of the cross-entropy of `scores[h]` (the rows'
    similarities to its centroids) divided by `temperature` against their cluster; then the average over the
    clusterings. The mean is over the assigned rows of the GLOBAL batch: each clustering's count is all-reduced (a
    device tensor, no host read) and each rank returns W / count times its sum. A clustering without an assigned row
    in the global batch contributes 0 and no gradient (the references' mean over no row is NaN)."""
    check_positive(temperature, "temperature")
    with torch.autocast(scores[0].device.type, enabled=False):
        sums = torch.stack(
            [
                F.cross_entropy(full_precision(s) / temperature, a, ignore_index=-1, reduction="sum")
                for s, a in zip(scores, assignments)
            ]
        )
        assigned = all_reduce(torch.stack([(a != -1).sum() for a in assignments]).to(torch.float64)).clamp_min(1)
        return (sums / assigned.to(sums.dtype)).sum() * (world_size() / len(scores))


def checker_groups(like: torch.Tensor) -> torch.Tensor:
    """SMoG's checker case's groups: 5 fixed rows of `like`'s width and dtype."""
    return torch.linspace(-1.0, 1.0, 5 * like.shape[1], dtype=like.dtype).reshape(5, -1).mul(7).sin()


@LOSSES.register("smog")
def smog_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each tower's rows assigned to the fixed groups' nearest; the groups moved by both towers' rows (global), then
    # each tower predicts the other's groups.
    groups = checker_groups(z1)
    assigned = [(F.normalize(z.detach(), dim=1) @ F.normalize(groups, dim=1).T).argmax(dim=1) for z in (z1, z2)]
    moved = momentum_groups(groups, torch.cat([z1, z2]), beta=0.5)
    return smog_loss(z1, moved, assigned[1], 0.1) + smog_loss(z2, moved, assigned[0], 0.1)


@LOSSES.register("dino")
def dino_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    teacher = [z1.detach(), z2.detach()]
    center = dino_center(teacher, torch.tensor(CHECK_CENTER, dtype=z1.dtype), momentum=0.9)
    return dino_loss([z1, z2], teacher, center, student_temperature=0.1, teacher_temperature=0.04)


@LOSSES.register("franca")
def franca_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Franca's nested levels: each tower's first half of its scores and all of them as two levels' prototypes, each
    # level's targets the other tower's Sinkhorn-Knopp codes over the global batch; the levels' DINO losses summed.
    levels = ((z1[:, :width], z2[:, :width]) for width in (z1.shape[1] // 2, z1.shape[1]))
    return sum(dino_cross_entropy([a, b], [sinkhorn(a, 0.5, 3), sinkhorn(b, 0.5, 3)], 0.1) for a, b in levels)


@LOSSES.register("ibot")
def ibot_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as 2 patches of 2 prototype scores, a patch masked by a pseudo-random function of its score (so images
    # hold 0, 1 or 2 masked patches); targets: Sinkhorn-Knopp over the masked patches of the global batch, each tower
    # the other's teacher.
    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    mask = torch.sin(100 * a[..., 0].detach()) > 0

    def targets(teacher):
        return sinkhorn(teacher.reshape(-1, 2), 0.5, 3, valid=mask.reshape(-1)).reshape(teacher.shape)

    return ibot_patch_loss(a, targets(b), mask, 0.1) + ibot_patch_loss(b, targets(a), mask, 0.1)


@LOSSES.register("gram")
def gram_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as patches of 2 dimensions; each tower anchored to the other's (frozen) Gram matrices.
    a, b = z1.unflatten(1, (-1, 2)), z2.unflatten(1, (-1, 2))
    return gram_loss(a, b) + gram_loss(b, a)


@LOSSES.register("paka")
def paka_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Each row as 4 patches of 1 dimension (2 patches' centred kernels always align), each tower aligned to the
    # other's (detached) kernels.
    a, b = z1.unflatten(1, (-1, 1)), z2.unflatten(1, (-1, 1))
    return patch_kernel_alignment_loss(a, b) + patch_kernel_alignment_loss(b, a)


@LOSSES.register("swav")
def swav_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    return swav_loss([F.normalize(z1, dim=1), F.normalize(z2, dim=1)], temperature=0.1)


def checker_queue_scores(like: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A fixed queue for the checker's SwAV case: two views' 6 rows of unit scores of `like`'s width and dtype, the
    last one not yet filled."""
    rows = torch.linspace(-1.0, 1.0, 6 * like.shape[1], dtype=like.dtype).reshape(6, -1)
    return [F.normalize(rows.sin() + 0.1, dim=1), F.normalize(rows.cos() - 0.2, dim=1)], torch.arange(6) < 5


@LOSSES.register("swav_queue")
def swav_queue_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    queue, valid = checker_queue_scores(z1)
    return swav_loss([F.normalize(z1, dim=1), F.normalize(z2, dim=1)], 0.1, 0.5, 3, 2, queue, valid)


@LOSSES.register("deepclusterv2")
def deepclusterv2_check(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    # Two clusterings: each tower's rows scored against the other tower's argmax, about 30% of the rows unassigned (-1)
    # by a pseudo-random function of the other tower's row, so a rank may hold none, some or all of them.
    def clusters(other: torch.Tensor) -> torch.Tensor:
        other = other.detach()
        return other.argmax(dim=1).masked_fill(torch.sin(100 * other[:, 0]) > 0.59, -1)

    return deepcluster_loss([z1, z2], [clusters(z2), clusters(z1)], 0.1)
