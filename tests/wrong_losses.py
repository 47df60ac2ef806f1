"""The popular ways of distributing contrastive losses that give wrong gradients.

Used to show that the gradient checker rejects them: a check that cannot fail proves nothing. Then the
wrong variants of the self-supervised losses (VICReg, SigLIP, DINO, SwAV, MoCo v3, BYOL, SupCon, NNCLR, W-MSE,
VIbCReg, I-JEPA, data2vec 2.0, SimMIM, AIM, DINOv3's Gram anchoring, PaKA, DeepClusterV2, LeJEPA, DCL, MMCR, TiCo, DirectCLR,
alignment-uniformity, EMP-SSL, FroSSL, SSL-EY, CAPI, MSN, PMSN, VICRegL, DetCon, FastSiam, MACL, VISReg, SwAV's queue, PIRL, CO2, VCReg, SMoG, Franca) that popular implementations ship
(WRONG_SSL). At the end, two losses for the checker's error paths: one that raises
on one rank, one that ignores its scalar.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from solo.distributed import all_reduce, batch_sizes, gather, rank, world_size
from solo.losses import (
    LOSSES,
    co2_loss,
    dcl_loss,
    dino_loss,
    lejepa_loss,
    nt_xent_loss,
    random_directions,
    smog_loss,
    vicregl_loss,
    whiten,
)
from solo.losses.barlow_twins import _standardise
from solo.losses.dse import _kmeans as dse_kmeans
from solo.losses.msn import CHECK_PROTOTYPES, power_law_prior, prototype_logits
from solo.losses.regression import _checker_queue, checker_bank_index
from solo.losses.self_distillation import _sinkhorn, checker_groups, checker_queue_scores, sinkhorn
from solo.losses.tico import earlier_covariance
from solo.losses.uniforms import seeded_uniforms
from tests.checker_user_losses import siglip_terms


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


# --- learnable scalars: the forward and the encoders' gradients are right, only the bias's gradient is wrong ---


@LOSSES.register("wrong_siglip_bias_from_local_pairs", learnable={"logit_scale": 10.0, "bias": -10.0})
def siglip_bias_from_local_pairs(z1, z2, logit_scale, bias):
    """The bias learns from the pairs within this rank's batch only (against the other ranks' texts it
    is detached): its gradient misses the cross-rank pairs."""
    sizes = batch_sizes(z1.shape[0])
    offset = sum(sizes[: rank()])
    columns = torch.arange(sum(sizes))
    own_texts = (columns >= offset) & (columns < offset + z1.shape[0])
    bias_per_pair = torch.where(own_texts.expand(z1.shape[0], -1), bias, bias.detach())
    terms, total = siglip_terms(z1, z2, logit_scale, bias_per_pair)
    return terms.sum() * (world_size() / total)


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


@LOSSES.register("wrong_siglip_bias_gradient_summed", learnable={"logit_scale": 10.0, "bias": -10.0})
def siglip_bias_gradient_summed(z1, z2, logit_scale, bias):
    """The bias's gradient summed over ranks instead of averaged (as when one all-reduces a scalar's
    gradient by hand on top of DDP): W times the true one."""
    terms, total = siglip_terms(z1, z2, logit_scale, _ScaleGradient.apply(bias, world_size()))
    return terms.sum() * (world_size() / total)


# --- self-supervised losses: statistics per GPU, negatives per GPU, or a mean of the ranks' means ---


def _vicreg_terms(z1, z2, cov1, cov2):
    """VICReg (25, 25, 1) from given statistics, the invariance as this rank's mean (right for equal batches)."""
    loss = 25.0 * F.mse_loss(z1, z2)
    for cov in (cov1, cov2):
        var = torch.diagonal(cov)
        loss = loss + 25.0 * F.relu(1 - torch.sqrt(var + 1e-4)).mean() / 2
        loss = loss + (cov - torch.diag(var)).pow(2).sum() / cov.shape[0]
    return loss


def vicreg_per_gpu_statistics(z1, z2):
    """VICReg on this rank's batch alone, as most implementations compute it: per-GPU variance and covariance."""
    covs = [torch.cov(z.T) for z in (z1, z2)]  # unbiased, over the local batch
    return _vicreg_terms(z1, z2, *covs)


def _summed_without_gradient(x):
    """The sum over ranks by dist.all_reduce, which autograd cannot see: the gradient of the local term only."""
    summed = x.detach().clone()
    if world_size() > 1:
        dist.all_reduce(summed)
    return x + (summed - x.detach())


def vicreg_plain_all_reduce(z1, z2):
    """Global statistics through a plain dist.all_reduce: the forward is right, the gradient is not."""
    n = sum(batch_sizes(z1.shape[0]))
    covs = []
    for z in (z1, z2):
        centred = z - _summed_without_gradient(z.sum(dim=0)) / n
        covs.append(_summed_without_gradient(centred.T @ centred) / (n - 1))
    return _vicreg_terms(z1, z2, *covs)


@LOSSES.register("wrong_siglip_local_negatives", learnable={"logit_scale": 10.0, "bias": -10.0})
def siglip_local_negatives(z1, z2, logit_scale, bias):
    """SigLIP with this rank's texts only as negatives (n_local x n_local pairs), divided by n_local."""
    image, text = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    logits = logit_scale * image @ text.T + bias
    labels = 2 * torch.eye(image.shape[0], dtype=logits.dtype) - 1
    return -F.logsigmoid(labels * logits).sum() / image.shape[0]


def dino_per_gpu_centre(z1, z2):
    """DINO with the centre updated from this rank's teacher outputs alone (no all-reduce of the sum)."""
    teacher = [z1.detach(), z2.detach()]
    local_mean = torch.cat(teacher).mean(dim=0)
    center = 0.9 * torch.tensor([0.3, -0.2, 0.1, 0.5], dtype=z1.dtype) + 0.1 * local_mean  # as solo's dino case
    return dino_loss([z1, z2], teacher, center, student_temperature=0.1, teacher_temperature=0.04)


def rank_sinkhorn(scores, epsilon=0.05, iterations=3):
    """Sinkhorn-Knopp on the scores (n, K) one process holds, as SwAV's and Franca's code compute it: exp(scores /
    epsilon), scaled to total 1, then alternately every prototype's column to 1/K and every row to 1/n; rows summing
    to 1. No gradient."""
    q = torch.exp(scores.detach() / epsilon).T  # (K, n): SwAV's layout, with this rank's n as the batch
    q = q / q.sum()
    k, n = q.shape
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / n
    return (q * n).T


def swav_per_gpu_sinkhorn(z1, z2):
    """SwAV whose codes are balanced over this rank's samples only: the codes depend on the split."""
    views = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]
    total = sum(batch_sizes(z1.shape[0]))
    loss = 0.0
    for i, j in ((0, 1), (1, 0)):
        loss = loss - (rank_sinkhorn(views[i]) * F.log_softmax(views[j] / 0.1, dim=1)).sum()
    return loss * world_size() / (2 * total)


def swav_sinkhorn_local_batch_times_world(z1, z2):
    """SwAV's (and DINOv2's) Sinkhorn-Knopp with every sum all-reduced but the number of samples taken as
    B_local x W, as DINOv2's code does: right only when every rank holds as many samples."""
    from solo.losses import self_distillation

    views = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]
    with torch.no_grad():
        codes = [self_distillation._sinkhorn(v.detach(), 0.05, 3, len(v) * world_size()) for v in views]
    return self_distillation._cross_view_loss(
        codes, [F.log_softmax(v / 0.1, dim=1) for v in views], sum(batch_sizes(z1.shape[0]))
    )


def franca_sinkhorn_local_batch_times_world(z1, z2):
    """Franca's nested levels with each level's Sinkhorn-Knopp taking the number of samples as B_local x W, as its
    MRLDINOLoss.sinkhorn_knopp_teacher does: right only when every rank holds as many samples."""
    from solo.losses import dino_cross_entropy, self_distillation

    def codes(scores):
        with torch.no_grad():
            return self_distillation._sinkhorn(scores.detach(), 0.5, 3, len(scores) * world_size())

    levels = ((z1[:, :width], z2[:, :width]) for width in (z1.shape[1] // 2, z1.shape[1]))
    return sum(dino_cross_entropy([a, b], [codes(a), codes(b)], 0.1) for a, b in levels)


def koleo_per_rank_neighbours(z1, z2):
    """KoLeo with each embedding's nearest neighbour looked for in this rank's batch only, as DINOv2's code does."""

    def local(x):
        x = F.normalize(x, dim=-1, eps=1e-8)
        with torch.no_grad():
            similarity = x @ x.T
            similarity.fill_diagonal_(-2.0)
            nearest = similarity.argmax(dim=1)
        return -torch.log(F.pairwise_distance(x, x[nearest], eps=1e-8) + 1e-8).mean()

    return local(z1) + local(z2)


def ibot_mean_of_rank_means(z1, z2):
    """iBOT's per-image masked mean averaged over this rank's images (DINOv2's division by its local number of
    crops), then averaged over ranks by DDP: right only when every rank holds as many images."""
    from solo.losses import sinkhorn

    a, b = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    mask = torch.sin(100 * a[..., 0].detach()) > 0

    def local(student, teacher):
        targets = sinkhorn(teacher.reshape(-1, 2), 0.5, 3, valid=mask.reshape(-1)).reshape(teacher.shape)
        per_patch = -(targets * F.log_softmax(student / 0.1, dim=-1)).sum(dim=-1) * mask
        return (per_patch.sum(dim=1) / mask.sum(dim=1).clamp_min(1)).mean()

    return local(a, b) + local(b, a)


def swav_max_of_empty_rank(z1, z2):
    """SwAV's global codes exactly as solo computes them, but for the stabilising max taken with amax over the rank's
    rows: right on every rank that holds samples, an error on one that holds none (solo's swav until the checker
    gained the empty-rank layout)."""
    from solo.losses import self_distillation

    views = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]
    with torch.no_grad():
        views[0].amax(dim=0)  # what the old code did first: raises on 0 rows
    return self_distillation.swav_loss(views, temperature=0.1)


def _mocov3_local_keys(q, k, t=0.5):
    q, k = F.normalize(q, dim=1), F.normalize(k.detach(), dim=1)
    return F.cross_entropy(q @ k.T / t, torch.arange(q.shape[0])) * 2 * t


def mocov3_local_keys(z1, z2):
    """MoCo v3 with this rank's keys only: the negatives are the local batch."""
    return _mocov3_local_keys(z1, z2) + _mocov3_local_keys(z2, z1)


def byol_mean_of_rank_means(z1, z2):
    """BYOL as this rank's mean, which DDP averages: the global mean only when every rank holds as many samples."""
    cos12 = F.cosine_similarity(z1, z2.detach(), dim=1)
    cos21 = F.cosine_similarity(z2, z1.detach(), dim=1)
    return (2 - 2 * cos12).mean() + (2 - 2 * cos21).mean()


def supervised_mean_of_rank_means(z1, z2):
    """Cross-entropy as this rank's mean, which DDP averages: the global mean only when the ranks' batches are equal."""
    return F.cross_entropy(z1, z2.detach().argmax(dim=1)) + F.cross_entropy(z2, z1.detach().argmax(dim=1))


def supcon_local_views(z1, z2):
    """SupCon over this rank's views only (solo-learn gathers, but many copies of the paper's code do not)."""
    labels = (z1.detach()[:, 0] > 0).long().repeat(2)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    is_self = torch.eye(len(z), dtype=torch.bool)
    logits = (z @ z.T / 0.3).masked_fill(is_self, float("-inf"))
    log_prob = logits - logits.logsumexp(dim=1, keepdim=True)
    positive = (labels[:, None] == labels[None, :]) & ~is_self
    return (-log_prob.masked_fill(~positive, 0.0).sum(dim=1) / positive.sum(dim=1)).mean()


def _nnclr_local(neighbours, p, t=0.2):
    neighbours, p = F.normalize(neighbours, dim=1), F.normalize(p, dim=1)
    return F.cross_entropy(neighbours @ p.T / t, torch.arange(p.shape[0]))


def nnclr_local_predictions(z1, z2):
    """NNCLR scored against this rank's predictions only: the negatives are the local batch."""
    return (_nnclr_local(z1, z2) + _nnclr_local(z2, z1)) / 2


def wmse_per_rank_whitening(z1, z2):
    """W-MSE with each rank whitening its own rows (its sub-batch is the local batch), as a per-GPU implementation
    does: the whitened embeddings, hence the loss, depend on the split."""
    w1, w2 = whiten(z1, 0.1), whiten(z2, 0.1)
    return (2 - 2 * F.cosine_similarity(w1, w2, dim=1)).mean()


def vibcreg_per_gpu_statistics(z1, z2):
    """VIbCReg with every statistic (mean, standard deviation, correlation) of this rank's batch."""

    def terms(z):
        centred = z - z.mean(dim=0)
        std = torch.sqrt(centred.pow(2).sum(dim=0) / (len(z) - 1) + 1e-4)
        unit = centred / centred.norm(dim=0).clamp_min(1e-12)
        correlation = unit.T @ unit
        return F.relu(1 - std).mean(), (correlation - torch.diag(torch.diagonal(correlation))).pow(2).mean()

    (std1, cov1), (std2, cov2) = terms(z1), terms(z2)
    return 25 * F.mse_loss(z1, z2) + 25 * (std1 + std2) + 200 * (cov1 + cov2)


def mae_mean_of_rank_means(z1, z2):
    """MAE's masked mean taken over this rank's masked patches (the reference code's), then averaged over ranks by
    DDP: the global mean only when every rank holds as many masked patches."""

    def local(prediction, target):
        prediction, target = prediction.reshape(len(prediction), 2, 2), target.reshape(len(target), 2, 2)
        mask = torch.sin(100 * target[..., 0].detach()) > 0
        error = (prediction - target.detach()).pow(2).mean(dim=-1)
        return (error * mask).sum() / mask.sum()

    return local(z1, z2) + local(z2, z1)


def beit_mean_of_rank_means(z1, z2):
    """BEiT's cross-entropy as its code takes it (nn.CrossEntropyLoss over this rank's masked patches), then averaged
    over ranks by DDP: the global mean only when every rank holds as many masked patches."""

    def local(logits, other):
        logits, other = logits.reshape(len(logits), 2, 2), other.reshape(len(other), 2, 2)
        mask = torch.sin(100 * other[..., 0].detach()) > 0
        return F.cross_entropy(logits[mask], other.argmax(-1)[mask])

    return local(z1, z2) + local(z2, z1)


def data2vec2_class_term_by_rank_hidden_share(z1, z2):
    """data2vec 2.0's loss weighted as fairseq's criterion weighs it: the class term multiplied by this rank's count
    of hidden patches and divided by the global one (the sample size), the rank's class errors averaged over its own
    rows. In one process, the loss; across ranks, each rank's class mean counts by its share of the hidden patches."""

    def local(prediction, target):
        prediction, target = prediction.reshape(len(prediction), 2, 2), target.reshape(len(target), 2, 2)
        mask = torch.sin(100 * target[..., 0].detach()) > 0
        hidden = all_reduce(mask.sum().double())
        regression = ((prediction - target.detach()).pow(2).sum(-1) * mask).sum() / math.sqrt(2) / hidden
        error = (prediction.mean(1) - target.mean(1).detach()).pow(2).sum(-1) / math.sqrt(2)
        return world_size() * (regression + 0.5 * error.mean() * mask.sum() / hidden)

    return local(z1, z2) + local(z2, z1)


def simmim_mean_of_rank_means(z1, z2):
    """SimMIM's L1 as its code takes it: the sum over this rank's masked pixels divided by their count, then averaged
    over ranks by DDP: the global mean only when every rank holds as many masked patches."""

    def local(prediction, target):
        prediction, target = prediction.reshape(len(prediction), 2, 2), target.reshape(len(target), 2, 2)
        mask = (torch.sin(100 * target[..., 0].detach()) > 0)[..., None].expand_as(target)
        return ((prediction - target.detach()).abs() * mask).sum() / mask.sum()

    return local(z1, z2) + local(z2, z1)


def aim_mean_of_rank_means(z1, z2):
    """AIM's next-patch squared error averaged over this rank's predicted patches, then over ranks by DDP: the
    global mean only when every rank predicts as many patches (prefixes of random length break it)."""

    def local(outputs, patches):
        outputs, patches = outputs.reshape(len(outputs), 4), patches.reshape(len(patches), 4).detach()
        prefix = 1 + ((torch.sin(100 * patches[:, 0]) + 1) * 1.5).long().clamp(max=2)
        predicted = torch.arange(4) >= prefix[:, None]
        errors = (outputs[:, :-1] - patches[:, 1:]).pow(2)
        return errors[predicted[:, 1:]].mean()

    return local(z1, z2) + local(z2, z1)


def rasa_mean_of_rank_means(z1, z2):
    """RASA's position error as the official code's F.mse_loss over this rank's patches, then averaged over ranks by
    DDP: the global mean only when every rank holds as many images."""
    predicted = torch.sigmoid(z1 - z2).unflatten(1, (-1, 2))
    grid = torch.linspace(0, 1, predicted.shape[1] * 2, dtype=z1.dtype).unflatten(0, (-1, 2))
    return F.mse_loss(predicted, grid.expand_as(predicted))


def nepa_mean_of_rank_means(z1, z2):
    """NEPA's negative cosine as a per-GPU mean over this rank's images, then averaged over ranks by DDP: the global
    mean only when every rank holds as many images (every image makes as many predictions)."""

    def local(outputs, embeddings):
        outputs, embeddings = outputs.unflatten(1, (2, -1)), embeddings.unflatten(1, (2, -1)).detach()
        return -F.cosine_similarity(outputs[:, :-1], embeddings[:, 1:], dim=-1).mean()

    return local(z1, z2) + local(z2, z1)


def gram_rank_mse(z1, z2):
    """DINOv3's GramLoss: one MSE over this rank's images' Gram matrices, then averaged over ranks by DDP: right only
    when every rank holds as many images."""

    def local(student, target):
        s, t = F.normalize(student, dim=-1), F.normalize(target.detach(), dim=-1)
        return F.mse_loss(s @ s.transpose(1, 2), t @ t.transpose(1, 2))

    a, b = z1.unflatten(1, (-1, 2)), z2.unflatten(1, (-1, 2))
    return local(a, b) + local(b, a)


def paka_mean_of_rank_means(z1, z2):
    """lightly's PatchKernelAlignmentLoss: 1 - CKA averaged over this rank's images, then averaged over ranks by DDP:
    right only when every rank holds as many images. Written with the centring matrix H, as the paper states it."""

    def local(student, teacher):
        n = student.shape[1]
        h = torch.eye(n, dtype=student.dtype) - 1 / n
        k_s = h @ student @ student.transpose(1, 2) @ h
        k_t = h @ teacher.detach() @ teacher.detach().transpose(1, 2) @ h
        cka = (k_s * k_t).sum((1, 2)) / (k_s.square().sum((1, 2)).sqrt() * k_t.square().sum((1, 2)).sqrt())
        return (1 - cka).mean()

    a, b = z1.unflatten(1, (-1, 1)), z2.unflatten(1, (-1, 1))
    return local(a, b) + local(b, a)


def ijepa_mean_of_rank_means(z1, z2):
    """I-JEPA's smooth L1 as the official code takes it: the mean over this rank's target patches (its
    F.smooth_l1_loss), then averaged over ranks."""

    def local(prediction, target):
        prediction, target = prediction.reshape(len(prediction), 2, 2), target.reshape(len(target), 2, 2)
        mask = torch.sin(100 * target[..., 0].detach()) > 0
        return F.smooth_l1_loss(prediction[mask], target.detach()[mask], beta=0.3)

    return local(z1, z2) + local(z2, z1)


def deepclusterv2_mean_of_rank_means(z1, z2):
    """DeepClusterV2 as solo-learn and SwAV take it: each clustering's mean over this rank's assigned rows (their
    F.cross_entropy with an ignore_index), then averaged over ranks."""

    def clusters(other):
        other = other.detach()
        return other.argmax(dim=1).masked_fill(torch.sin(100 * other[:, 0]) > 0.59, -1)

    return (
        F.cross_entropy(z1 / 0.1, clusters(z2), ignore_index=-1)
        + F.cross_entropy(z2 / 0.1, clusters(z1), ignore_index=-1)
    ) / 2


def _lejepa_case(z1, z2, seed=0):
    """lejepa_check's views (two global, z1 * z2 a local one) and 16 directions (drawn from `seed`)."""
    return [z1, z2, z1 * z2], random_directions(z1.shape[1], 16, seeded_uniforms(seed), dtype=z1.dtype)


def _lejepa_rank_terms(z1, z2):
    """This rank's means over its rows: of cos(t x) and sin(t x) per (view, direction, t), t on 17 nodes of [0, 3],
    and of the invariance's squares."""
    views, directions = _lejepa_case(z1, z2)
    angles = (torch.stack(views) @ directions).unsqueeze(-1) * torch.linspace(0, 3, 17, dtype=z1.dtype)
    centre = (z1 + z2) / 2
    invariance = torch.stack([(v - centre).square() for v in views]).mean()
    return angles.cos().mean(dim=1), angles.sin().mean(dim=1), invariance


def _lejepa_from_means(cos_mean, sin_mean, n, invariance):
    """lejepa_check's loss (lambda 0.5) from the characteristic function's means, the n that scales the statistic
    and the invariance: the trapezoid rule on [-3, 3] as 17 nodes of [0, 3] with doubled weights."""
    t = torch.linspace(0, 3, 17, dtype=cos_mean.dtype)
    window = torch.exp(-t.square() / 2)
    weights = torch.full_like(t, 2 * 3 / 16)
    weights[0] = weights[-1] = 3 / 16
    statistic = ((cos_mean - window).square() + sin_mean.square()) @ (weights * window) * n
    return 0.5 * invariance + 0.5 * statistic.mean()


def lejepa_per_rank_statistics(z1, z2):
    """LeJEPA with the empirical characteristic function of this rank's batch and the statistic scaled by its size,
    the invariance its mean: SIGReg as a per-GPU implementation computes it (the reference's MINIMAL.md, run under DDP)."""
    cos_mean, sin_mean, invariance = _lejepa_rank_terms(z1, z2)
    return _lejepa_from_means(cos_mean, sin_mean, len(z1), invariance)


def lejepa_per_rank_directions(z1, z2):
    """solo's LeJEPA with the directions drawn from a generator seeded by the rank (as torch.randn draws them, in the
    reference's MINIMAL.md, wherever the ranks' generators differ): every statistic global, but each rank tests other
    directions."""
    views, directions = _lejepa_case(z1, z2, seed=rank())
    return lejepa_loss(views, directions, lambd=0.5)


def lejepa_mean_of_rank_means(z1, z2):
    """LeJEPA as the reference code distributes it (lejepa.univariate.EppsPulley): each rank's means of the
    characteristic function averaged over the ranks (a differentiable all-reduce / W), the statistic scaled by the
    local batch x W, the invariance the rank's mean averaged by DDP: right only when every rank holds as many samples."""
    cos_mean, sin_mean, invariance = _lejepa_rank_terms(z1, z2)
    cos_mean, sin_mean = all_reduce(torch.stack([cos_mean, sin_mean])) / world_size()
    return _lejepa_from_means(cos_mean, sin_mean, len(z1) * world_size(), invariance)


def swav_queue_counted_on_every_rank(z1, z2):
    """SwAV's queue case with the queue's rows in every rank's Sinkhorn-Knopp, as each rank holding the global queue
    would add them: their mass counts W times in the equipartition."""
    queue, valid = checker_queue_scores(z1)
    views = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]
    n_total = sum(batch_sizes(len(z1), z1.device))
    rows = n_total + valid.sum().double()
    counted = torch.cat([valid, torch.ones(len(z1), dtype=torch.bool)])
    with torch.no_grad():
        targets = [_sinkhorn(torch.cat([q, s.detach()]), 0.5, 3, rows, counted)[len(q) :] for q, s in zip(queue, views)]
    log_probs = [F.log_softmax(s / 0.1, dim=1) for s in views]
    return -(targets[0] * log_probs[1] + targets[1] * log_probs[0]).sum() * (world_size() / (2 * n_total))


def fastsiam_mean_of_rank_means(z1, z2):
    """FastSiam's checker case (three views) as lightly's example computes it: each view's mean over this rank's
    samples of -cos(p_i, mean of the other views' projections), which DDP averages: right only with equal ranks."""
    predictions, projections = [z1, z2, z1 * z2], [z2, z1 - z2, z1 + z2]
    loss = 0.0
    for i, p in enumerate(predictions):
        target = torch.stack([z.detach() for j, z in enumerate(projections) if j != i]).mean(dim=0)
        loss = loss - F.cosine_similarity(p, target, dim=1).mean() / len(predictions)
    return loss


def pirl_mean_of_rank_means(z1, z2):
    """PIRL's checker case as VISSL's NCELossWithMemory (loss_type cross_entropy) takes it: nn.CrossEntropyLoss's mean
    over this rank's rows, which DDP averages over the ranks: the global mean only when the ranks hold as many rows."""
    bank, _ = _checker_queue(z1)
    index = checker_bank_index(z2)
    return sum(F.cross_entropy(F.normalize(z, dim=1) @ bank.T / 0.07, index) for z in (z1, z2)) / 2


def co2_mean_of_rank_means(z1, z2):
    """CO2's checker case as lightly's CO2Regularizer takes it: KLDivLoss(reduction="batchmean") over this rank's rows,
    which DDP averages over the ranks: the global mean only when the ranks hold as many rows."""
    queue, valid = _checker_queue(z1)
    negatives = queue[valid]
    loss = 0.0
    for q, k in ((z1, z2), (z2, z1)):
        u, v = F.normalize(q, dim=1), F.normalize(k.detach(), dim=1)
        positive = (u * v).sum(dim=1, keepdim=True)
        log_p = (torch.cat([positive, u @ negatives.T], 1) / 0.1).log_softmax(dim=1)
        log_r = (torch.cat([positive, v @ negatives.T], 1) / 0.1).log_softmax(dim=1)
        kl = F.kl_div(log_p, log_r, reduction="batchmean", log_target=True)
        loss = loss + (kl + F.kl_div(log_r, log_p, reduction="batchmean", log_target=True)) / 2
    return loss


def co2_batch_local_negatives(z1, z2):
    """SimCLR's and MoCo v3's CO2 with the negatives of this rank's batch only, as a regulariser fed each GPU's
    outputs takes them: the soft labels, hence the term, change with the number of GPUs."""
    loss = 0.0
    for q, k in ((z1, z2), (z2, z1)):
        others = ~torch.eye(len(q), dtype=torch.bool)
        loss = loss + co2_loss(q, k, F.normalize(k.detach(), dim=1), others, 0.1)
    return loss


def smog_per_rank_groups(z1, z2):
    """SMoG's checker case with the groups moved by this rank's rows only, as lightly's SMoGPrototypes
    (get_updated_group_features: the mean of the rows a process holds) does under DDP; the ranks then hold other
    groups, and the mean over ranks of their losses is not the global batch's."""
    groups = checker_groups(z1)
    assigned = [(F.normalize(z.detach(), dim=1) @ F.normalize(groups, dim=1).T).argmax(dim=1) for z in (z1, z2)]
    rows = torch.cat([z1, z2]).detach()
    chosen = (F.normalize(rows, dim=1) @ F.normalize(groups, dim=1).T).argmax(dim=1)
    counts = torch.bincount(chosen, minlength=len(groups)).to(rows.dtype)[:, None]
    means = torch.zeros_like(groups).index_add_(0, chosen, rows) / counts.clamp_min(1)
    moved = torch.where(counts > 0, 0.5 * groups + 0.5 * means, groups)
    return smog_loss(z1, moved, assigned[1], 0.1) + smog_loss(z2, moved, assigned[0], 0.1)


def vcreg_per_rank_statistics(z1, z2):
    """VCReg's checker case with each rank's own means, variances and covariances, as a regulariser computed on the
    batch a GPU holds (the layer of Algomancer/VCReg, a loss without a gather) does; DDP averages the ranks' values."""

    def terms(h, alpha, beta):
        centred = h - h.mean(dim=0)
        cov = centred.T @ centred / (len(h) - 1)
        d = h.shape[1]
        hinge = F.relu(1 - torch.sqrt(torch.diagonal(cov) + 1e-4)).mean()
        return alpha * hinge + beta * (cov - torch.diag(torch.diagonal(cov))).pow(2).sum() / (d * (d - 1))

    return terms(z1 * 0.3, 1.0, 1.0) + terms(z2, 0.5, 2.0)


def macl_local_negatives(z1, z2):
    """MACL's checker case (t0 0.1, alpha 0.5, a0 0.2) as lightly's MACLLoss computes it, without its 1e-8 in
    1 / (1 - P): this rank's views as the only negatives, the alignment this rank's mean, the loss its mean."""
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    u, n = torch.cat([u1, u2]), len(u1)
    similarity = u @ u.T
    positive = torch.cat([torch.diagonal(similarity, n), torch.diagonal(similarity, -n)])
    t = 0.1 * (1 + 0.5 * (positive.detach().mean() - 0.2))
    log_p = (similarity / t).fill_diagonal_(float("-inf")).log_softmax(dim=1)
    log_positive = torch.cat([torch.diagonal(log_p, n), torch.diagonal(log_p, -n)])
    return -(log_positive / (1 - log_positive.detach().exp())).mean()


def visreg_per_rank_statistics(z1, z2):
    """VISReg's checker case as lightly's VISRegLoss computes it by default (gather_distributed=False), with the
    directions the same on every rank: each view's mean, standard deviation and sorted projections over this rank's
    batch, the quantiles of its size; every term its rank's, averaged by DDP."""
    views = torch.stack([z1, z2, z1 * z2])
    directions = random_directions(z1.shape[1], 16, seeded_uniforms(0), dtype=z1.dtype)
    n = views.shape[1]
    invariance = (views - views[:2].mean(dim=0)).square().mean()
    mean, std = views.mean(dim=1, keepdim=True), views.std(dim=1, unbiased=False, keepdim=True)
    projected = (((views - mean) / (std.detach() + 1e-4)) @ directions).sort(dim=1).values
    quantiles = torch.distributions.Normal(0.0, 1.0).icdf(torch.arange(1, n + 1, dtype=z1.dtype) / (n + 1))
    shape = (projected - quantiles[:, None]).square().mean()
    regulariser = (1 - std).square().mean() + 0.5 * shape + 2.0 * mean.square().mean()
    return 0.5 * invariance + 0.5 * regulariser


def dcl_local_negatives(z1, z2):
    """DCL (the checker's case, temperature 0.1) with this rank's views as the only negatives, its mean averaged by
    DDP: the authors' code, and lightly's DCLLoss without gather_distributed."""
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    u = torch.cat([u1, u2])
    self_and_positive = torch.eye(len(u1), dtype=torch.bool).repeat(2, 2)
    negatives = (u @ u.T / 0.1).masked_fill(self_and_positive, float("-inf")).logsumexp(dim=1)
    return negatives.mean() - ((u1 * u2).sum(dim=1) / 0.1).mean()


def dclw_local_weights(z1, z2):
    """DCLW (the checker's case: temperature 0.1, sigma 0.5) with every negative of the global batch but the weights'
    softmax over this rank's pairs, N its size: lightly's DCLWLoss with gather_distributed, whose weight_fn sees the
    local batch. Written as solo's DCL plus the weights' share of the positive term."""
    similarity = (F.normalize(z1, dim=1) * F.normalize(z2, dim=1)).sum(dim=1)
    weights = 2 - len(similarity) * F.softmax(similarity.detach() / 0.5, dim=0)
    total = sum(batch_sizes(len(z1), z1.device))
    return dcl_loss(z1, z2, 0.1) - (weights - 1) @ similarity / 0.1 * (world_size() / total)


def _mmcr_views(z1, z2):
    """mmcr_check's three views (z1 * z2 the third), normalised: (n, 3, D)."""
    return torch.stack([F.normalize(v, dim=1) for v in (z1, z2, z1 * z2)], dim=1)


def _mmcr_from_views(units):
    """mmcr_check's loss (lambda 0.5) of the (n, V, D) normalised views, taken as the whole batch."""
    nuclear = torch.linalg.svdvals
    return -nuclear(units.mean(dim=1)).sum() + 0.5 * nuclear(units).sum() / len(units)


def mmcr_per_rank_nuclear_norm(z1, z2):
    """MMCR with the nuclear norm of this rank's centroids alone, as a loss that does not gather computes it under DDP:
    the ranks' norms, averaged, are not the norm of the global batch's matrix."""
    return _mmcr_from_views(_mmcr_views(z1, z2))


def mmcr_rank_only_gather(z1, z2):
    """MMCR as the authors' code distributes it: every rank's views all-gathered without gradient, this rank's own put
    back in their place, the whole loss on every rank; DDP's mean then gives the right value but 1/W of the gradient."""
    units = _mmcr_views(z1, z2)
    sizes = batch_sizes(len(units), units.device)
    start = sum(sizes[: rank()])
    every = gather(units.detach(), sizes)
    return _mmcr_from_views(torch.cat([every[:start], units, every[start + len(units) :]]))


def tico_per_rank_covariance(z1, z2):
    """TiCo (the checker's case: beta 0.9, rho 8) with B, and so the running covariance, from this rank's rows alone,
    its mean averaged by DDP: lightly's TiCoLoss without gather_distributed (its default)."""
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    batch = u1.T @ u1 / len(u1)
    running = 0.9 * earlier_covariance(u1.shape[1], u1) + 0.1 * batch
    return -(u1 * u2).sum(dim=1).mean() + 8.0 * (running * batch).sum()


def directclr_local_negatives(z1, z2):
    """DirectCLR (the checker's case: the first 3 dimensions, temperature 0.1) with this rank's samples as the only
    candidates, its mean averaged by DDP: the authors' loss without its gather, and lightly's DirectCLRLoss without
    gather_distributed (its default)."""
    u1, u2 = F.normalize(z1[:, :3], dim=1), F.normalize(z2[:, :3], dim=1)
    logits, own = u1 @ u2.T / 0.1, torch.arange(len(u1))
    return (F.cross_entropy(logits, own) + F.cross_entropy(logits.T, own)) / 2


def align_uniform_per_rank_pairs(z1, z2):
    """Alignment and uniformity (the checker's case: alpha 2, t 2, lambda 1) with each view's uniformity over this
    rank's pairs alone, its mean averaged by DDP: the authors' code, and lightly's HypersphereLoss, under DDP."""
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)

    def uniformity(u):
        return torch.pdist(u).pow(2).mul(-2.0).exp().mean().log()

    return (u1 - u2).norm(dim=1).pow(2).mean() + (uniformity(u1) + uniformity(u2)) / 2


def emp_ssl_per_rank_tcr(z1, z2):
    """EMP-SSL (the checker's case: views z1, z2, z1 * z2; eps 0.2, lambda 2) with each view's coding rate over this
    rank's rows alone (m the local count), its mean averaged by DDP: the authors' code and lightly's EMPSSLLoss under
    DDP."""
    u = torch.stack([F.normalize(v, dim=1) for v in (z1, z2, z1 * z2)])  # (V, n, D)
    n, d = u.shape[1], u.shape[2]
    rates = torch.logdet(torch.eye(d, dtype=u.dtype) + d / (n * 0.2) * u.transpose(1, 2) @ u) / 2
    return -rates.mean() - 2.0 * F.cosine_similarity(u, u.mean(dim=0, keepdim=True), dim=-1).mean()


def frossl_per_rank_covariance(z1, z2):
    """FroSSL (the checker's case: invariance weight 1) with each view standardised and its covariance taken over this
    rank's rows alone, its mean averaged by DDP: the authors' code (no gather) and lightly's FroSSLLoss under DDP."""

    def scaled(z):
        z = (z - z.mean(dim=0)) / z.std(dim=0)
        return z.shape[1] ** 0.5 * z / z.norm(dim=0)

    a, b = scaled(z1), scaled(z2)
    covariances = [v.T @ v / len(v) for v in (a, b)]
    return F.mse_loss(a, b) + sum(2 * torch.linalg.matrix_norm(k).log() for k in covariances)


def ssl_ey_per_rank_covariances(z1, z2):
    """SSL-EY with the covariances (and their means) of this rank's rows alone, its mean averaged by DDP: lightly's
    SSLEYLoss without gather_distributed (its default)."""
    a, b = z1 - z1.mean(dim=0), z2 - z2.mean(dim=0)
    n = len(a)
    gamma = 2 * a.T @ b / (n - 1)
    delta = (a.T @ a + b.T @ b) / (n - 1)
    return -2 * torch.trace(gamma) + torch.trace(delta @ delta)


def _capi_case(z1, z2):
    """capi's checker case (solo.losses.capi): the student's rows as 2 patches of 2 scores, the clustering head's
    likewise, a pseudo-random subset of the patches predicted."""
    student, teacher = z1.reshape(len(z1), 2, 2), z2.reshape(len(z2), 2, 2)
    return student, teacher, torch.sin(100 * student[..., 0].detach()) > 0


def capi_per_rank_sinkhorn(z1, z2):
    """CAPI with its Sinkhorn-Knopp over this rank's tokens only (each position's column sums not all-reduced); the
    means over the global batch as solo's."""
    from solo.losses import capi_loss

    student, teacher, predicted = _capi_case(z1, z2)
    with torch.no_grad():
        q = teacher.detach().transpose(0, 1) / 0.5  # (positions, n, K)
        q = torch.exp(q - q.amax(dim=1, keepdim=True) + 50)  # the official form: this rank's max, not the global one
        for _ in range(3):
            q = q / (q.sum(dim=1, keepdim=True) + 1e-8)
            q = q / (q.sum(dim=2, keepdim=True) + 1e-8)
        targets = q.transpose(0, 1)
    return capi_loss(student[predicted], targets[predicted], 0.2) + capi_loss(teacher, targets, 0.3)


def capi_mean_of_rank_means(z1, z2):
    """CAPI with solo's global Sinkhorn-Knopp but the authors' means: the student's loss over this rank's predicted
    patches (`loss.sum() / len(loss)`) and the clustering loss over its tokens (`.mean()`), averaged over ranks by
    DDP."""
    from solo.losses import capi_clustering

    student, teacher, predicted = _capi_case(z1, z2)
    targets, _ = capi_clustering(teacher, 0.5, 0.3, 3)
    student_ce = -(targets[predicted] * F.log_softmax(student[predicted] / 0.2, dim=-1)).sum(dim=-1)
    clustering_ce = -(targets * F.log_softmax(teacher / 0.3, dim=-1)).sum(dim=-1)
    return student_ce.sum() / max(len(student_ce), 1) + clustering_ce.mean()


def _msn_wrong(anchors, target, prior, sinkhorn_over="global", mean_over="global"):
    """msn_loss of solo.losses.msn's checker case (its prototypes and temperatures) with the targets' Sinkhorn-Knopp
    over the "global" batch or this "rank"'s, and the mean anchor probability of the "global" batch, this "rank"'s
    rows, or the mean of the "rank_means" (the authors' AllReduce of each rank's mean, divided by W)."""
    prototypes = torch.tensor(CHECK_PROTOTYPES, dtype=target.dtype)
    rows = sum(batch_sizes(target.shape[0])) * len(anchors)
    with torch.no_grad():
        log_sharpened = F.log_softmax(prototype_logits(target.detach(), prototypes, 0.5) / 0.5, dim=1)
        if sinkhorn_over == "rank":
            targets = rank_sinkhorn(log_sharpened, epsilon=1.0)
        else:
            targets = sinkhorn(log_sharpened, 1.0, 3)
    log_probs = [F.log_softmax(prototype_logits(a, prototypes, 0.5), dim=1) for a in anchors]
    loss = -sum((targets * lp).sum() for lp in log_probs) * (world_size() / rows)
    probs = torch.cat([lp.exp() for lp in log_probs])
    if mean_over == "rank":
        mean = probs.mean(dim=0)
    elif mean_over == "rank_means":
        mean = all_reduce(probs.mean(dim=0)) / world_size()
    else:
        mean = all_reduce(probs.sum(dim=0)) / rows
    if prior is None:
        return loss + (mean * mean.log()).sum() + math.log(len(mean))
    return loss + (prior * (prior.log() - mean.log())).sum()


def _msn_wrong_case(z1, z2, prior=None, **wrong):
    return _msn_wrong([z1, z1 + z2], z2.detach(), prior, **wrong) + _msn_wrong([z2], z1.detach(), prior, **wrong)


def msn_per_rank_me_max(z1, z2):
    """MSN with the mean-entropy term of each rank's mean anchor probability: lightly's MSNLoss without
    gather_distributed (its default)."""
    return _msn_wrong_case(z1, z2, mean_over="rank")


def msn_mean_of_rank_means(z1, z2):
    """MSN with the mean anchor probability the mean of the ranks' means, as the authors' AllReduce computes it."""
    return _msn_wrong_case(z1, z2, mean_over="rank_means")


def msn_per_rank_sinkhorn(z1, z2):
    """MSN with the targets balanced over this rank's samples only: lightly's default, and the authors' code in one
    process per node."""
    return _msn_wrong_case(z1, z2, sinkhorn_over="rank")


def pmsn_per_rank_prior_matching(z1, z2):
    """PMSN with each rank's mean anchor probability matched to the prior: lightly's PMSNLoss by default."""
    return _msn_wrong_case(z1, z2, prior=power_law_prior(len(CHECK_PROTOTYPES), 0.25, z1.dtype), mean_over="rank")


def vicregl_per_rank_local_statistics(z1, z2):
    """VICRegL with its global terms exact but the local terms' means, variances and covariances those of this rank's
    rows alone, averaged by DDP: the authors' local terms without their gather, lightly's VICRegLLoss without
    gather_distributed (its default)."""
    from solo.losses.vicregl import _check_maps, _matched, nearest_matches

    (maps1, centres1), (maps2, centres2) = _check_maps(z1), _check_maps(z2)
    exact_global = vicregl_loss(z1, z2, maps1, maps2, centres1, centres2, alpha=1.0)

    def terms(x, y):
        out = F.mse_loss(x, y) * 25.0
        for side in (x, y):
            cov = torch.einsum("bkc,bkd->kcd", side - side.mean(dim=0), side - side.mean(dim=0)) / (len(side) - 1)
            variance = torch.diagonal(cov, dim1=1, dim2=2)
            out = out + 25.0 * F.relu(1 - torch.sqrt(variance + 1e-4)).mean() / 2
            out = out + ((cov - torch.diag_embed(variance)).pow(2).sum(dim=(1, 2)) / side.shape[2]).mean() / 2
        return out

    with torch.no_grad():
        by_feature, by_location = torch.cdist(maps1, maps2), torch.cdist(centres1, centres2)
    local = (
        terms(*_matched(maps1, maps2, *nearest_matches(by_feature, None))) / 2
        + terms(*_matched(maps2, maps1, *nearest_matches(by_feature.transpose(1, 2), None))) / 2
    )
    for first, second in ((2, 3), (3, 2)):  # vicregl_check's num_matches, each ordered pair of views
        local = local + terms(*_matched(maps1, maps2, *nearest_matches(by_location, first))) / 4
        local = local + terms(*_matched(maps2, maps1, *nearest_matches(by_location.transpose(1, 2), second))) / 4
    return 0.5 * exact_global + 0.5 * local


def detcon_local_negatives(z1, z2):
    """DetCon-S (the checker's case, temperature 0.1) with this rank's regions as the only candidates, its mean over
    its own anchors averaged by DDP: lightly's DetConSLoss without gather_distributed."""
    from solo.losses.detcon import _check_regions

    (regions1, present1), (regions2, present2) = _check_regions(z1), _check_regions(z2)
    u = F.normalize(torch.stack([regions1, regions2], dim=1), dim=3).flatten(0, 2)  # image, view, region
    shown = torch.stack([present1, present2], dim=1).flatten()
    both = torch.stack([present1 & present2] * 2, dim=1).flatten()
    regions = regions1.shape[1]
    losses = []
    for a in range(len(u)):
        if not both[a]:
            continue
        image, view, region = a // (2 * regions), a // regions % 2, a % regions
        positive = (image * 2 + 1 - view) * regions + region
        others = [c for c in range(len(u)) if c != a and shown[c]]
        logits = torch.stack([u[a] @ u[c] for c in others]) / 0.1
        losses.append(torch.logsumexp(logits, dim=0) - u[a] @ u[positive] / 0.1)
    return torch.stack(losses).mean()


def official_dse(x, local_clusters, global_clusters, cluster):
    """DSE as the paper's official code computes it on the images it is given, `x` (B, P, D) or a list of B images'
    (P_b, D) tokens, loop by loop: each cluster's centred tokens alone through svdvals, boolean masks, Python means.
    `cluster(points, k, which)` gives (labels, centroids) for the image or group `which` ("image", b) / ("group", g).
    Where a group has one centroid its inter term is skipped (lightly's; the official code would add its 1e9 mask)."""
    x = [F.normalize(image, dim=-1) for image in x]
    every = torch.cat(x)
    dim = every.shape[-1]
    l2 = (every - every.mean(dim=0)).norm(dim=-1).mean() + 1e-12

    def spread(rows):
        return torch.linalg.svdvals(rows - rows.mean(dim=0)).sum() / math.sqrt(max(len(rows) - 1, dim))

    images = []
    for b, image in enumerate(x):
        labels, _ = cluster(image.detach(), min(local_clusters, len(image)), ("image", b))
        terms = [spread(image[labels == c]) for c in range(local_clusters) if (labels == c).sum() > 1]
        if terms:
            images.append(torch.stack(terms).mean())
    per_group = max(global_clusters // local_clusters, 1)
    inter, intra = [], []
    for g, start in enumerate(range(0, len(x), per_group)):
        rows = torch.cat(x[start : start + per_group])
        labels, centroids = cluster(rows.detach(), min(global_clusters, len(rows)), ("group", g))
        if len(centroids) > 1:
            own = F.one_hot(labels, len(centroids)).bool()
            inter.append(torch.cdist(rows, centroids).masked_fill(own, float("inf")).min(dim=1).values.mean())
        intra += [spread(rows[labels == c]) for c in range(len(centroids)) if (labels == c).sum() > 1]
    dtype = every.dtype
    intra_image = torch.stack(images).mean() / l2 if images else torch.tensor(0.0, dtype=dtype)
    inter_term = torch.stack(inter).mean() / l2 if inter else torch.tensor(0.0, dtype=dtype)
    intra_batch = torch.stack(intra).mean() / l2 if intra else torch.tensor(1.0, dtype=dtype)
    singular = torch.linalg.svdvals(every)
    p = singular / (singular.sum() + 1e-12) + 1e-12
    effective_rank = torch.exp(-(p * p.log()).sum()) / min(every.shape)
    return inter_term + effective_rank - 0.5 * (intra_batch + intra_image)


def dse_per_rank(z1, z2):
    """DSE as the official code and lightly's DSERegularizer distribute it: each rank's images alone (their own groups,
    means and singular values), averaged over ranks by DDP; clustered by solo's k-means with the draws solo's
    dse_score makes in one process, so that one process gives solo's value."""
    tokens = torch.cat([z1.unflatten(1, (-1, 2)), z2.unflatten(1, (-1, 2))], dim=1)
    groups = math.ceil(len(tokens) / 8)
    draws = seeded_uniforms(0)(len(tokens) + groups, 16)  # as dse_check's

    def cluster(points, k, which):
        row = which[1] if which[0] == "image" else len(tokens) + which[1]
        members, centroids, _ = dse_kmeans(points[None], points.new_ones(1, len(points)), k, draws[row : row + 1, :k])
        return members[0].argmax(dim=1), centroids[0]

    return -official_dse(tokens, 2, 16, cluster)


WRONG_SSL = [
    f"tests.wrong_losses:{name}"
    for name in (
        "vicreg_per_gpu_statistics",
        "vicreg_plain_all_reduce",
        "siglip_local_negatives",
        "dino_per_gpu_centre",
        "swav_per_gpu_sinkhorn",
        "mocov3_local_keys",
        "byol_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "supervised_mean_of_rank_means",  # likewise
        "supcon_local_views",
        "nnclr_local_predictions",
        "wmse_per_rank_whitening",
        "vibcreg_per_gpu_statistics",
        "mae_mean_of_rank_means",
        "beit_mean_of_rank_means",
        "simmim_mean_of_rank_means",
        "aim_mean_of_rank_means",
        "nepa_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "rasa_mean_of_rank_means",  # likewise
        "data2vec2_class_term_by_rank_hidden_share",
        "co2_batch_local_negatives",
        "swav_sinkhorn_local_batch_times_world",  # only wrong with uneven per-rank batches
        "franca_sinkhorn_local_batch_times_world",  # likewise
        "koleo_per_rank_neighbours",
        "ibot_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "gram_rank_mse",  # likewise
        "paka_mean_of_rank_means",  # likewise
        "ijepa_mean_of_rank_means",
        "deepclusterv2_mean_of_rank_means",
        "lejepa_per_rank_statistics",
        "lejepa_per_rank_directions",
        "lejepa_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "dcl_local_negatives",
        "dclw_local_weights",
        "mmcr_per_rank_nuclear_norm",
        "mmcr_rank_only_gather",
        "tico_per_rank_covariance",
        "directclr_local_negatives",
        "align_uniform_per_rank_pairs",
        "emp_ssl_per_rank_tcr",
        "frossl_per_rank_covariance",
        "ssl_ey_per_rank_covariances",
        "capi_per_rank_sinkhorn",
        "capi_mean_of_rank_means",
        "msn_per_rank_me_max",
        "msn_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "msn_per_rank_sinkhorn",
        "pmsn_per_rank_prior_matching",
        "detcon_local_negatives",
        "vicregl_per_rank_local_statistics",
        "swav_queue_counted_on_every_rank",
        "fastsiam_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "macl_local_negatives",
        "visreg_per_rank_statistics",
        "pirl_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "co2_mean_of_rank_means",  # only wrong with uneven per-rank batches
        "vcreg_per_rank_statistics",
        "smog_per_rank_groups",
        "dse_per_rank",
    )
]


# --- not a gradient bug: a loss that fails on one rank, while the others wait in a collective ---


def raises_on_last_rank(z1, z2):
    if world_size() > 1 and rank() == world_size() - 1:
        raise RuntimeError("boom on the last rank")
    return nt_xent_loss(z1, z2, temperature=0.3)


@LOSSES.register("wrong_ignores_its_scalar", learnable={"logit_scale": 10.0})
def ignores_its_scalar(z1, z2, logit_scale):
    return nt_xent_loss(z1, z2, temperature=0.3)


WRONG = [
    "tests.wrong_losses:nt_xent_local_anchors_rank_only_gather",
    "tests.wrong_losses:nt_xent_full_loss_rank_only_gather",
    "tests.wrong_losses:barlow_twins_plain_all_reduce",
]


def needs_equal_batches(z1, z2):
    """Exact on equal per-rank batches, but its plain all_gather of local-shaped tensors cannot take uneven ones."""
    n = z1.shape[0]
    if world_size() > 1:
        out = [torch.empty_like(z1) for _ in range(world_size())]
        dist.all_gather(out, z1.detach().contiguous())
        n = sum(o.shape[0] for o in out)
    return (z1 * z2).sum() * world_size() / n
