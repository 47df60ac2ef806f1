"""VIbCReg's, DeepClusterV2's, I-JEPA's, LeJEPA's, DCL's, MMCR's, TiCo's, DirectCLR's, alignment-uniformity's and
DINOv3's Gram anchoring's losses against hand-written references of the formulas their authors' code computes
(ML4ITS/vibcreg, SwAV's main_deepclusterv2.py, facebookresearch/ijepa, the LeJEPA paper's algorithm, the DCL and MMCR
papers' objectives, the TiCo objective as the TiCo-pytorch code computes it, facebookresearch/directclr,
SsnL/align_uniform, facebookresearch/dinov3's GramLoss; EMP-SSL's, FroSSL's and SSL-EY's against
tsb0601/EMP-SSL, OFSkean/FroSSL and jameschapman19/SSL-EY; SimMIM's against microsoft/SimMIM's models/simmim.py, AIM's
against the paper's next-patch objective after the prefix, CAPI's against the paper's Sinkhorn-Knopp targets and
cross-entropies; MSN's against facebookresearch/msn's loss, PMSN's against lightly's prior matching; FastSiam's
against lightly's example loop, MACL's against lightly's MACLLoss, VISReg's against the paper's equations as
lightly's VISRegLoss computes them, CO2's against lightly's CO2Regularizer and VCReg's against the paper's terms
on every block's output), each with a
variant they must reject (what solo used to compute, or a likely slip). Their exactness under DDP is the checker's
(tests/test_distributed.py)."""

import cmath
import collections
import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F

from solo.backbones.vit import embed_patches, output_tokens, patchify, prefix_tokens, run_blocks, take
from solo.data.views.masks import CoarseRandomMask, Data2Vec2Masks, InverseBlockMask, PrefixMask
from solo.errors import ConfigError
from solo.losses import (
    align_uniform_loss,
    capi_clustering,
    capi_loss,
    capi_sinkhorn,
    co2_batch_loss,
    co2_loss,
    dcl_loss,
    deepcluster_loss,
    detcon_loss,
    directclr_loss,
    dse_score,
    emp_ssl_loss,
    fastsiam_loss,
    frossl_loss,
    gram_loss,
    lejepa_loss,
    macl_loss,
    masked_patch_l1,
    masked_patch_mse,
    masked_patch_smooth_l1,
    mmcr_loss,
    momentum_groups,
    next_embedding_loss,
    next_patch_mse,
    nt_xent_loss,
    patch_kernel_alignment_loss,
    random_directions,
    smog_loss,
    ssl_ey_loss,
    swav_loss,
    tico_loss,
    vcreg_loss,
    vibcreg_loss,
    vicreg_loss,
    vicregl_loss,
    visreg_loss,
)
from solo.losses.uniforms import seeded_uniforms
from solo.losses.vicregl import nearest_matches
from solo.methods.aim import AIM, AIMConfig
from solo.methods.capi import CAPI, CAPIConfig
from solo.methods.detcon import grid_regions
from solo.methods.directclr import DirectCLR, DirectCLRConfig
from solo.methods.local import cell_centres
from solo.methods.nepa import NEPA, NEPAConfig
from solo.methods.simmim import SimMIM, SimMIMConfig
from solo.train.trainer import build_model
from tests.test_accumulate import CASES
from tests.test_train import TINY, compose_cfg
from tests.wrong_losses import dse_kmeans, official_dse, rank_sinkhorn


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- VIbCReg ---------------------------------------------------------------------------------------------------------


def _vibcreg_terms(z1, z2):
    """The authors' three terms: MSE; per branch mean(relu(1 - sqrt(unbiased var + 1e-4))), the two ADDED; per branch
    the mean over all D x D entries of the squared correlation matrix with its diagonal zeroed, the two added."""

    def hinge(z):
        return sum(max(0.0, 1 - math.sqrt(float(z[:, j].var()) + 1e-4)) for j in range(z.shape[1])) / z.shape[1]

    def decorrelation(z):
        d = z.shape[1]
        rho = torch.corrcoef(z.T)  # the covariance over the product of the standard deviations: the N - 1 cancels
        return sum(float(rho[i, j]) ** 2 for i in range(d) for j in range(d) if i != j) / d**2

    invariance = sum(float(a - b) ** 2 for a, b in zip(z1.flatten(), z2.flatten())) / z1.numel()
    return invariance, hinge(z1) + hinge(z2), decorrelation(z1) + decorrelation(z2)


def test_vibcreg_adds_both_branches_variance_hinges_as_the_authors_code():
    g = _generator(0)
    z1 = 0.5 * torch.randn(9, 6, generator=g, dtype=torch.float64)  # std < 1: the hinges are active
    z2 = z1 + 0.3 * torch.randn(9, 6, generator=g, dtype=torch.float64)
    invariance, variance, covariance = _vibcreg_terms(z1, z2)
    assert variance > 0.5
    assert float(vibcreg_loss(z1, z2, 1.0, 0.0, 0.0)) == pytest.approx(invariance, rel=1e-12)
    assert float(vibcreg_loss(z1, z2, 0.0, 1.0, 0.0)) == pytest.approx(variance, rel=1e-12)
    assert float(vibcreg_loss(z1, z2, 0.0, 0.0, 1.0)) == pytest.approx(covariance, rel=1e-12)
    expected = 25 * invariance + 25 * variance + 200 * covariance  # the authors' defaults, also solo's
    got = float(vibcreg_loss(z1, z2))
    assert got == pytest.approx(expected, rel=1e-12)
    averaged = 25 * invariance + 25 * variance / 2 + 200 * covariance  # what solo computed before: VICReg's mean
    assert abs(got - averaged) > 1e-3 * abs(expected)


# --- DeepClusterV2 ---------------------------------------------------------------------------------------------------


def _deepcluster_case(n=20, k=5, unassigned=6):
    """Two clusterings' scores of n rows, each with `unassigned` rows (30%) labelled -1, not the same rows."""
    g = _generator(1)
    scores = [torch.randn(n, k, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    assignments = []
    for _ in range(2):
        a = torch.randint(0, k, (n,), generator=g)
        a[torch.randperm(n, generator=g)[:unassigned]] = -1
        assignments.append(a)
    return scores, assignments


def _per_row_cross_entropy(scores, cluster, temperature):
    logits = [float(s) / temperature for s in scores.detach()]
    top = max(logits)
    return top + math.log(sum(math.exp(x - top) for x in logits)) - logits[cluster]


def test_deepclusterv2_is_the_mean_over_the_assigned_rows():
    scores, assignments = _deepcluster_case()
    t = 0.1
    per_clustering, all_rows = [], []
    for s, a in zip(scores, assignments):
        terms = [_per_row_cross_entropy(s[r], int(a[r]), t) for r in range(len(a)) if a[r] != -1]
        assert len(terms) == 14
        per_clustering.append(sum(terms) / len(terms))  # SwAV's and solo-learn's mean over the rows with a cluster
        all_rows.append(sum(terms) / len(a))  # what solo computed before: over every row
    got = deepcluster_loss(scores, assignments, t)
    assert got.item() == pytest.approx(sum(per_clustering) / 2, rel=1e-12)
    assert abs(got.item() - sum(all_rows) / 2) > 0.2 * got.item()

    # The same with the references' own reduction: each clustering's mean cross-entropy, ignoring -1.
    reference = sum(F.cross_entropy(s / t, a, ignore_index=-1) for s, a in zip(scores, assignments)) / 2
    got.backward()
    grads = [s.grad.clone() for s in scores]
    for s in scores:
        s.grad = None
    reference.backward()
    for s, a, g in zip(scores, assignments, grads):
        torch.testing.assert_close(g, s.grad, rtol=1e-12, atol=1e-15)
        assert not g[a == -1].any()  # an unassigned row takes no gradient


def test_deepclusterv2_without_assigned_rows_is_zero_not_nan():
    """Before the first k-means no row has a cluster: the references' mean over no row is NaN; here the loss is 0 and
    so is its gradient. A clustering without an assigned row adds 0 beside the others' means."""
    scores, assignments = _deepcluster_case()
    none = [torch.full_like(a, -1) for a in assignments]
    loss = deepcluster_loss(scores, none, 0.1)
    assert math.isnan(F.cross_entropy(scores[0], none[0], ignore_index=-1).item())
    assert loss.item() == 0.0
    loss.backward()
    assert all(not s.grad.any() for s in scores)

    half = deepcluster_loss(scores, [assignments[0], none[1]], 0.1)
    assert half.item() == pytest.approx(deepcluster_loss(scores[:1], assignments[:1], 0.1).item() / 2, rel=1e-12)


# --- I-JEPA ----------------------------------------------------------------------------------------------------------


def _patch_case(b=5, n=6, d=4):
    """Predictions and targets of b samples x n patches x d features, errors on both sides of smooth-L1's bend at 1,
    and masks holding 0 to 5 patches per sample."""
    g = _generator(2)
    prediction = 1.5 * torch.randn(b, n, d, generator=g, dtype=torch.float64)
    target = torch.randn(b, n, d, generator=g, dtype=torch.float64)
    mask = torch.rand(b, n, generator=g) < torch.linspace(0, 0.9, b)[:, None]
    mask[1, :] = True
    mask[0, :] = False
    return prediction, target, mask


def _smooth_l1(x: float, beta: float = 1.0) -> float:
    return 0.5 * x * x / beta if abs(x) < beta else abs(x) - 0.5 * beta


def test_ijepa_smooth_l1_is_the_official_codes_mean_over_every_target_feature():
    prediction, target, mask = _patch_case()
    chosen = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    errors = [float(prediction[i, j, k] - target[i, j, k]) for i, j in chosen for k in range(prediction.shape[2])]
    assert min(map(abs, errors)) < 1 < max(map(abs, errors))  # both sides of the bend
    expected = sum(map(_smooth_l1, errors)) / len(errors)
    got = float(masked_patch_smooth_l1(prediction, target, mask))
    assert got == pytest.approx(expected, rel=1e-12)
    # The official code's call on the target patches stacked: F.smooth_l1_loss(z, h), beta 1, mean over elements.
    assert got == pytest.approx(float(F.smooth_l1_loss(prediction[mask], target[mask])), rel=1e-12)
    squared = sum(e * e for e in errors) / len(errors)  # what solo computed before
    assert float(masked_patch_mse(prediction, target, mask)) == pytest.approx(squared, rel=1e-12)
    assert abs(got - squared) > 0.1 * got


@pytest.mark.parametrize("loss", ["smooth_l1", "mse", None])
def test_ijepa_method_loss_picks_the_error_smooth_l1_by_default(loss):
    overrides = CASES["ijepa_vit"] + ([f"method.loss={loss}"] if loss else [])
    cfg = compose_cfg(overrides)
    method = build_model(cfg, 10).method
    g = _generator(3)
    prediction, target = (torch.randn(2, 4, 3, 8, generator=g, dtype=torch.float64) for _ in range(2))
    prediction = 2 * prediction
    valid = torch.rand(2, 4, 3, generator=g) < 0.7
    encoded = {"prediction": prediction, "target": target, "valid": valid}
    got = float(method.batch_loss(encoded, {"label": torch.zeros(2, dtype=torch.long)})["loss"])
    errors = (prediction - target)[valid].flatten().tolist()
    per_error = (lambda e: e * e) if loss == "mse" else _smooth_l1
    assert got == pytest.approx(sum(map(per_error, errors)) / len(errors), rel=1e-12)
    assert cfg.method.loss == (loss or "smooth_l1")


# --- LeJEPA ----------------------------------------------------------------------------------------------------------


def _lejepa_case(n=7, d=3, views=4, slices=5):
    """Two global views and two local ones of n samples (near one another, spread about 1 along each axis), and
    `slices` unit directions."""
    g = _generator(4)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    embeddings = [base + 0.4 * torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(views)]
    directions = torch.randn(d, slices, generator=g, dtype=torch.float64)
    return [z.requires_grad_() for z in embeddings], directions / directions.norm(dim=0)


# The paper's nodes: 33 of [-3, 3], every 3/16, as the reference code's 17 of [0, 3] mirrored.
WHOLE_LINE = torch.linspace(-3, 3, 33, dtype=torch.float64)


def _paper_sigreg(views, directions, t=WHOLE_LINE):
    """The paper's algorithm in complex numbers: per view, the ECF at the nodes t, |ECF - exp(-t^2/2)|^2 exp(-t^2/2)
    integrated by torch.trapz, times N; the mean over views and directions."""
    window = torch.exp(-t.square() / 2)
    ecf = torch.exp(1j * (torch.stack(views) @ directions).unsqueeze(-1) * t).mean(dim=1)  # (V, M, T)
    return (torch.trapz((ecf - window).abs().square() * window, t, dim=-1) * len(views[0])).mean()


def _paper_lejepa(views, directions, lambd):
    centre = torch.stack(views[:2]).mean(dim=0)  # the global views'
    invariance = (centre - torch.stack(views)).square().mean()
    return (1 - lambd) * invariance + lambd * _paper_sigreg(views, directions)


def _epps_pulley_by_hand(x: list[float]) -> float:
    """One direction's statistic in plain Python: N x the trapezoid rule on the 33 nodes of [-3, 3]."""
    values = []
    for t in WHOLE_LINE.tolist():
        ecf = sum(cmath.exp(1j * t * v) for v in x) / len(x)
        values.append(abs(ecf - math.exp(-t * t / 2)) ** 2 * math.exp(-t * t / 2))
    return len(x) * 6 / 32 * (sum(values) - (values[0] + values[-1]) / 2)


def test_lejepa_is_the_papers_invariance_and_epps_pulley_sigreg_in_value_and_gradient():
    """Four views (two global, two local): solo's loss, its invariance alone (lambd 0) and SIGReg alone (lambd 1)
    against the paper's algorithm in complex numbers on [-3, 3] and a plain-Python statistic, in value and in the
    gradient of every view. Rejected: the centre over every view (local crops included), and the trapezoid rule on
    [0, 3] alone (the ECF's symmetry forgotten: the reference doubles its weights)."""
    views, directions = _lejepa_case()
    detached = [v.detach() for v in views]
    by_hand = [_epps_pulley_by_hand((v @ a).tolist()) for v in detached for a in directions.T]
    sigreg = lejepa_loss(detached, directions, lambd=1.0).item()
    assert sigreg == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-12)
    for lambd in (0.0, 1.0, 0.05):
        got, want = lejepa_loss(views, directions, lambd=lambd), _paper_lejepa(views, directions, lambd)
        assert got.item() == pytest.approx(want.item(), rel=1e-12), lambd
        for g, w in zip(torch.autograd.grad(got, views), torch.autograd.grad(want, views)):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)

    invariance = lejepa_loss(detached, directions, lambd=0.0).item()
    every_view_centre = float((torch.stack(detached).mean(dim=0) - torch.stack(detached)).square().mean())
    assert abs(invariance - every_view_centre) > 1e-2 * invariance
    half_line = float(_paper_sigreg(detached, directions, WHOLE_LINE[16:]))
    assert abs(sigreg - half_line) > 0.1 * sigreg


# --- DCL and DCLW ----------------------------------------------------------------------------------------------------


def _pair_case(n=7, d=3, seed=5):
    g = _generator(seed)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = z1 + 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64)
    return z1.requires_grad_(), z2.requires_grad_()


def _paper_dcl(z1, z2, temperature, sigma=None, weights_with_gradient=False):
    """The paper's Equation 6 anchor by anchor: for view k of sample i, -w_i <u_i^k, u_i^(3-k)> / tau plus the log of
    the sum of exp(<u_i^k, u_j^l> / tau) over both views l of every other sample j; the mean over the 2N anchors. DCLW's
    w_i = 2 - exp(<u_i^1, u_i^2> / sigma) / E_j[exp(<u_j^1, u_j^2> / sigma)] (a constant unless told otherwise)."""
    views = [z1 / z1.norm(dim=1, keepdim=True), z2 / z2.norm(dim=1, keepdim=True)]
    n = len(z1)
    weights = [1.0] * n
    if sigma is not None:
        pairs = [torch.exp(views[0][i] @ views[1][i] / sigma) for i in range(n)]
        weights = [2 - p / (sum(pairs) / n) for p in pairs]
        weights = weights if weights_with_gradient else [w.detach() for w in weights]
    anchors = []
    for k in range(2):
        for i in range(n):
            u = views[k][i]
            negatives = [torch.exp(u @ view[j] / temperature) for view in views for j in range(n) if j != i]
            anchors.append(-weights[i] * (u @ views[1 - k][i]) / temperature + torch.log(sum(negatives)))
    return sum(anchors) / (2 * n)


def _lightly_two_log_sum_exps(z1, z2, temperature):
    """lightly's DCLLoss: a log-sum-exp over each view's negatives apart, the two added."""
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    off = ~torch.eye(len(u1), dtype=torch.bool)

    def one_way(a, b):
        same, other = (a @ a.T / temperature)[off], (a @ b.T / temperature)[off]
        lse = same.view(len(a), -1).logsumexp(dim=1) + other.view(len(a), -1).logsumexp(dim=1)
        return (lse - (a * b).sum(dim=1) / temperature).mean()

    return (one_way(u1, u2) + one_way(u2, u1)) / 2


@pytest.mark.parametrize("sigma", [None, 0.5], ids=["dcl", "dclw"])
def test_dcl_is_the_papers_equation_6_in_value_and_gradient(sigma):
    """DCL and DCLW (weights without gradient, as lightly's) against the paper's equation anchor by anchor, in value
    and gradient. Told apart: NT-Xent (the positive in the denominator), lightly's two separate log-sum-exps, and (DCLW)
    weights that carry gradient, as the authors' code has them."""
    z1, z2 = _pair_case()
    got, want = dcl_loss(z1, z2, 0.1, sigma), _paper_dcl(z1, z2, 0.1, sigma)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for g, w in zip(torch.autograd.grad(got, (z1, z2)), torch.autograd.grad(want, (z1, z2))):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)

    z1, z2 = z1.detach(), z2.detach()
    value = got.item()
    if sigma is None:
        assert abs(value - nt_xent_loss(z1, z2, 0.1).item()) > 1e-2 * abs(value)
        assert abs(value - _lightly_two_log_sum_exps(z1, z2, 0.1).item()) > 1e-2 * abs(value)
        return
    z1.requires_grad_()
    mine = torch.autograd.grad(dcl_loss(z1, z2, 0.1, sigma), z1)[0]
    through_weights = torch.autograd.grad(_paper_dcl(z1, z2, 0.1, sigma, weights_with_gradient=True), z1)[0]
    assert (mine - through_weights).abs().max() > 1e-2 * mine.abs().max()


@pytest.mark.parametrize("weight_fn, sigma", [(None, None), ("none", None), ("vmf", 0.5)])
def test_dcl_method_weights_the_positive_only_with_weight_fn_vmf(weight_fn, sigma):
    overrides = TINY + ["method=dcl", "trainer.precision=64"] + ([f"method.weight_fn={weight_fn}"] if weight_fn else [])
    method = build_model(compose_cfg(overrides), 10).method
    z1, z2 = (z.detach() for z in _pair_case())
    assert method.loss(z1, z2).item() == pytest.approx(_paper_dcl(z1, z2, 0.1, sigma).item(), rel=1e-12)


# --- MMCR ------------------------------------------------------------------------------------------------------------


def _nuclear_norm_by_eigenvalues(m: torch.Tensor) -> torch.Tensor:
    """The sum of the singular values of each matrix of `m` (..., rows, columns), taken as the square roots of the
    eigenvalues of its smaller Gram matrix (never zero here: every case is of full rank)."""
    gram = m.mT @ m if m.shape[-2] >= m.shape[-1] else m @ m.mT
    return torch.linalg.eigvalsh(gram).sqrt().sum(dim=-1)


def _paper_mmcr(views, lambd):
    """The paper's objective: views normalised onto the sphere, each sample's centroid; minus the nuclear norm of the
    (N, D) centroid matrix, plus lambd times the mean over samples of the nuclear norm of each one's (V, D) views."""
    units = torch.stack([v / v.norm(dim=1, keepdim=True) for v in views], dim=1)  # (N, V, D)
    per_sample = _nuclear_norm_by_eigenvalues(units).mean()
    return -_nuclear_norm_by_eigenvalues(units.mean(dim=1)) + lambd * per_sample


def test_mmcr_is_the_nuclear_norm_of_the_global_centroids_in_value_and_gradient():
    """Three views (two global, one local) of 9 samples in 4 dimensions: solo's loss, with and without the per-sample
    term, against the paper's objective through eigenvalues of Gram matrices (not an SVD), in value and gradient.
    Rejected: the sum, or the mean, of the nuclear norms of two parts of the batch (what ranks that do not gather
    compute), and the centroids of the unnormalised embeddings."""
    g = _generator(6)
    base = torch.randn(9, 4, generator=g, dtype=torch.float64)
    views = [(base + 0.5 * torch.randn(9, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(3)]
    for lambd in (0.0, 0.3):
        got, want = mmcr_loss(views, lambd), _paper_mmcr(views, lambd)
        assert got.item() == pytest.approx(want.item(), rel=1e-12), lambd
        for a, b in zip(torch.autograd.grad(got, views), torch.autograd.grad(want, views)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    detached = [v.detach() for v in views]
    value = mmcr_loss(detached).item()
    parts = [mmcr_loss([v[:4] for v in detached]).item(), mmcr_loss([v[4:] for v in detached]).item()]
    for per_rank in (sum(parts), sum(parts) / 2):
        assert abs(value - per_rank) > 1e-2 * abs(value)
    unnormalised = -float(torch.linalg.matrix_norm(torch.stack(detached).mean(dim=0), ord="nuc"))
    assert abs(value - unnormalised) > 1e-2 * abs(value)


# --- TiCo ------------------------------------------------------------------------------------------------------------


def _paper_tico(z1, z2, covariance, beta, rho, batch_with_gradient=True):
    """One step of TiCo's objective, sample by sample: u = z / ||z||, B = (1/N) sum_i u1_i u1_i^T, C' = beta C +
    (1 - beta) B, L = -(1/N) sum_i <u1_i, u2_i> + rho (1/N) sum_i u1_i^T C' u1_i; returns (L, C'). B carries gradient,
    as in the TiCo-pytorch code; without it, as lightly's TiCoLoss."""
    u1, u2 = [z / z.norm() for z in z1], [z / z.norm() for z in z2]
    n = len(u1)
    batch = sum(torch.outer(u, u) for u in u1) / n
    batch = batch if batch_with_gradient else batch.detach()
    running = beta * covariance + (1 - beta) * batch
    invariance = -sum(a @ b for a, b in zip(u1, u2)) / n
    return invariance + rho * sum(u @ running @ u for u in u1) / n, running.detach()


def test_tico_is_the_papers_step_with_its_running_covariance_in_value_and_gradient():
    """Three steps on new batches, the running covariance carried from zero: solo's loss, its gradient and the
    covariance it returns against the objective written sample by sample. Told apart: B without gradient (lightly's
    TiCoLoss), and the covariance of part of the batch (what a rank that does not all-reduce keeps)."""
    g = _generator(8)
    mine = paper = torch.zeros(4, 4, dtype=torch.float64)
    for step in range(3):
        base = torch.randn(7, 4, generator=g, dtype=torch.float64)
        z1, z2 = ((base + 0.5 * torch.randn(7, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in "12")
        before = mine
        got, mine = tico_loss(z1, z2, before, beta=0.9, rho=8.0)
        want, paper = _paper_tico(z1, z2, paper, beta=0.9, rho=8.0)
        assert got.item() == pytest.approx(want.item(), rel=1e-12), step
        for a, b in zip(torch.autograd.grad(got, (z1, z2)), torch.autograd.grad(want, (z1, z2))):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(mine, paper, rtol=1e-12, atol=1e-14)

    ours = torch.autograd.grad(tico_loss(z1, z2, before, 0.9, 8.0)[0], z1)[0]
    lightly = torch.autograd.grad(_paper_tico(z1, z2, before, 0.9, 8.0, batch_with_gradient=False)[0], z1)[0]
    assert (ours - lightly).abs().max() > 1e-2 * ours.abs().max()
    part = tico_loss(z1[:3].detach(), z2[:3].detach(), before, 0.9, 8.0)[1]
    assert (part - mine).abs().max() > 1e-2 * mine.abs().max()


# --- DirectCLR -------------------------------------------------------------------------------------------------------


def _authors_directclr(r1, r2, d0, temperature):
    """facebookresearch/directclr: z = r[:, :d0]; infoNCE(a, b) = the mean over rows i of the cross-entropy of
    <a_i, b_j> / temperature over j (a, b normalised) at j = i; the loss infoNCE(z1, z2) / 2 + infoNCE(z2, z1) / 2.
    Row by row."""
    a = [r[:d0] / r[:d0].norm() for r in r1]
    b = [r[:d0] / r[:d0].norm() for r in r2]

    def info_nce(x, y):
        rows = [torch.stack([x_i @ y_j / temperature for y_j in y]) for x_i in x]
        return sum(torch.log(row.exp().sum()) - row[i] for i, row in enumerate(rows)) / len(x)

    return info_nce(a, b) / 2 + info_nce(b, a) / 2


def test_directclr_is_the_authors_infonce_on_the_leading_dimensions_in_value_and_gradient():
    """Against the authors' loss row by row, in value and gradient, the dimensions past d0 untouched. Told apart:
    NT-Xent on the same subvectors (lightly's DirectCLRLoss: the same view's samples are negatives too), and the
    InfoNCE of the whole representation."""
    g = _generator(9)
    base = torch.randn(8, 6, generator=g, dtype=torch.float64)
    r1, r2 = ((base + 0.5 * torch.randn(8, 6, generator=g, dtype=torch.float64)).requires_grad_() for _ in "12")
    got, want = directclr_loss(r1, r2, d0=4, temperature=0.1), _authors_directclr(r1, r2, 4, 0.1)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, (r1, r2)), torch.autograd.grad(want, (r1, r2))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        assert not a[:, 4:].any()

    r1, r2 = r1.detach(), r2.detach()
    value = got.item()
    assert abs(value - nt_xent_loss(r1[:, :4], r2[:, :4], 0.1).item()) > 1e-2 * abs(value)
    assert abs(value - _authors_directclr(r1, r2, 6, 0.1).item()) > 1e-2 * abs(value)


def test_directclr_refuses_more_dimensions_than_the_backbone_gives():
    with pytest.raises(ConfigError, match=r"method.d0=97: more than the backbone's 96 features"):
        DirectCLR(torch.nn.Identity(), 96, DirectCLRConfig(d0=97))


# --- Alignment and uniformity ----------------------------------------------------------------------------------------


def _authors_align_uniform(z1, z2, alpha, t, lambd):
    """SsnL/align_uniform: x, y normalised; align = the mean of ||x_i - y_i||^alpha; uniform(x) = log of the mean over
    the pairs i < j (torch.pdist's) of exp(-t ||x_i - x_j||^2); align + lambd * (uniform(x) + uniform(y)) / 2. Pair by
    pair."""
    x, y = [z / z.norm() for z in z1], [z / z.norm() for z in z2]
    n = len(x)
    align = sum((a - b).norm() ** alpha for a, b in zip(x, y)) / n

    def uniform(u):
        pairs = [torch.exp(-t * (u[i] - u[j]).square().sum()) for i in range(n) for j in range(i + 1, n)]
        return torch.log(sum(pairs) / len(pairs))

    return align + lambd * (uniform(x) + uniform(y)) / 2


@pytest.mark.parametrize("alpha, t, lambd", [(2.0, 2.0, 1.0), (1.0, 3.0, 0.5)])
def test_align_uniform_is_the_authors_loss_in_value_and_gradient(alpha, t, lambd):
    """Against the authors' two losses pair by pair, in value and gradient. Told apart: the uniformity of both views
    pooled into one set of 2N points, and the mean of two halves' uniformities (what ranks that do not gather
    compute)."""
    g = _generator(10)
    base = torch.randn(9, 4, generator=g, dtype=torch.float64)
    z1, z2 = ((base + 0.5 * torch.randn(9, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in "12")
    got, want = align_uniform_loss(z1, z2, alpha, t, lambd), _authors_align_uniform(z1, z2, alpha, t, lambd)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, (z1, z2)), torch.autograd.grad(want, (z1, z2))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)

    z1, z2 = z1.detach(), z2.detach()
    uniformity = align_uniform_loss(z1, z2, alpha, t, 1.0).item() - align_uniform_loss(z1, z2, alpha, t, 0.0).item()
    pooled = F.normalize(torch.cat([z1, z2]), dim=1)
    pooled_uniformity = torch.pdist(pooled).square().mul(-t).exp().mean().log().item()
    halves = [
        align_uniform_loss(z1[s], z2[s], alpha, t, 1.0) - align_uniform_loss(z1[s], z2[s], alpha, t, 0.0)
        for s in (slice(0, 4), slice(4, None))
    ]
    for other in (pooled_uniformity, float(sum(halves)) / 2):
        assert abs(uniformity - other) > 1e-2 * abs(uniformity)


# --- DINOv3's Gram anchoring -----------------------------------------------------------------------------------------


def _paper_gram(student, anchor):
    """DINOv3's Gram loss at the image level, pair by pair: for each image, the mean over its P x P patch pairs of
    (cos(s_i, s_j) - cos(a_i, a_j))^2; then the mean over the images. The anchor carries no gradient."""
    per_image = []
    for s, a in zip(student, anchor.detach()):
        pairs = [
            (F.cosine_similarity(s[i], s[j], dim=0) - F.cosine_similarity(a[i], a[j], dim=0)) ** 2
            for i in range(len(s))
            for j in range(len(s))
        ]
        per_image.append(sum(pairs) / len(pairs))
    return sum(per_image) / len(per_image)


def test_gram_anchoring_is_dinov3s_image_level_loss_in_value_and_gradient():
    """5 images of 6 patch tokens in 4 dimensions: solo's loss against the pairwise cosines, in value and gradient
    (the anchor gets none). Rejected: the Gram matrices of the raw tokens (no normalisation), and one Gram matrix over
    the whole batch's patches (DINOv3's img_level=false), which couples the images."""
    g = _generator(8)
    student = torch.randn(5, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    anchor = (student.detach() + 0.7 * torch.randn(5, 6, 4, generator=g, dtype=torch.float64)).requires_grad_()
    got, want = gram_loss(student, anchor), _paper_gram(student, anchor)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(got, student)[0], torch.autograd.grad(want, student)[0], rtol=1e-10, atol=1e-12
    )
    assert torch.autograd.grad(gram_loss(student, anchor), anchor, allow_unused=True)[0] is None

    s, a = student.detach(), anchor.detach()
    raw = ((s @ s.transpose(1, 2) - a @ a.transpose(1, 2)) ** 2).mean()
    flat_s, flat_a = F.normalize(s.flatten(0, 1), dim=-1), F.normalize(a.flatten(0, 1), dim=-1)
    batch_level = ((flat_s @ flat_s.T - flat_a @ flat_a.T) ** 2).mean()
    for wrong in (raw, batch_level):
        assert abs(got.item() - wrong.item()) > 1e-2 * got.item()


# --- PaKA ------------------------------------------------------------------------------------------------------------


def _paper_paka(student, teacher):
    """PaKA's loss as its paper and lightly's PatchKernelAlignmentLoss state it, image by image: K = Z Z^T, H = I -
    11^T / P, CKA = <H K_s H, H K_t H>_F / (||H K_s H||_F ||H K_t H||_F), 1 - CKA averaged over the images; the teacher
    carries no gradient."""
    per_image = []
    for s, t in zip(student, teacher.detach()):
        h = torch.eye(len(s), dtype=s.dtype) - 1 / len(s)
        k_s, k_t = h @ (s @ s.T) @ h, h @ (t @ t.T) @ h
        per_image.append(1 - torch.trace(k_s @ k_t) / (torch.linalg.norm(k_s) * torch.linalg.norm(k_t)))
    return sum(per_image) / len(per_image)


def test_paka_is_one_minus_the_centred_kernel_alignment_in_value_and_gradient():
    """5 images of 6 patch tokens in 4 dimensions: solo's loss against the paper's CKA with the centring matrix, in
    value and gradient (the teacher gets none); CKA's invariances hold (the teacher scaled and rotated changes
    nothing). Rejected: the kernels uncentred, and cosine kernels (the tokens normalised first)."""
    g = _generator(12)
    student = torch.randn(5, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = (student.detach() + 0.8 * torch.randn(5, 6, 4, generator=g, dtype=torch.float64)).requires_grad_()
    got, want = patch_kernel_alignment_loss(student, teacher), _paper_paka(student, teacher)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(got, student)[0], torch.autograd.grad(want, student)[0], rtol=1e-10, atol=1e-12
    )
    assert torch.autograd.grad(patch_kernel_alignment_loss(student, teacher), teacher, allow_unused=True)[0] is None
    rotation = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))[0]
    turned = patch_kernel_alignment_loss(student, 3.0 * teacher.detach() @ rotation)
    assert turned.item() == pytest.approx(got.item(), rel=1e-10)

    s, t = student.detach(), teacher.detach()
    uncentred = 1 - ((s @ s.mT) * (t @ t.mT)).sum((1, 2)) / (
        torch.linalg.norm(s @ s.mT, dim=(1, 2)) * torch.linalg.norm(t @ t.mT, dim=(1, 2))
    )
    cosine = _paper_paka(F.normalize(s, dim=-1), F.normalize(t, dim=-1))
    for wrong in (uncentred.mean(), cosine):
        assert abs(got.item() - wrong.item()) > 1e-2 * got.item()


def _tiny_dinov2(**keys):
    """DINOv2 on the tiny float64 ViT, without KoLeo (and `keys`), its loss alone (no probe)."""
    from solo.methods.dinov2 import DINOv2, DINOv2Config

    cfg = DINOv2Config(proj_hidden_dim=16, bottleneck_dim=8, num_prototypes=12, koleo_weight=0, **keys)
    method = DINOv2(_tiny_vit(0), 32, cfg).double()
    method.feeds_probe = False
    return method


def _two_crops_one_masked(images: int, seed: int):
    """`images` pairs of 16 px global crops, the first image's first crop with 5 patches masked: views, mask, batch."""
    g = _generator(seed)
    views = [torch.randn(images, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    mask = torch.zeros(images, 2, 16, dtype=torch.bool)
    mask[0, 0, :5] = True
    return views, mask, {"views": views, "mask": mask, "label": torch.zeros(images, dtype=torch.long)}


def test_dinov2_adds_paka_weight_times_the_alignment_of_student_and_teacher_patch_tokens():
    """DINOv2 with method.paka_weight: its loss grows by the weight times PaKA between each global crop's student
    patch tokens (with the mask token in the masked places) and the EMA teacher's of the whole crop, every term else
    unchanged."""

    def build(weight):
        method = _tiny_dinov2(paka_weight=weight)
        with torch.no_grad():
            for p in method.teacher.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=_generator(3), dtype=p.dtype))
        return method

    views, mask, batch = _two_crops_one_masked(3, seed=4)
    off, on = build(0.0), build(0.7)
    loss_off = off.batch_loss(off.encode(batch), batch)["loss"]
    loss_on = on.batch_loss(on.encode(batch), batch)["loss"]
    vit, teacher = on.backbone, on.teacher[0]
    student_tokens = [output_tokens(vit, v, m, on.mask_token)[:, 1:] for v, m in zip(views, mask.unbind(1))]
    with torch.no_grad():
        teacher_tokens = [output_tokens(teacher, v)[:, 1:] for v in views]
    want = (
        sum(_paper_paka(s[None, i], t[None, i]) for s, t in zip(student_tokens, teacher_tokens) for i in range(3)) / 6
    )
    assert (loss_on - loss_off).item() == pytest.approx(0.7 * want.item(), rel=1e-10)


# --- DSE -------------------------------------------------------------------------------------------------------------


def _blobs(images: int, tokens: int, dim: int, g: torch.Generator) -> torch.Tensor:
    """Each image's tokens in 3 tight blobs around its own random directions: any k-means finds them."""
    centres = torch.randn(images, 3, dim, generator=g, dtype=torch.float64)
    x = centres.repeat_interleave(tokens // 3, dim=1)
    return x + 0.01 * torch.randn(images, tokens, dim, generator=g, dtype=torch.float64)


def test_dse_is_the_official_formula_on_scikit_learn_clusters_in_value_and_gradient():
    """10 images of 12 tokens in 16 dimensions (groups of 8 and 2 images; 24 clusters on the last group's 24 tokens):
    solo's DSE against the official code's loops, clustered by scikit-learn's KMeans, in value and gradient; two views
    of the ten images give the same. Rejected: the images in another order (other groups of 8)."""
    from sklearn.cluster import KMeans

    def sklearn_kmeans(points, k, which):
        fitted = KMeans(n_clusters=k, n_init=10, random_state=0).fit(points.numpy())
        return torch.from_numpy(fitted.labels_).long(), torch.from_numpy(fitted.cluster_centers_)

    g = _generator(21)
    x = _blobs(10, 12, 16, g).requires_grad_()
    got, want = dse_score([x], uniforms=seeded_uniforms(0)), official_dse(x, 3, 24, sklearn_kmeans)
    assert got.item() == pytest.approx(want.item(), rel=1e-10)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0], rtol=1e-8, atol=1e-10)
    two_views = dse_score([x[:5], x[5:]], uniforms=seeded_uniforms(0))  # view by view: the same ten images in order
    assert two_views.item() == pytest.approx(got.item(), rel=1e-12)
    interleaved = dse_score([x[0::2], x[1::2]], uniforms=seeded_uniforms(0))  # other groups of 8 images
    assert abs(interleaved.item() - got.item()) > 1e-3 * abs(got.item())


def test_dse_of_padded_tokens_is_the_official_formula_on_each_images_own_tokens():
    """I-JEPA's contexts: 10 images of 6 to 12 real tokens (each of an image's 3 blobs missing 0 to 2 of its 4), first,
    then junk up to 12. DSE with the padding marked (`valid`) equals the official loops on each image's own tokens,
    clustered by solo's k-means on those tokens alone with the same draws, in value and gradient; the padding gets no
    gradient. The last group holds 18 tokens, fewer than its 24 clusters: the official's k = 18 there. Rejected: the
    padding counted as tokens. (The clustering itself against scikit-learn: the test above.)"""
    draws = seeded_uniforms(0)(10 + 2, 24)  # a row per image, then per group of 8 images; as dse_score draws them

    def own_tokens_kmeans(points, k, which):
        row = which[1] if which[0] == "image" else 10 + which[1]
        members, centroids, _ = dse_kmeans(points[None], points.new_ones(1, len(points)), k, draws[row : row + 1, :k])
        return members[0].argmax(dim=1), centroids[0]

    g = _generator(21)
    blobs = _blobs(10, 12, 16, g)
    x = torch.randn(10, 12, 16, generator=g, dtype=torch.float64)  # the junk
    valid = torch.zeros(10, 12, dtype=torch.bool)
    for b in range(10):
        own = torch.cat([blobs[b, blob * 4 : blob * 4 + 4 - b % 3] for blob in range(3)])
        x[b, : len(own)], valid[b, : len(own)] = own, True
    x.requires_grad_()
    got = dse_score([x], uniforms=seeded_uniforms(0), valid=[valid])
    want = official_dse([image[keep] for image, keep in zip(x, valid)], 3, 24, own_tokens_kmeans)
    assert got.item() == pytest.approx(want.item(), rel=1e-10)
    grad = torch.autograd.grad(got, x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(want, x)[0], rtol=1e-8, atol=1e-10)
    assert grad[~valid].abs().max() == 0
    padding_counted = dse_score([x], uniforms=seeded_uniforms(0))
    assert abs(padding_counted.item() - got.item()) > 1e-3 * abs(got.item())


def test_dinov2_adds_dse_weight_times_minus_dse_of_the_student_patch_tokens():
    """DINOv2 with method.dse_weight: its loss falls by the weight times DSE of the global crops' student patch tokens
    (the mask token in the masked places), the crops as images view by view; every term else unchanged. The crops'
    images interleaved would give another value."""

    views, mask, batch = _two_crops_one_masked(5, seed=5)
    off, on = _tiny_dinov2(dse_weight=0.0), _tiny_dinov2(dse_weight=0.3)
    loss_off = off.batch_loss(off.encode(batch), batch)["loss"]
    torch.manual_seed(7)  # no trainer: the k-means++ draws come from torch's generator
    loss_on = on.batch_loss(on.encode(batch), batch)["loss"]
    vit = on.backbone
    tokens = [output_tokens(vit, v, m, on.mask_token)[:, 1:] for v, m in zip(views, mask.unbind(1))]
    torch.manual_seed(7)
    want = dse_score(tokens)
    assert (loss_off - loss_on).item() == pytest.approx(0.3 * want.item(), rel=1e-10)
    torch.manual_seed(7)
    interleaved = dse_score([torch.stack(tokens, 1).flatten(0, 1)])
    assert abs(interleaved.item() - want.item()) > 1e-3 * abs(want.item())


def test_mae_adds_dse_weight_times_minus_dse_of_the_encoded_visible_patches():
    """MAE with method.dse_weight: its loss falls by the weight times DSE of the encoder's output for each image's
    visible patches (the class token left out); the pixel loss unchanged. DSE of all the patches would differ."""
    from solo.methods.mae import MAE, MAEConfig

    cfg = MAEConfig(mask_ratio=0.5, decoder_embed_dim=16, decoder_depth=1, decoder_heads=2, dse_weight=0.3)
    on = MAE(_tiny_vit(9), 32, cfg).double()
    off = copy.deepcopy(on)
    off.dse = None  # DSE off, all else alike
    on.feeds_probe = off.feeds_probe = False
    g = _generator(35)
    images = torch.randn(10, 3, 16, 16, generator=g, dtype=torch.float64)
    mask = torch.stack([torch.randperm(16, generator=g) < 8 for _ in range(10)])
    batch = {"views": [images], "mask": mask, "label": torch.zeros(10)}
    loss_off = off.batch_loss(off.encode(batch), batch)["loss"]
    torch.manual_seed(7)  # no trainer: the k-means++ draws come from torch's generator
    loss_on = on.batch_loss(on.encode(batch), batch)["loss"]
    vit = on.backbone
    visible = torch.stack([embed_patches(vit, images)[i][~mask[i]] for i in range(10)])
    encoded = run_blocks(vit, torch.cat([prefix_tokens(vit, 10), visible], 1))[:, 1:]
    torch.manual_seed(7)
    want = dse_score([encoded])
    assert (loss_off - loss_on).item() == pytest.approx(0.3 * want.item(), rel=1e-10)
    torch.manual_seed(7)
    every_patch = dse_score([output_tokens(vit, images)[:, 1:]])
    assert abs(every_patch.item() - want.item()) > 1e-3 * abs(want.item())


def test_msn_adds_dse_weight_times_minus_dse_of_the_masked_anchors_visible_patches():
    """MSN with method.dse_weight: its loss falls by the weight times DSE of the encoder's output for the anchor
    crop's kept patches (the class token left out); MSN's own loss unchanged. DSE of the target crop's patches (the
    teacher's view) would differ."""
    from solo.methods.msn import MSN, MSNConfig

    cfg = MSNConfig(proj_hidden_dim=16, proj_output_dim=8, num_prototypes=12, mask_ratio=0.25, dse_weight=0.3)
    on = MSN(_tiny_vit(10), 32, cfg).double()
    off = copy.deepcopy(on)
    off.dse = None
    on.feeds_probe = off.feeds_probe = False
    g = _generator(37)
    target, anchor = (torch.randn(10, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.stack([torch.randperm(16, generator=g) < 4 for _ in range(10)])
    batch = {"views": [target, anchor], "mask": mask, "label": torch.zeros(10)}
    loss_off = off.batch_loss(off.encode(batch), batch)["loss"]
    torch.manual_seed(7)  # no trainer: the k-means++ draws come from torch's generator
    loss_on = on.batch_loss(on.encode(batch), batch)["loss"]
    vit = on.backbone
    visible = torch.stack([embed_patches(vit, anchor)[i][~mask[i]] for i in range(10)])
    encoded = run_blocks(vit, torch.cat([prefix_tokens(vit, 10), visible], 1))[:, 1:]
    torch.manual_seed(7)
    want = dse_score([encoded])
    assert (loss_off - loss_on).item() == pytest.approx(0.3 * want.item(), rel=1e-9)
    torch.manual_seed(7)
    teachers_view = dse_score([output_tokens(vit, target)[:, 1:]])
    assert abs(teachers_view.item() - want.item()) > 1e-3 * abs(want.item())


def test_ijepa_adds_dse_weight_times_minus_dse_of_each_images_encoded_context():
    """I-JEPA with method.dse_weight: its loss falls by the weight times DSE of the encoder's output for each image's
    context patches (the prefix left out), each image's context run through the ViT alone (no padding), its tokens
    alone in the DSE (solo.losses.dse_score's `valid`); the prediction loss unchanged. With the padding counted as
    tokens the value differs."""
    from solo.methods.ijepa import IJEPA, IJEPAConfig

    cfg = IJEPAConfig(predictor_embed_dim=16, predictor_depth=1, predictor_heads=2, dse_weight=0.3)
    on = IJEPA(_tiny_vit(9), 32, cfg).double()
    off = copy.deepcopy(on)
    off.dse = None
    on.feeds_probe = off.feeds_probe = False
    g = _generator(36)
    images = torch.randn(10, 3, 16, 16, generator=g, dtype=torch.float64)
    masks = torch.stack([on.mask_generator()(random.Random(b)) for b in range(10)])
    assert len(set(masks[:, 0].sum(dim=1).tolist())) > 1  # contexts of several sizes: padding to mark
    batch = {"views": [images], "mask": masks, "label": torch.zeros(10)}
    loss_off = off.batch_loss(off.encode(batch), batch)["loss"]
    torch.manual_seed(7)  # no trainer: the k-means++ draws come from torch's generator
    loss_on = on.batch_loss(on.encode(batch), batch)["loss"]
    vit, most = on.backbone, on.mask_generator().most_context
    contexts = []
    for image, context in zip(images, masks[:, 0]):
        patches = embed_patches(vit, image[None])[:, context]
        contexts.append(run_blocks(vit, torch.cat([prefix_tokens(vit, 1), patches], 1))[0, 1:])
    padded = torch.stack([F.pad(c, (0, 0, 0, most - len(c))) for c in contexts])
    valid = torch.stack([torch.arange(most) < len(c) for c in contexts])
    torch.manual_seed(7)
    want = dse_score([padded], valid=[valid])
    assert (loss_off - loss_on).item() == pytest.approx(0.3 * want.item(), rel=1e-9)
    torch.manual_seed(7)
    padding_counted = dse_score([padded])
    assert abs(padding_counted.item() - want.item()) > 1e-3 * abs(want.item())


# --- EMP-SSL ---------------------------------------------------------------------------------------------------------


def _authors_emp_ssl(views, eps, lambd, normalise=True):
    """tsb0601/EMP-SSL: z = F.normalize(projection); TotalCodingRate(W = z^T, d x m) = logdet(I + d / (m eps) W W^T) / 2,
    averaged over the patches; the similarity: the mean over patches and samples of cos(z_i, mean over patches of z);
    loss = -lambd * similarity - TCR. Sample by sample; `normalise=False`: lightly's EMPSSLLoss, which takes the
    embeddings as given."""
    z = [[v / v.norm() if normalise else v for v in view] for view in views]
    num_views, n, d = len(z), len(z[0]), len(z[0][0])
    rates = []
    for view in z:
        w = torch.stack(view).T
        rates.append(torch.logdet(torch.eye(d, dtype=w.dtype) + d / (n * eps) * w @ w.T) / 2)
    similarity = 0
    for i in range(n):
        mean = sum(view[i] for view in z) / num_views
        similarity = similarity + sum(view[i] @ mean / (view[i].norm() * mean.norm()) for view in z)
    return -lambd * similarity / (num_views * n) - sum(rates) / num_views


def test_emp_ssl_is_the_authors_coding_rate_and_patch_similarity_in_value_and_gradient():
    """Four patches of 10 images in 5 dimensions, against the authors' loss written sample by sample. Told apart: the
    embeddings unnormalised (lightly's), epsilon squared once more (the paper writes eps^2 = 0.2), and the coding rate
    of two halves of the batch (what ranks that do not all-reduce compute)."""
    g = _generator(11)
    base = torch.randn(10, 5, generator=g, dtype=torch.float64)
    views = [(base + 0.6 * torch.randn(10, 5, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(4)]
    got, want = emp_ssl_loss(views, eps=0.2, lambd=200.0), _authors_emp_ssl(views, 0.2, 200.0)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, views), torch.autograd.grad(want, views)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    views = [v.detach() for v in views]
    rate = emp_ssl_loss(views, 0.2, 0.0).item()
    halves = sum(emp_ssl_loss([v[s] for v in views], 0.2, 0.0).item() for s in (slice(0, 5), slice(5, None))) / 2
    for wrong, right in (
        (_authors_emp_ssl(views, 0.2, 200.0, normalise=False).item(), got.item()),
        (emp_ssl_loss(views, 0.04, 0.0).item(), rate),
        (halves, rate),
    ):
        assert abs(wrong - right) > 1e-2 * abs(right)


# --- FroSSL ----------------------------------------------------------------------------------------------------------


def _authors_frossl(z_a, z_b, invariance_weight):
    """OFSkean/FroSSL's frossl_loss_func (linear kernel): each view standardised along the batch ((z - mean) / std),
    each column scaled to norm sqrt(D); mse = nn.MSELoss; K = z^T z / N; loss = invariance_weight * mse - sum over the
    views of -2 log ||K||_F. Column by column."""
    n, d = z_a.shape

    def normalised(z):
        columns = []
        for j in range(d):
            c = (z[:, j] - z[:, j].mean()) / z[:, j].std()
            columns.append(d**0.5 * c / c.norm())
        return torch.stack(columns, dim=1)

    a, b = normalised(z_a), normalised(z_b)
    mse = sum(((a[i] - b[i]) ** 2).sum() for i in range(n)) / (n * d)
    entropies = [-2 * torch.log(torch.sqrt(((v.T @ v / n) ** 2).sum())) for v in (a, b)]
    return invariance_weight * mse - sum(entropies)


@pytest.mark.parametrize("invariance_weight", [1.0, 2.0])
def test_frossl_is_the_authors_two_view_loss_in_value_and_gradient(invariance_weight):
    """Against the authors' two-view loss column by column, in value and gradient. Told apart: each sample's embedding
    L2-normalised instead of each dimension standardised (the authors' multi-view code), and the covariances of two
    halves of the batch (what ranks that do not all-reduce compute)."""
    g = _generator(12)
    base = torch.randn(11, 4, generator=g, dtype=torch.float64)
    z1, z2 = ((base + 0.5 * torch.randn(11, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in "12")
    got, want = frossl_loss(z1, z2, invariance_weight), _authors_frossl(z1, z2, invariance_weight)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, (z1, z2)), torch.autograd.grad(want, (z1, z2))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    z1, z2 = z1.detach(), z2.detach()
    regulariser = frossl_loss(z1, z2, 0.0).item()
    rows = [2 * F.normalize(z, dim=1) for z in (z1, z2)]  # sqrt(D) = 2
    by_rows = sum(torch.log(((r.T @ r / 11) ** 2).sum()) for r in rows).item()
    halves = sum(frossl_loss(z1[s], z2[s], 0.0).item() for s in (slice(0, 5), slice(5, None))) / 2
    for wrong in (by_rows, halves):
        assert abs(wrong - regulariser) > 1e-2 * abs(regulariser)


# --- SSL-EY ----------------------------------------------------------------------------------------------------------


def _authors_ssl_ey(z1, z2):
    """jameschapman19/SSL-EY: x, y centred with the batch's means; C = 2 x^T y / (N - 1); V = (x^T x + y^T y) / (N - 1);
    loss = -2 tr(C) + tr(V V). Entry by entry."""
    n, d = z1.shape
    x, y = z1 - z1.mean(dim=0), z2 - z2.mean(dim=0)

    def cov(a, b, i, j):
        return sum(a[k, i] * b[k, j] for k in range(n)) / (n - 1)

    trace_c = sum(2 * cov(x, y, i, i) for i in range(d))
    v = [[cov(x, x, i, j) + cov(y, y, i, j) for j in range(d)] for i in range(d)]
    return -2 * trace_c + sum(v[i][j] * v[j][i] for i in range(d) for j in range(d))


def test_ssl_ey_is_the_authors_objective_in_value_and_gradient():
    """Against the authors' loss entry by entry, in value and gradient. Told apart: the covariances over N instead of
    N - 1, the paper's unbiased estimate of tr(V V) from two independent halves (tr(V_a V_b)), and the mean of two
    halves' losses (what ranks that do not gather compute)."""
    g = _generator(13)
    base = torch.randn(9, 4, generator=g, dtype=torch.float64)
    z1, z2 = ((base + 0.5 * torch.randn(9, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in "12")
    got, want = ssl_ey_loss(z1, z2), _authors_ssl_ey(z1, z2)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, (z1, z2)), torch.autograd.grad(want, (z1, z2))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    z1, z2 = z1.detach(), z2.detach()
    x, y = z1 - z1.mean(dim=0), z2 - z2.mean(dim=0)
    over_n = (-4 * (x * y).sum() / 9 + (((x.T @ x + y.T @ y) / 9) ** 2).sum()).item()

    def auto(s):
        a, b = z1[s] - z1[s].mean(dim=0), z2[s] - z2[s].mean(dim=0)
        return (a.T @ a + b.T @ b) / (len(a) - 1)

    split = (-4 * (x * y).sum() / 8 + torch.trace(auto(slice(0, 4)) @ auto(slice(4, None)))).item()
    halves = sum(ssl_ey_loss(z1[s], z2[s]).item() for s in (slice(0, 4), slice(4, None))) / 2
    for wrong in (over_n, split, halves):
        assert abs(wrong - got.item()) > 1e-2 * abs(got.item())


# --- SimMIM ----------------------------------------------------------------------------------------------------------


def _tiny_vit(seed: int):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0).double()


def _simmim_code_loss(x, x_rec, mask, patch):
    """microsoft/SimMIM models/simmim.py on (B, 3, H, W) images: the patch mask (B, h, w) repeated to pixels, the L1
    error summed over the masked pixels, divided by their count and by the 3 channels."""
    pixels = mask.repeat_interleave(patch, 1).repeat_interleave(patch, 2).unsqueeze(1)
    return (F.l1_loss(x, x_rec, reduction="none") * pixels).sum() / pixels.sum() / 3


def test_simmim_is_its_codes_mean_over_the_masked_pixels_in_value_and_gradient():
    """4 images of 8 px in 2 px patches (a 4 x 4 grid), masks of 3 to 12 patches: solo's loss on the patchified
    images against SimMIM's on the images, in value and gradient. Rejected: each image's mean, then their mean (the
    samples weigh alike whatever they hide), and the mean over every pixel, hidden or not."""
    g = _generator(11)
    images = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 4, 4, generator=g) < torch.tensor([0.2, 0.4, 0.6, 0.8])[:, None, None]
    mask[0, 0, :3] = True
    # Errors that grow from image to image, and larger on the hidden pixels than on the visible ones.
    scale = torch.arange(1.0, 5.0, dtype=torch.float64)[:, None, None, None] * (
        1 + 2 * mask.repeat_interleave(2, 1).repeat_interleave(2, 2)[:, None]
    )
    noise = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
    reconstruction = (images + scale * noise).requires_grad_()
    got = masked_patch_l1(patchify(reconstruction, 2), patchify(images, 2), mask.flatten(1))
    want = _simmim_code_loss(images, reconstruction, mask, 2)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(got, reconstruction)[0], torch.autograd.grad(want, reconstruction)[0], rtol=1e-10, atol=0
    )

    errors = (reconstruction - images).abs().detach()
    per_image = torch.stack(
        [_simmim_code_loss(images[i : i + 1], reconstruction[i : i + 1], mask[i : i + 1], 2) for i in range(4)]
    )
    for wrong in (per_image.mean(), errors.mean()):
        assert abs(got.item() - wrong.item()) > 1e-2 * got.item()


def test_simmim_masks_are_its_mask_generators_squares():
    """A 6 x 6 grid of patches in 2 x 2 squares (9 of them), ratio 0.6: ceil(5.4) = 6 squares hidden, each whole."""
    random.seed(0)
    generator = CoarseRandomMask((6, 6), 2, 0.6)
    for _ in range(20):
        mask = generator().reshape(6, 6)
        squares = mask.reshape(3, 2, 3, 2).permute(0, 2, 1, 3).flatten(2)  # (3, 3, 4): each square's 4 patches
        assert (squares.all(-1) | ~squares.any(-1)).all(), "a square is hidden whole or not at all"
        assert int(squares.all(-1).sum()) == 6 == generator.hidden // 4


def test_simmim_encoder_never_sees_the_hidden_pixels():
    """The mask token replaces a hidden patch's embedding before the encoder: changing a hidden patch's pixels
    changes no prediction, changing a visible one's changes them."""
    method = SimMIM(_tiny_vit(0), 32, SimMIMConfig(mask_patch_size=4)).double()
    method.feeds_probe = False
    g = _generator(12)
    images = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, [0, 5, 6, 15]] = True

    def predict(x):
        return method.encode({"views": [x], "mask": mask})["prediction"]

    before = predict(images)
    for patch, hidden in ((5, True), (9, False)):
        changed = images.clone()
        row, col = divmod(patch, 4)
        changed[:, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] += 1.0
        assert torch.equal(predict(changed), before) == hidden, patch


# --- data2vec --------------------------------------------------------------------------------------------------------


def _data2vec_code_loss(student, teacher, mask_token, images, mask, top, beta):
    """data2vec_vision's README command (--layer_results end --post_target_layer_norm --l1_beta), through timm's own
    ViT code: the teacher (the student's embeddings, the teacher's blocks) on the whole image, its last `top` blocks'
    patch outputs before the final norm (timm's forward_intermediates) averaged and layer-normalised; the student
    (timm's patch embedding, the mask token in the hidden patches' place, timm's _pos_embed, blocks and final norm);
    smooth L1 summed over the features, times 1 / sqrt(D), summed over the hidden patches and divided by their
    count."""
    with torch.no_grad():
        layers = teacher.forward_intermediates(images, indices=top, output_fmt="NLC", intermediates_only=True)
        target = F.layer_norm(sum(layers) / top, (teacher.embed_dim,))
    x = student.patch_embed(images)
    x = torch.where(mask[..., None], mask_token, x)
    x = student.norm(student.blocks(student.norm_pre(student._pos_embed(x))))[:, student.num_prefix_tokens :]
    error = F.smooth_l1_loss(x, target, reduction="none", beta=beta).sum(-1) / math.sqrt(x.shape[-1])
    return (error * mask).sum() / mask.sum()


def test_data2vec_is_the_official_codes_loss_in_value_and_gradient():
    """A 2-block ViT with a teacher whose blocks differ from the student's, 3 images hiding 3 to 9 of 16 patches:
    solo's encode and loss against the official recipe written with timm's own forward, in value and in the
    gradient of the mask token and of a block's weight. Rejected: the last block alone as target (no average), and
    the paper's other normalisation (instance norm over the patches per block, then the mean)."""
    from solo.methods.data2vec import Data2Vec, Data2VecConfig

    cfg = Data2VecConfig(average_top_k_layers=2, min_mask_block=2, loss_beta=0.5)
    method = Data2Vec(_tiny_vit(0), 32, cfg).double()
    method.feeds_probe = False
    with torch.no_grad():  # a teacher some way from the student, as after training
        for p in method.target_encoder.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=_generator(1), dtype=p.dtype))
    g = _generator(2)
    images = torch.randn(3, 3, 16, 16, generator=g, dtype=torch.float64)
    mask = torch.zeros(3, 16, dtype=torch.bool)
    mask[0, [0, 1, 4]] = True
    mask[1, 5:11] = True
    mask[2, [2, 3, 6, 7, 8, 9, 12, 13, 15]] = True
    batch = {"views": [images], "mask": mask, "label": torch.zeros(3, dtype=torch.long)}
    got = method.batch_loss(method.encode(batch), batch)["loss"]

    teacher = copy.deepcopy(method.backbone)
    teacher.blocks = copy.deepcopy(method.target_encoder.blocks)
    want = _data2vec_code_loss(method.backbone, teacher, method.mask_token, images, mask, 2, 0.5)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    weight = method.backbone.blocks[0].attn.qkv.weight
    for a, b in zip(
        torch.autograd.grad(got, [method.mask_token, weight]), torch.autograd.grad(want, [method.mask_token, weight])
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=0)

    with torch.no_grad():
        layers = teacher.forward_intermediates(images, indices=2, output_fmt="NLC", intermediates_only=True)
        target = method.encode(batch)["target"]
        last_only = F.layer_norm(layers[-1], layers[-1].shape[-1:])
        instance = sum(F.instance_norm(layer.transpose(1, 2)).transpose(1, 2) for layer in layers) / 2
    for wrong in (last_only, instance):
        assert (wrong - target).abs().max() > 0.1


# --- SALT ------------------------------------------------------------------------------------------------------------


def test_salt_predicts_the_frozen_teachers_patch_tokens_with_l1_and_never_moves_the_teacher():
    """A 2-block student of width 32 and a frozen teacher of width 48 on the same 4 x 4 grid, 3 images with a context
    and 2 disjoint target blocks each: the targets are the teacher's patch tokens as timm's forward_features gives them
    (after its final norm, nothing more: stable-pretraining's SALT), the loss their mean absolute error to the
    predictions (its F.l1_loss over every target feature), the teacher gets no gradient and the optimizer step leaves
    it as it was. Rejected: I-JEPA's layer-normalised targets."""
    from timm.models.vision_transformer import VisionTransformer

    from solo.methods.distill import FrozenTeacher
    from solo.methods.salt import SALT, SALTConfig

    torch.manual_seed(1)
    encoder = VisionTransformer(img_size=16, patch_size=4, embed_dim=48, depth=2, num_heads=2, num_classes=0).double()
    with torch.no_grad():  # a final norm's scale and shift as after training: its output is no longer layer-normalised
        encoder.norm.weight.uniform_(0.5, 2.0)
        encoder.norm.bias.normal_()
    stats = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    teacher = FrozenTeacher(encoder, 48, "a test ViT", stats, stats)
    cfg = SALTConfig(predictor_embed_dim=16, predictor_depth=1, predictor_heads=2, min_context_patches=2)
    method = SALT(_tiny_vit(0), 32, cfg, teacher).double()
    method.feeds_probe = False
    images = torch.randn(3, 3, 16, 16, generator=_generator(5), dtype=torch.float64)
    masks = torch.zeros(3, 3, 16, dtype=torch.bool)  # (context, target 1, target 2) per image
    masks[:, 0, [0, 1, 2, 4, 5, 6, 8, 9]] = True
    masks[:, 1, [10, 11]] = True
    masks[:, 2, [12, 13, 14, 15]] = True
    masks[1, 1, 3] = True  # a target of 3 patches in one image: padding in the others'
    batch = {"views": [images], "mask": masks, "label": torch.zeros(3, dtype=torch.long)}
    encoded = method.encode(batch)
    loss = method.batch_loss(encoded, batch)["loss"]

    with torch.no_grad():
        tokens = encoder.forward_features(images)[:, 1:]
    predictions, targets = [], []
    for n in range(3):
        for block in (1, 2):
            at = masks[n, block].nonzero().flatten()
            predictions.append(encoded["prediction"][n, block - 1, : len(at)])
            targets.append(tokens[n, at])
    want = F.l1_loss(torch.cat(predictions), torch.cat(targets))
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(
        encoded["target"].flatten(0, 1)[encoded["valid"].flatten(0, 1)],
        torch.cat(targets),
        rtol=0,
        atol=1e-12,
    )
    normalised = F.layer_norm(torch.cat(targets), (48,))
    assert (normalised - torch.cat(targets)).abs().max() > 0.1

    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    loss.backward()
    assert all(p.grad is None for p in encoder.parameters())
    method.prepare_step(0, 10)
    method.after_optimizer_step()
    assert all(torch.equal(before[k], v) for k, v in encoder.state_dict().items())


# --- data2vec 2.0 ----------------------------------------------------------------------------------------------------


def _data2vec2_code_loss(student, teacher, convs, project, images, hidden, top, cls_loss):
    """fairseq's data2vec2.py (d2v_loss with loss_beta 0, make_targets with instance_norm_target_layer and
    layer_norm_targets, cls_loss) and Decoder2d, through timm's own ViT code: the teacher's feed-forward outputs caught
    by hooks on its MLP branch during its forward_features, instance-normalised (F.instance_norm), averaged over the
    last `top`, layer-normalised; the student on each mask's visible tokens, gathered as make_maskinfo does (argsort
    of the mask); the decoder's conv -> LayerNorm over channels via transposes -> GELU with a residual; the
    regression summed over the hidden patches and features, over 1 / sqrt(D), and `cls_loss` times the class term
    summed over rows, both divided by the hidden count (the sample size) and the class term multiplied by it."""
    branch = []
    hooks = [b.ls2.register_forward_hook(lambda m, i, o: branch.append(o)) for b in teacher.blocks]
    with torch.no_grad():
        teacher.forward_features(images)
        layers = [F.instance_norm(o[:, 1:].transpose(1, 2)).transpose(1, 2) for o in branch[-top:]]
        y = F.layer_norm(sum(layers) / top, (teacher.embed_dim,))
    for h in hooks:
        h.remove()
    clones = hidden.shape[1]
    mask = hidden.flatten(0, 1)
    x = student._pos_embed(student.patch_embed(images)).repeat_interleave(clones, 0)
    ids_shuffle = mask.to(torch.uint8).argsort(dim=1, stable=True)
    keep_count = int((~mask[0]).sum())
    ids_restore = ids_shuffle.argsort(dim=1)
    visible = torch.gather(x[:, 1:], 1, ids_shuffle[:, :keep_count, None].expand(-1, -1, x.shape[-1]))
    x = student.norm(student.blocks(torch.cat([x[:, :1], visible], 1)))
    filler = x.new_zeros(len(x), mask.shape[1] - keep_count, x.shape[-1])  # the official's noise of std 0.01
    grid = torch.gather(torch.cat([x[:, 1:], filler], 1), 1, ids_restore[..., None].expand(-1, -1, x.shape[-1]))
    z = grid.transpose(1, 2).reshape(len(x), -1, 4, 4)
    residual = z
    for conv in convs:
        z = F.gelu(F.layer_norm(conv(z).transpose(-3, -1), (conv.out_channels,)).transpose(-3, -1))
        if z.shape[1] == residual.shape[1]:
            z = z + residual
        residual = z
    prediction = project(z.reshape(len(x), z.shape[1], -1).transpose(1, 2))
    target = y.repeat_interleave(clones, 0)
    scale = 1 / math.sqrt(x.shape[-1])
    sample_size = int(mask.sum())
    regression = (F.mse_loss(prediction[mask], target[mask], reduction="none") * scale).sum()
    cls_target = y.mean(dim=1).repeat_interleave(clones, 0)
    cls = (F.mse_loss(x[:, 0], cls_target, reduction="none") * scale).sum() * (cls_loss * sample_size)
    return (regression + cls) / sample_size


def test_data2vec2_is_the_official_codes_loss_in_value_and_gradient():
    """A 2-block ViT with a teacher some way from the student, 2 images with 3 masks each hiding 12 of 16 patches:
    solo's encode and loss against fairseq's recipe written with timm's own forward, in value and in the gradient of
    a block's weight, the decoder's first convolution and the class token. The official class weight multiplies a sum
    over the GPU's rows: solo's mean over rows at class_weight = cls_loss x rows. Rejected: the blocks' end outputs as
    targets (data2vec's), and layer norm per block instead of instance norm."""
    from solo.methods.data2vec2 import Data2Vec2, Data2Vec2Config

    cfg = Data2Vec2Config(
        mask_ratio=0.75, average_top_k_layers=2, decoder_dim=16, decoder_layers=2, decoder_groups=4, class_weight=0.6
    )
    method = Data2Vec2(_tiny_vit(0), 32, cfg).double()
    method.feeds_probe = False
    with torch.no_grad():  # a teacher some way from the student, as after training
        for p in method.target_encoder.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=_generator(1), dtype=p.dtype))
    g = _generator(2)
    images = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)
    hidden = torch.stack([torch.randperm(16, generator=g) >= 4 for _ in range(6)]).reshape(2, 3, 16)
    batch = {"views": [images], "mask": hidden, "label": torch.zeros(2, dtype=torch.long)}
    got = method.batch_loss(method.encode(batch), batch)["loss"]

    teacher = copy.deepcopy(method.backbone)
    teacher.load_state_dict({k.replace(".block.", "."): v for k, v in method.target_encoder.state_dict().items()})
    d = method.decoder
    want = _data2vec2_code_loss(method.backbone, teacher, d.convs, d.project, images, hidden, 2, 0.6 / 6)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    params = [method.backbone.blocks[0].attn.qkv.weight, d.convs[0].weight, method.backbone.cls_token]
    for a, b in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * float(b.abs().max()))

    with torch.no_grad():
        target = method.targets(images)
        ends = teacher.forward_intermediates(images, indices=2, output_fmt="NLC", intermediates_only=True)
        end_outputs = F.layer_norm(sum(F.instance_norm(e.transpose(1, 2)).transpose(1, 2) for e in ends) / 2, (32,))
        branch = []
        hooks = [b.ls2.register_forward_hook(lambda m, i, o: branch.append(o[:, 1:])) for b in teacher.blocks]
        teacher.forward_features(images)
        for h in hooks:
            h.remove()
        per_block_ln = F.layer_norm(sum(F.layer_norm(o, (32,)) for o in branch) / 2, (32,))
    for wrong in (end_outputs, per_block_ln):
        assert (wrong - target).abs().max() > 0.1


def test_data2vec2_masks_show_blocks_and_hide_as_many_in_every_mask():
    """ImageNet's 14 x 14 grid at the paper's settings (80% hidden, 3 x 3 blocks, adjust 0.07): int(196 x 0.2) = 39
    visible in each of 16 masks, the masks differ, and the visible patches cluster: most have a visible neighbour
    among the 4 (about 1 in 5 would by chance). Drawn again from the same generator state, the same masks."""
    generator = Data2Vec2Masks((14, 14), 0.8, 3, 0.07, 16)
    masks = generator(random.Random(0))
    assert masks.shape == (16, 196) and masks.dtype == torch.bool
    assert ((~masks).sum(dim=1) == 39).all() and generator.visible == 39
    assert len({tuple(m.tolist()) for m in masks}) == 16
    shown = F.pad((~masks).reshape(16, 1, 14, 14).double(), (1, 1, 1, 1))
    neighbours = shown[..., :-2, 1:-1] + shown[..., 2:, 1:-1] + shown[..., 1:-1, :-2] + shown[..., 1:-1, 2:]
    with_neighbour = ((neighbours > 0) & (shown[..., 1:-1, 1:-1] > 0)).sum() / (~masks).sum()
    assert with_neighbour > 0.6
    assert torch.equal(generator(random.Random(0)), masks)


# --- MaskFeat --------------------------------------------------------------------------------------------------------


def _hog_by_hand(image, patch, cell, bins, gx_first=True):
    """HOG of one (C, H, W) image pixel by pixel, as SlowFast's HOGLayerC: the 3 x 3 Sobel kernels [[1, 0, -1], [2, 0,
    -2], [1, 0, -1]] (x) and its transpose (y) on the image padded by reflection; each pixel's magnitude added to bin
    floor(atan2(gx, gy) / pi x bins) mod bins; cells of `cell` px summed, each cell's histogram divided by its L2 norm;
    per patch, the values ordered (channel, bin, cell row, cell column)."""
    c, h, w = image.shape

    def pixel(ch, i, j):  # reflection padding: index -1 is 1, index h is h - 2
        i = -i if i < 0 else (2 * (h - 1) - i if i >= h else i)
        j = -j if j < 0 else (2 * (w - 1) - j if j >= w else j)
        return float(image[ch, i, j])

    sobel = [[1, 0, -1], [2, 0, -2], [1, 0, -1]]
    hist = [[[[0.0] * bins for _ in range(w // cell)] for _ in range(h // cell)] for _ in range(c)]
    for ch in range(c):
        for i in range(h):
            for j in range(w):
                gx = sum(sobel[a][b] * pixel(ch, i + a - 1, j + b - 1) for a in range(3) for b in range(3))
                gy = sum(sobel[b][a] * pixel(ch, i + a - 1, j + b - 1) for a in range(3) for b in range(3))
                angle = math.atan2(gx, gy) if gx_first else math.atan2(gy, gx)
                hist[ch][i // cell][j // cell][math.floor(angle / math.pi * bins) % bins] += math.hypot(gx, gy)
    for ch in range(c):
        for row in hist[ch]:
            for k, values in enumerate(row):
                norm = math.sqrt(sum(v * v for v in values)) or 1.0
                row[k] = [v / norm for v in values]
    per = patch // cell
    return torch.tensor(
        [
            [
                hist[ch][pi * per + ci][pj * per + cj][bin_]
                for ch in range(c)
                for bin_ in range(bins)
                for ci in range(per)
                for cj in range(per)
            ]
            for pi in range(h // patch)
            for pj in range(w // patch)
        ],
        dtype=torch.float64,
    )


def test_maskfeat_targets_are_the_official_hog_per_patch():
    """2 images of 8 x 8 px, 3 channels, 4 px patches in 2 px cells, 9 bins: hog_patches against the pixel-by-pixel
    HOG above, to 1e-12. Rejected: the usual atan2(gy, gx) (signed y over x), which puts the votes in other bins."""
    from solo.methods.maskfeat import hog_patches

    images = torch.randn(2, 3, 8, 8, generator=_generator(21), dtype=torch.float64)
    got = hog_patches(images, patch=4, cell=2, bins=9)
    assert got.shape == (2, 4, 3 * 9 * 4)
    for n in range(2):
        torch.testing.assert_close(got[n], _hog_by_hand(images[n], 4, 2, 9), rtol=0, atol=1e-12)
    swapped = _hog_by_hand(images[0], 4, 2, 9, gx_first=False)
    assert (got[0] - swapped).abs().max() > 0.1


def test_maskfeat_loss_is_the_squared_error_on_the_hidden_patches_hog():
    """MaskFeat's loss on a tiny ViT: the mean over every hidden patch and HOG value of (prediction - HOG)^2, the
    prediction the linear head on the encoder's patch tokens, the target hog_patches of the image (a changed visible
    pixel changes the target of its patch only)."""
    from solo.methods.maskfeat import MaskFeat, MaskFeatConfig, hog_patches

    method = MaskFeat(_tiny_vit(0), 32, MaskFeatConfig(min_mask_block=2, hog_cell=2)).double()
    method.feeds_probe = False
    images = torch.randn(3, 3, 16, 16, generator=_generator(22), dtype=torch.float64)
    mask = torch.zeros(3, 16, dtype=torch.bool)
    mask[0, [1, 2]] = True
    mask[1, 4:10] = True
    mask[2, [0, 15]] = True
    batch = {"views": [images], "mask": mask, "label": torch.zeros(3, dtype=torch.long)}
    got = method.batch_loss(method.encode(batch), batch)["loss"]
    prediction = method.predict(batch)
    target = hog_patches(images, 4, 2)
    want = ((prediction - target) ** 2)[mask].mean()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    per_image = torch.stack([((prediction[i] - target[i]) ** 2)[mask[i]].mean() for i in range(3)]).mean()
    assert abs(per_image.item() - want.item()) > 1e-3 * want.item()


# --- BEiT ------------------------------------------------------------------------------------------------------------


def _beit_case():
    """A BEiT on the tiny ViT (2 blocks, 4 x 4 patches of 4 px), 16 tokens; 3 images hiding 2, 6 and 3 patches."""
    from solo.methods.beit import BEiT, BEiTConfig

    method = BEiT(_tiny_vit(9), 32, BEiTConfig(min_mask_block=2, vocab_size=16)).double()
    method.feeds_probe = False
    with torch.no_grad():  # logits far from uniform, so that the images' errors differ
        method.head.weight.mul_(100)
    images = torch.randn(3, 3, 16, 16, generator=_generator(23), dtype=torch.float64)
    mask = torch.zeros(3, 16, dtype=torch.bool)
    mask[0, [1, 2]] = True
    mask[1, 4:10] = True
    mask[2, [0, 5, 15]] = True
    return method, {"views": [images], "mask": mask, "label": torch.zeros(3, dtype=torch.long)}


def _official_beit_loss(method, batch):
    """microsoft/unilm beit modeling_pretrain.py and engine_for_pretraining.py, per image: the patch embeddings, the
    hidden ones replaced by the mask token (x * (1 - w) + mask_token * w), the class token, the positions, the blocks,
    the final norm, lm_head on the hidden patches; nn.CrossEntropyLoss over them against their tokens. Each token
    written out: the index of the largest dot product of the patch's pixels (rows, columns, then channels) with the
    tokenizer's directions."""
    vit, directions = method.backbone, method.tokenizer.directions
    images, masks = batch["views"][0], batch["mask"]
    errors = []
    for image, hidden in zip(images, masks):
        w = hidden[:, None].double()
        x = vit.patch_embed(image[None])[0] * (1 - w) + method.mask_token * w
        x = torch.cat([vit.cls_token[0], x]) + vit.pos_embed[0]
        for block in vit.blocks:
            x = block(x[None])[0]
        logits = method.head(vit.norm(x)[1:][hidden])
        tokens = []
        for at in hidden.nonzero().flatten().tolist():
            row, column = divmod(at, 4)
            pixels = image[:, 4 * row : 4 * row + 4, 4 * column : 4 * column + 4].permute(1, 2, 0).reshape(-1)
            tokens.append(int((pixels @ directions).argmax()))
        errors.append(F.cross_entropy(logits, torch.tensor(tokens), reduction="none"))
    return torch.cat(errors).mean(), errors


def test_beit_is_the_official_model_and_loss_in_value_and_gradient():
    """Against the official model and loss written out image by image. Told apart: each image's mean, then their
    mean (the samples weigh alike whatever they hide)."""
    method, batch = _beit_case()
    got = method(batch)["loss"]
    want, errors = _official_beit_loss(method, batch)
    params = [method.backbone.blocks[0].attn.qkv.weight, method.mask_token, method.head.weight]
    _assert_same_value_and_gradient(got, want, params, rel=1e-10)
    per_image = torch.stack([e.mean() for e in errors]).mean()
    assert abs(per_image.item() - got.item()) > 1e-3 * got.item()


def test_beit_tokens_are_the_same_in_every_process_and_any_batch_and_read_a_patchs_direction():
    """Two tokenizers built apart (two ranks) give the same tokens; an image's tokens do not depend on its batch; a
    patch scaled by a positive factor keeps its token, and a changed patch changes its own token only."""
    from solo.methods.beit import PixelTokenizer

    images = torch.randn(4, 3, 16, 16, generator=_generator(24))
    a, b = PixelTokenizer(48, 64, 4), PixelTokenizer(48, 64, 4)
    tokens = a(images)
    assert torch.equal(tokens, b(images)) and torch.equal(a(images[2:3])[0], tokens[2])
    assert len(tokens.unique()) > 20  # the 64 patches spread over the vocabulary
    changed = images.clone()
    changed[:, :, :4, :4] *= 3.0
    assert torch.equal(a(changed), tokens)
    changed[:, :, :4, :4] = torch.randn(4, 3, 4, 4, generator=_generator(25))
    moved = a(changed) != tokens
    assert moved[:, 0].any() and not moved[:, 1:].any()


# --- AIM -------------------------------------------------------------------------------------------------------------


def _aim_paper_loss(outputs, patches, prefix):
    """For each image with prefix length K, each patch j >= K against the output at position j - 1 (the next patch in
    raster order), the squared error averaged over its pixels; the mean over every such patch of the batch."""
    errors = [
        sum((outputs[b, j - 1, k] - patches[b, j, k]) ** 2 for k in range(patches.shape[2])) / patches.shape[2]
        for b, length in enumerate(prefix)
        for j in range(length, patches.shape[1])
    ]
    return sum(errors) / len(errors)


def test_aim_is_the_next_patch_error_after_the_prefix_in_value_and_gradient():
    """3 images of 6 patches of 4 values with prefixes of 1, 3 and 5: solo's loss against the per-patch sum, in
    value and gradient. Rejected: each image's mean, then their mean, and each output against its own patch (no
    shift)."""
    g = _generator(13)
    patches = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    outputs = torch.randn(3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    prefix = [1, 3, 5]
    predicted = torch.arange(6) >= torch.tensor(prefix)[:, None]
    got, want = next_patch_mse(outputs, patches, predicted), _aim_paper_loss(outputs, patches, prefix)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(got, outputs)[0], torch.autograd.grad(want, outputs)[0], rtol=1e-10, atol=0
    )

    o, p = outputs.detach(), patches
    per_image = sum(_aim_paper_loss(o[b : b + 1], p[b : b + 1], prefix[b : b + 1]) for b in range(3)) / 3
    unshifted = masked_patch_mse(o, p, predicted)
    for wrong in (per_image, unshifted):
        assert abs(got.item() - wrong.item()) > 1e-2 * got.item()


def test_aim_prefixes_are_uniform_over_one_to_all_but_one():
    random.seed(0)
    lengths = [int((~PrefixMask(6)()).sum()) for _ in range(300)]
    assert set(lengths) == {1, 2, 3, 4, 5}
    masks = [PrefixMask(6)() for _ in range(20)]
    assert all(torch.equal(m, torch.arange(6) >= int((~m).sum())) for m in masks), "the prefix comes first"


def test_aim_attention_is_bidirectional_in_the_prefix_and_causal_after():
    """Each patch of each image changed in turn: the outputs that change are exactly those of the positions that
    may see it, every position for a prefix patch (a causal mask would leave the earlier prefix positions alone),
    the patch's own and later positions for the others (bidirectional attention would change every output)."""
    method = AIM(_tiny_vit(1), 32, AIMConfig(head_width=16, head_depth=1)).double()
    method.feeds_probe = False
    g = _generator(14)
    images = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)
    prefix = [3, 10]
    predicted = torch.arange(16) >= torch.tensor(prefix)[:, None]

    def predict(x):
        return method.encode({"views": [x], "mask": predicted})["prediction"]

    before = predict(images)
    for b, length in enumerate(prefix):
        for patch in range(16):
            changed = images.clone()
            row, col = divmod(patch, 4)
            changed[b, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] += 1.0
            moved = (predict(changed)[b] - before[b]).abs().amax(dim=-1) > 0
            sees = [patch < length or patch <= i for i in range(16)]
            assert moved.tolist() == sees, (b, patch)
            assert torch.equal(predict(changed)[1 - b], before[1 - b])


# --- NEPA ------------------------------------------------------------------------------------------------------------


def _nepa_paper_loss(outputs, embeddings):
    """The paper's Dist (Xu et al., 2025, its pseudo-code): the embeddings detached, the outputs without their last
    position and the embeddings without their first, both L2-normalised, the negative mean of their dot products."""
    prediction, target = outputs[:, :-1], embeddings.detach()[:, 1:]
    prediction = prediction / prediction.norm(dim=-1, keepdim=True)
    target = target / target.norm(dim=-1, keepdim=True)
    return -(prediction * target).sum(dim=-1).mean()


def test_nepa_is_the_negative_cosine_to_the_next_embedding_in_value_and_gradient():
    """3 images of 5 positions of 4 values: solo's loss against the paper's, in value and gradient; the embeddings take
    none. Rejected: each output against its own embedding (no shift), and targets that pass a gradient."""
    g = _generator(15)
    outputs = torch.randn(3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    embeddings = torch.randn(3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    got, want = next_embedding_loss(outputs, embeddings), _nepa_paper_loss(outputs, embeddings)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    grads = torch.autograd.grad(got, [outputs, embeddings], allow_unused=True)
    torch.testing.assert_close(grads[0], torch.autograd.grad(want, outputs)[0], rtol=1e-10, atol=0)
    assert grads[1] is None or not grads[1].any(), "the targets take no gradient"

    unshifted = -F.cosine_similarity(outputs, embeddings, dim=-1).mean()
    assert abs(got.item() - unshifted.item()) > 1e-2
    through_targets = -F.cosine_similarity(outputs[:, :-1], embeddings[:, 1:], dim=-1).mean()
    assert torch.autograd.grad(through_targets, embeddings)[0].abs().max() > 1e-2


def test_nepa_attention_is_causal_and_the_class_token_predicts_the_first_patch():
    """As the authors' ViTNepaForPreTraining shifts its whole sequence (the class token, then the patches): row 0 of
    the outputs is the class token's, which under causal attention sees only itself (the same for every image) and
    predicts the first patch; each patch of an image changed in turn changes the outputs of its own and the later
    positions only (bidirectional attention would change every one); the targets are the patch embedding layer's
    output on the image, without the position embeddings. Rejected: the outputs of the patches alone (the class
    token's prediction dropped), a loss over N - 1 predictions that differs."""
    vit = _tiny_vit(2)
    method = NEPA(vit, 32, NEPAConfig()).double()
    method.feeds_probe = False
    g = _generator(16)
    images = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)

    def encode(x):
        return method.encode({"views": [x]})

    before = encode(images)
    assert before["outputs"].shape[1] == before["embeddings"].shape[1] == 17
    torch.testing.assert_close(before["embeddings"][:, 1:], vit.patch_embed(images), rtol=0, atol=0)
    torch.testing.assert_close(before["outputs"][0, 0], before["outputs"][1, 0], rtol=0, atol=0)
    for patch in range(16):
        changed = images.clone()
        row, col = divmod(patch, 4)
        changed[0, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] += 1.0
        after = encode(changed)["outputs"]
        moved = (after[0] - before["outputs"][0]).abs().amax(dim=-1) > 0
        assert moved.tolist() == [False] + [i >= patch for i in range(16)], patch
        assert torch.equal(after[1], before["outputs"][1])

    loss = method.batch_loss(before, {"label": None})["loss"]
    official = _nepa_paper_loss(before["outputs"], before["embeddings"])  # the class token's output counted
    assert loss.item() == pytest.approx(official.item(), rel=1e-12)
    patches_only = _nepa_paper_loss(before["outputs"][:, 1:], before["embeddings"][:, 1:])
    assert abs(loss.item() - patches_only.item()) > 1e-4


def test_nepa_probes_read_the_middle_block_as_timm_s_intermediate_features():
    """NEPA's last blocks become the next embedding's prediction, so its probes read the middle of the trunk: the
    online probe's features (`encode`) and the backbone's own forward (what the evaluator's k-NN and main_linear.py
    call) are the mean patch token after the first half of the blocks and the final norm, as timm's
    forward_intermediates gives it. The loss still runs every block; the last block's mean patch token, what the other
    methods' probes read, differs."""
    vit = _tiny_vit(3)
    method = NEPA(vit, 32, NEPAConfig()).double()
    method.feeds_probe = True
    images = torch.randn(3, 3, 16, 16, generator=_generator(17), dtype=torch.float64)

    def intermediate(block):
        tokens = vit.forward_intermediates(images, [block], norm=True, output_fmt="NLC", intermediates_only=True)
        return tokens[0].mean(dim=1)  # the patch tokens (timm leaves the prefix out)

    encoded = method.encode({"views": [images], "probe_image": images})
    with torch.no_grad():
        torch.testing.assert_close(encoded["features"], intermediate(0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(vit(images), intermediate(0), rtol=1e-12, atol=1e-12)
        assert (vit(images) - intermediate(1)).abs().max() > 1e-3
        assert vit(images[:0]).shape == (0, 32)  # a rank without images this step
    loss = method.batch_loss(encoded, {"label": None})["loss"]
    names, parameters = zip(*vit.named_parameters())
    grads = torch.autograd.grad(loss, parameters, allow_unused=True)
    assert any(n.startswith("blocks.1.") and g is not None for n, g in zip(names, grads))


def test_paka_views_pair_each_local_crop_with_its_global_crops_cells_in_the_images_orientation():
    """DINOv2's `method.paka_locals` (LightlyTrain's DINOv3.1 views): each local crop's student tokens, put in the
    image's orientation, against the EMA teacher's tokens of the clean render of the global crop it lies inside,
    resampled over the local's box onto its grid. With hand-made boxes on a 4 x 4 grid: a local crop on the top-left
    quarter of an unmirrored global crop takes that crop's top-left 2 x 2 cells; a mirrored local crop on the
    bottom-right quarter of a mirrored global crop takes, once both are put back, the global map's bottom rows'
    left cells, and its own tokens mirrored. Rejected: the mirrored global crop's cells taken as they lie."""
    from timm.models.vision_transformer import VisionTransformer

    from solo.methods.dinov2 import DINOv2, DINOv2Config

    torch.manual_seed(5)  # _tiny_vit's, at any image size (the local crops are 8 px)
    vit = VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0, dynamic_img_size=True
    ).double()
    cfg = DINOv2Config(proj_hidden_dim=16, bottleneck_dim=8, num_prototypes=16, paka_weight=1.0, paka_locals=2)
    method = DINOv2(vit, 32, cfg).double()
    g = _generator(23)
    clean = [torch.randn(3, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    local = [torch.randn(3, 3, 8, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    boxes = torch.tensor(
        [[0, 0, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0.5, 0.5, 0], [0.5, 0.5, 0.5, 0.5, 1]], dtype=torch.float64
    ).expand(3, -1, -1)
    students, teachers = method.paka_tokens(clean + local, {"view_boxes": boxes})

    def grid(model, x, side):  # (B, side, side, D): timm's tokens after the class token, row-major
        return model.forward_features(x)[:, 1:].unflatten(1, (side, side))

    with torch.no_grad():
        parents = [grid(method.teacher[0], x, 4) for x in clean]
        own = [grid(vit, x, 2) for x in local]
    want_teachers = [parents[0][:, :2, :2], parents[1].flip(2)[:, 2:, 2:]]
    want_students = [own[0], own[1].flip(2)]
    for got, want in zip(teachers + students, want_teachers + want_students):
        torch.testing.assert_close(got, want.flatten(1, 2), rtol=1e-12, atol=1e-12)
    as_they_lie = parents[1][:, 2:, 2:].flatten(1, 2)
    assert (teachers[1] - as_they_lie).abs().max() > 1e-3


# --- VICRegL ---------------------------------------------------------------------------------------------------------


def _authors_nearest(input_maps, candidate_maps, distances, num_matches):
    """facebookresearch/VICRegL's neirest_neighbores: each input cell's nearest candidate, the num_matches input cells
    nearest to theirs kept (a mask from the ranks of the sorted distances), in cell order."""
    batch = input_maps.size(0)
    num_matches = input_maps.size(1) if num_matches is None else num_matches
    values, nearest = distances.topk(k=1, largest=False)
    values, nearest = values.squeeze(-1), nearest.squeeze(-1)
    ranks = torch.sort(torch.sort(values, dim=1).indices, dim=1).indices
    mask = ranks < num_matches
    chosen = nearest.masked_select(mask).reshape(batch, num_matches)
    inputs = torch.arange(values.size(1)).repeat(batch, 1).masked_select(mask).reshape(batch, num_matches)
    pick = lambda maps, index: torch.gather(maps, 1, index[:, :, None].expand(-1, -1, maps.size(2)))  # noqa: E731
    return pick(input_maps, inputs), pick(candidate_maps, chosen)


def _authors_local_vicreg(x, y, inv, var, cov):
    """Their _vicreg_loss on (B, K, C) matched cells, one process (gather_center: the batch mean removed)."""
    repr_loss = inv * F.mse_loss(x, y)
    x, y = x - x.mean(dim=0), y - y.mean(dim=0)
    std_x, std_y = torch.sqrt(x.var(dim=0) + 1e-4), torch.sqrt(y.var(dim=0) + 1e-4)
    std_loss = var * (F.relu(1 - std_x).mean() / 2 + F.relu(1 - std_y).mean() / 2)
    x, y = x.permute(1, 0, 2), y.permute(1, 0, 2)
    n, c = x.shape[1:]
    off = ~torch.eye(c, dtype=torch.bool)
    x, y = x - x.mean(dim=-2, keepdim=True), y - y.mean(dim=-2, keepdim=True)
    cov_x, cov_y = (torch.einsum("...nc,...nd->...cd", t, t) / (n - 1) for t in (x, y))
    cov_loss = (cov_x[..., off].pow(2).sum(-1) / c) / 2 + (cov_y[..., off].pow(2).sum(-1) / c) / 2
    return repr_loss, std_loss, cov * cov_loss.mean()


def _authors_vicregl(embeddings, maps, locations, alpha, num_matches, inv=25.0, var=25.0, cov=1.0):
    """main_vicregl.py's forward for two views, one process, l2_all_matches=1, local_loss ACCUMULATING over the
    ordered pairs (its loop as the paper describes it; the released loop assigns, keeping the last pair alone)."""
    e1, e2 = embeddings
    global_inv = inv * (F.mse_loss(e1, e2) + F.mse_loss(e2, e1)) / 2
    global_var = global_cov = 0.0
    for e in embeddings:
        x = e - e.mean(dim=0)
        global_var = global_var + F.relu(1 - torch.sqrt(x.var(dim=0) + 1e-4)).mean()
        c = x.T @ x / (x.size(0) - 1)
        global_cov = global_cov + (c - torch.diag(torch.diagonal(c))).pow(2).sum() / e.shape[1]
    global_loss = global_inv + var * global_var / 2 + cov * global_cov / 2

    def local_pair(m1, m2, l1, l2):
        total = 0.0
        for (a, b), (k1, k2) in (
            ((torch.cdist(m1, m2), torch.cdist(m2, m1)), (None, None)),
            ((torch.cdist(l1, l2), torch.cdist(l2, l1)), num_matches),
        ):
            one, two = _authors_nearest(m1, m2, a, k1), _authors_nearest(m2, m1, b, k2)
            total = total + sum(sum(_authors_local_vicreg(*p, inv, var, cov)) / 2 for p in (one, two))
        return total

    (m1, m2), (l1, l2) = maps, locations
    local_loss = (local_pair(m1, m2, l1, l2) + local_pair(m2, m1, l2, l1)) / 2
    return alpha * global_loss + (1 - alpha) * local_loss


def _vicregl_case(seed=21, n=9, cells=4, c=3, d=5):
    g = _generator(seed)
    z = [torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_() for _ in "12"]
    maps = [torch.randn(n, cells, c, generator=g, dtype=torch.float64).requires_grad_() for _ in "12"]
    locations = [torch.rand(n, cells, 2, generator=g, dtype=torch.float64) for _ in "12"]
    return z, maps, locations


def test_vicregl_is_the_authors_loss_in_value_and_gradient():
    """Against main_vicregl.py's global and local terms, matching included, in value and gradient, with unequal
    location matches (3 and 2 of 4 cells). Told apart: VICReg's summed covariance term (lightly's VICRegLLoss halves
    nu for it, as here) and the local terms' statistics over all cells at once instead of per matched slot."""
    z, maps, locations = _vicregl_case()
    params = dict(alpha=0.75, num_matches=(3, 2))
    got = vicregl_loss(*z, *maps, *locations, **params)
    want = _authors_vicregl(z, maps, locations, **params)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    inputs = (*z, *maps)
    for a, b in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    with torch.no_grad():
        global_only = vicregl_loss(*z, *maps, *locations, alpha=1.0, num_matches=(3, 2))
        vicregs = vicreg_loss(*z)  # VICReg's own loss: the two covariance terms summed
        pooled_cells = vicregl_loss(*z, *(m.reshape(9, 1, -1).repeat(1, 4, 1) for m in maps), *locations, **params)
    assert abs(vicregs - global_only) > 1e-3 * global_only
    assert abs(pooled_cells - got) > 1e-2 * abs(got)


def test_vicregl_location_matching_pairs_the_cells_that_show_the_same_place():
    """Two views of one image, the second the first's mirror: location matching pairs cell (r, c) with (r, w - 1 - c)
    (cell_centres from the views' boxes), so local embeddings that are the mirrored map give no local invariance."""
    boxes = torch.tensor([[0.1, 0.2, 0.6, 0.6, 0.0], [0.1, 0.2, 0.6, 0.6, 1.0]])
    c1, c2 = (cell_centres(b[None], 2, 3) for b in boxes)
    torch.testing.assert_close(c1[0, 0], torch.tensor([0.1 + 0.15, 0.2 + 0.1], dtype=torch.float64))
    torch.testing.assert_close(c2.view(2, 3, 2).flip(1), c1.view(2, 3, 2))
    kept, match = nearest_matches(torch.cdist(c1, c2), None)
    assert match[0].tolist() == [2, 1, 0, 5, 4, 3] and kept[0].tolist() == list(range(6))


# --- MSN and PMSN ----------------------------------------------------------------------------------------------------


def _authors_msn(anchors, target, prototypes, tau, sharpen_t, prior=None):
    """facebookresearch/msn src/losses.py as its training loop calls it (one process): soft nearest neighbours on
    normalised rows and prototypes (identity labels), targets p ** (1 / T) renormalised and balanced by its
    distributed_sinkhorn (3 iterations, from the sharpened probabilities), the cross-entropy mean over the anchor rows
    (its views stacked), and me-max -sum(log(avg ** -avg)) + log K; with `prior`, lightly's PMSN regulariser
    F.kl_div(avg.log(), prior, reduction="sum")."""
    protos = prototypes / prototypes.norm(dim=1, keepdim=True)

    def snn(x):
        return torch.softmax((x / x.norm(dim=1, keepdim=True)) @ protos.T / tau, dim=1)

    probs = snn(torch.cat(anchors))
    with torch.no_grad():
        sharp = snn(target) ** (1.0 / sharpen_t)
        q = (sharp / sharp.sum(dim=1, keepdim=True)).T
        b, k = q.shape[1], q.shape[0]
        q = q / q.sum()
        for _ in range(3):
            q = q / q.sum(dim=1, keepdim=True) / k
            q = q / q.sum(dim=0, keepdim=True) / b
        targets = (q * b).T.repeat(len(anchors), 1)
    loss = torch.mean(torch.sum(torch.log(probs ** (-targets)), dim=1))
    avg = probs.mean(dim=0)
    if prior is None:
        return loss - torch.sum(torch.log(avg ** (-avg))) + math.log(len(avg))
    return loss + F.kl_div(avg.log(), prior, reduction="sum")


@pytest.mark.parametrize("pmsn", [False, True], ids=["msn", "pmsn"])
def test_msn_is_the_authors_loss_and_pmsn_lightlys_prior_matching_in_value_and_gradient(pmsn):
    """Three anchor views of 7 samples (the masked crop and two focal ones), 5 prototypes in 6 dimensions, the papers'
    temperatures: solo's msn_loss against the authors' code (MSN) and lightly's PMSN regulariser with a prior written
    here (k ** -0.25, normalised), in value and in the gradient of the anchors and the prototypes. Rejected: the
    other direction of the KL divergence, and Sinkhorn-Knopp started from exp(logits / sharpen) without the sharpened
    probabilities' per-sample normalisation (what SwAV's codes start from)."""
    from solo.losses import msn_loss, power_law_prior, prototype_logits, sinkhorn

    g = _generator(11)
    base = torch.randn(7, 6, generator=g, dtype=torch.float64)
    anchors = [(base + 0.7 * torch.randn(7, 6, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(3)]
    target = base + 0.3 * torch.randn(7, 6, generator=g, dtype=torch.float64)
    prototypes = torch.randn(5, 6, generator=g, dtype=torch.float64).requires_grad_()
    shares = torch.tensor([k**-0.25 for k in range(1, 6)], dtype=torch.float64)
    prior = shares / shares.sum() if pmsn else None
    if pmsn:
        torch.testing.assert_close(power_law_prior(5, 0.25), prior, rtol=1e-14, atol=0)

    got = msn_loss(anchors, target, prototypes, 0.1, 0.25, 3, 1.0, prior)
    want = _authors_msn(anchors, target, prototypes, 0.1, 0.25, prior)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    inputs = [*anchors, prototypes]
    for a, b in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    with torch.no_grad():
        value = got.item()
        if pmsn:
            probs = torch.cat([torch.softmax(prototype_logits(a, prototypes, 0.1), dim=1) for a in anchors])
            avg = probs.mean(dim=0)
            reverse = value - F.kl_div(avg.log(), prior, reduction="sum").item() + (avg * (avg / prior).log()).sum()
            assert abs(value - reverse.item()) > 1e-3 * abs(value)
        logits = prototype_logits(target, prototypes, 0.1)
        swav_start = sinkhorn(logits / 0.25, 1.0, 3)  # from exp(logits / sharpen), rows not normalised
        authors_start = sinkhorn(F.log_softmax(logits / 0.25, dim=1), 1.0, 3)
        assert (swav_start - authors_start).abs().max() > 1e-3


# --- CAPI ------------------------------------------------------------------------------------------------------------


def _official_sinkhorn(scores, temperature, iterations=3, epsilon=1e-8):
    """facebookresearch/capi's Sinkhorn-Knopp on one (tokens, K) matrix: exp(scores / temperature) with each
    prototype's largest moved to exp(50), then alternately every prototype's column divided by its sum plus epsilon
    and every token's row by its sum plus epsilon."""
    q = scores.detach() / temperature
    q = torch.exp(q - q.max(dim=0, keepdim=True).values + 50)
    for _ in range(iterations):
        q = q / (q.sum(dim=0, keepdim=True) + epsilon)
        q = q / (q.sum(dim=1, keepdim=True) + epsilon)
    return q


def _paper_capi(student, scores, predicted, positionwise):
    """CAPI's two losses, written from the paper's equations token by token: targets Q from the official Sinkhorn-Knopp (per
    position over the images, or over every token at once); the clustering loss, the mean over every token of
    -sum_k Q log softmax(scores / 0.12); the prediction loss, the mean over every predicted patch of -sum_k Q log
    softmax(student / 0.12). `student`: (n, P, K) the predictor's scores at every position; `predicted`: (n, P)."""
    n, p, k = scores.shape
    if positionwise:
        targets = torch.stack([_official_sinkhorn(scores[:, j], 0.06) for j in range(p)], dim=1)
    else:
        targets = _official_sinkhorn(scores.reshape(n * p, k), 0.06).reshape(n, p, k)
    clustering, prediction = [], []
    for i in range(n):
        for j in range(p):
            clustering.append(-(targets[i, j] * torch.log_softmax(scores[i, j] / 0.12, dim=0)).sum())
            if predicted[i, j]:
                prediction.append(-(targets[i, j] * torch.log_softmax(student[i, j] / 0.12, dim=0)).sum())
    return sum(prediction) / len(prediction), sum(clustering) / len(clustering)


@pytest.mark.parametrize("positionwise", [True, False])
def test_capi_is_the_papers_clustering_and_prediction_loss_in_value_and_gradient(positionwise):
    """6 images of 4 patch positions, 5 prototypes, 2 predicted patches per image: solo's losses against the paper's
    equations, in value and gradient (the student's scores get the prediction loss's, the clustering head's scores
    the clustering loss's; the targets carry none). Rejected: the teacher's softmax as targets (no Sinkhorn-Knopp),
    and Sinkhorn-Knopp over the other grouping of the tokens (per position against over all)."""
    g = _generator(31)
    scores = (2 * torch.randn(6, 4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    student = torch.randn(6, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    predict_at = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(6)])
    predicted = torch.zeros(6, 4, dtype=torch.bool).scatter(1, predict_at, True)

    targets, clustering = capi_clustering(scores, 0.06, 0.12, 3, positionwise)
    prediction = capi_loss(take(student, predict_at), take(targets, predict_at), 0.12)
    want_prediction, want_clustering = _paper_capi(student, scores, predicted, positionwise)
    assert prediction.item() == pytest.approx(want_prediction.item(), rel=1e-12)
    assert clustering.item() == pytest.approx(want_clustering.item(), rel=1e-12)
    for got, want in ((prediction, want_prediction), (clustering, want_clustering)):
        for x in (student, scores):
            a = torch.autograd.grad(got, x, retain_graph=True, allow_unused=True)[0]
            b = torch.autograd.grad(want, x, retain_graph=True, allow_unused=True)[0]
            assert (a is None) == (b is None or not b.any())
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    with torch.no_grad():
        softmax_targets = F.softmax(scores / 0.06, dim=-1)
        other_grouping, _ = _paper_capi(student, scores, predicted, not positionwise)
        for wrong in (capi_loss(take(student, predict_at), take(softmax_targets, predict_at), 0.12), other_grouping):
            assert abs(prediction.item() - wrong.item()) > 1e-3 * prediction.item()


def test_capi_sinkhorn_keeps_the_official_epsilon_which_moves_the_targets_at_its_temperature():
    """64 tokens of width 8, 16 prototypes, the clustering head's scores (L2-normalised tokens times a N(0, 1) layer):
    solo's targets are the official code's; without its epsilon (SwAV's form, which solo used before), a token that
    every prototype scores far below its best is scaled to a whole row, and the targets move by more than 0.01."""
    g = _generator(7)
    tokens = F.normalize(torch.randn(64, 8, generator=g, dtype=torch.float64), dim=1)
    scores = tokens @ torch.randn(8, 16, generator=g, dtype=torch.float64)
    official = _official_sinkhorn(scores, 0.06)
    torch.testing.assert_close(capi_sinkhorn(scores, 0.06, 3), official, rtol=1e-12, atol=1e-300)
    assert (official - _official_sinkhorn(scores, 0.06, epsilon=0.0)).abs().max() > 1e-2


def _is_rolled_block(visible: torch.Tensor, count: int) -> bool:
    """Whether the True patches of a (H, W) grid are, after some roll, the first `count` of a rectangle in raster
    order."""
    height, width = visible.shape
    blocks = set()
    for h, w in ((h, w) for h in range(1, height + 1) for w in range(1, width + 1) if h * w >= count):
        for top, left in ((t, c) for t in range(height - h + 1) for c in range(width - w + 1)):
            rows = [r * width + c for r in range(top, top + h) for c in range(left, left + w)]
            blocks.add(frozenset(rows[:count]))
    return any(
        frozenset(visible.roll((r, c), (0, 1)).flatten().nonzero().flatten().tolist()) in blocks
        for r in range(height)
        for c in range(width)
    )


def test_capi_masks_hide_all_but_one_rolled_block_and_predict_among_the_hidden():
    """A 6 x 6 grid, ratio 0.65 (int(23.4) = 23 hidden, 13 visible), a third of the hidden predicted (7): the visible
    patches are one rolled block, cut to 13 in raster order; the predicted ones are hidden; the counts are exact."""
    random.seed(0)
    generator = InverseBlockMask((6, 6), 0.65, 1 / 3)
    assert (generator.hidden, generator.predicted) == (23, 7)
    for _ in range(10):
        hidden, predicted = generator()
        assert int(hidden.sum()) == 23 and int(predicted.sum()) == 7 and not (predicted & ~hidden).any()
        assert _is_rolled_block(~hidden.reshape(6, 6), 13)
    assert not _is_rolled_block((torch.arange(36) % 3 == 0).reshape(6, 6), 12)  # scattered: no block


def test_capi_encoder_never_sees_the_hidden_pixels():
    """The student encodes the visible patches only: changing a hidden patch's pixels changes no prediction, changing
    a visible one's changes them (the teacher sees both)."""
    cfg = CAPIConfig(num_prototypes=8, predictor_depth=1, predictor_heads=2, prediction_subsampling=1.0)
    method = CAPI(_tiny_vit(0), 32, cfg).double()
    method.feeds_probe = False
    images = torch.randn(2, 3, 16, 16, generator=_generator(32), dtype=torch.float64)
    hidden = torch.ones(2, 16, dtype=torch.bool)
    hidden[:, [0, 1, 4, 5, 8]] = False  # 11 hidden (int(0.65 x 16) = 10 is the config's: here any count is read)
    hidden[:, 9] = False
    masks = torch.stack([hidden, hidden], dim=1)

    def encode(x):
        return method.encode({"views": [x], "mask": masks})

    before = encode(images)
    for patch, is_hidden in ((6, True), (5, False)):
        changed = images.clone()
        row, col = divmod(patch, 4)
        changed[:, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] += 1.0
        after = encode(changed)
        assert torch.equal(after["prediction"], before["prediction"]) == is_hidden, patch
        assert not torch.equal(after["teacher"], before["teacher"])


# --- DenseCL ---------------------------------------------------------------------------------------------------------


def _densecl_case(seed: int = 0):
    """A DenseCL on a narrow one-block-per-stage timm ResNet in float64 (a 3 x 3 map at 96 px), its queues full of earlier
    unit keys, and a batch of 3 images' two views."""
    from timm.models.resnet import BasicBlock, ResNet

    from solo.methods.densecl import DenseCL, DenseCLConfig

    torch.manual_seed(seed)
    backbone = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=0, stem_width=8, channels=(8, 16, 32, 32))
    cfg = DenseCLConfig(proj_hidden_dim=32, proj_output_dim=8, queue_size=6, temperature=0.2, dense_weight=0.3)
    method = DenseCL(backbone, 32, cfg).double()
    for queue in method.queues:
        queue.push(F.normalize(torch.randn(6, 8, dtype=torch.float64), dim=1))
    views = [torch.randn(3, 3, 96, 96, dtype=torch.float64) for _ in range(2)]
    return method, {"views": views, "label": torch.zeros(3, dtype=torch.long)}


def _official_densecl(method, batch, match_on: str = "backbone"):
    """WXinlong/DenseCL openselfsup/models/densecl.py's forward_train (one process), on the method's own modules: the
    first view the query, the second the key; the backbone map (timm's forward_features), its average pool through
    the MLP neck and the map through the 1 x 1 one, all L2-normalised; each query cell's positive the key cell whose
    normalised backbone feature is the most similar (`match_on="dense"`: the known-wrong variant, matched on the dense
    embeddings); the cross-entropy with the positive first, averaged over images and over cells, mixed by
    loss_lambda. Returns the loss and the keys the code enqueues (pooled, and the dense embeddings' average pool)."""
    (im_q, im_k), queues = batch["views"], [q.rows.clone() for q in method.queues]
    backbone, global_head, dense_head = method.backbone, method.global_head, method.dense_head
    teacher_backbone, teacher_global, teacher_dense = method.teacher

    def embed(net, mlp, conv, images):
        x = net.forward_features(images)
        dense = conv(x)
        pooled = F.normalize(mlp(x.mean(dim=(2, 3))), dim=1)
        return pooled, F.normalize(dense.flatten(2), dim=1), F.normalize(dense.mean(dim=(2, 3)), dim=1), x

    q, q_grid, _, q_b = embed(backbone, global_head, dense_head, im_q)
    with torch.no_grad():
        k, k_grid, k2, k_b = embed(teacher_backbone, teacher_global, teacher_dense, im_k)
    if match_on == "backbone":
        q_feat, k_feat = F.normalize(q_b.flatten(2), dim=1), F.normalize(k_b.flatten(2), dim=1)
    else:
        q_feat, k_feat = q_grid, k_grid
    index = (q_feat.transpose(1, 2) @ k_feat).max(dim=2).indices  # (B, cells)
    matched = torch.stack([k_grid[b][:, index[b]] for b in range(len(index))])
    dense_pos = (q_grid * matched).sum(dim=1).reshape(-1, 1)
    q_cells = q_grid.transpose(1, 2).reshape(-1, q_grid.shape[1])

    def contrast(positive, query, queue):
        logits = torch.cat([positive, query @ queue.T], dim=1) / method.cfg.temperature
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))

    lam = method.cfg.dense_weight
    single = contrast((q * k).sum(dim=1, keepdim=True), q, queues[0])
    loss = single * (1 - lam) + contrast(dense_pos, q_cells, queues[1]) * lam
    return loss, k, k2


def test_densecl_is_the_official_codes_loss_in_value_and_gradient():
    """The method's loss (its queues full) against the official forward on the same modules, in value and in the
    gradient of the backbone's stem and of both heads; the keys it enqueues are the code's. Told apart: cells matched
    on the dense embeddings instead of the backbone's features, and the pooled key enqueued in the dense queue."""
    method, batch = _densecl_case()
    want, k, k2 = _official_densecl(method, batch)
    params = [method.backbone.conv1.weight, method.global_head[0].weight, method.dense_head[2].weight]
    expected = torch.autograd.grad(want, params)
    got = method(batch)["loss"]
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, params), expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(method.queues[0].rows[:3], k)  # the queue wrapped: the 3 newest rows come first
    torch.testing.assert_close(method.queues[1].rows[:3], k2)
    assert (method.queues[1].rows[:3] - k).abs().max() > 1e-2

    method, batch = _densecl_case()
    wrong = _official_densecl(method, batch, match_on="dense")[0]
    assert abs(wrong.item() - want.item()) > 1e-3 * want.item()


# --- DetCon ----------------------------------------------------------------------------------------------------------


def _paper_detcon(regions, present, temperature, same_image_negatives=True):
    """The paper's DetCon-S loss (their Equation 1 over a SimCLR pair) anchor by anchor: for region m of image i in
    view k, shown in both views, -log of exp(<v, v'>) over exp(<v, v'>) plus the sum of exp(<v, u>) over its negatives
    u (every region shown in its view, of both views of every image, but v and its positive v': the other regions of
    its own image too, unless told otherwise), all unit vectors scaled by 1/sqrt(temperature); the mean over the
    anchors of both views."""
    views = [r / r.norm(dim=2, keepdim=True) / math.sqrt(temperature) for r in regions]
    n, count = len(views[0]), views[0].shape[1]
    anchors = []
    for k in range(2):
        for i in range(n):
            for m in range(count):
                if not (present[0][i, m] and present[1][i, m]):
                    continue
                v, positive = views[k][i, m], torch.exp(views[k][i, m] @ views[1 - k][i, m])
                negatives = [
                    torch.exp(v @ views[w][j, q])
                    for w in range(2)
                    for j in range(n)
                    for q in range(count)
                    if present[w][j, q] and (j, q) != (i, m) and (same_image_negatives or j != i)
                ]
                anchors.append(-torch.log(positive / (positive + sum(negatives))))
    return sum(anchors) / len(anchors)


def _lightly_detcon_s(regions, temperature):
    """lightly's DetConSLoss (DeepMind's byol_nce_detcon) on regions that all show, mask ids 0 .. M - 1 in both views:
    each view's anchors against the other view's and its own view's regions (its own entry removed), the cross
    entropy weighted by 1 / M (the M distinct masks' `obj_area`), averaged over the (b, m) slots; the two views added."""
    u1, u2 = (F.normalize(r, dim=2) for r in regions)
    b, m, _ = u1.shape
    own = torch.eye(b * m, dtype=torch.bool).view(b, m, b, m)

    def one_way(a, other):
        logits = torch.cat([torch.einsum("ikd,jld->ikjl", a, other), torch.einsum("ikd,jld->ikjl", a, a)], dim=2)
        logits = (logits / temperature).masked_fill(torch.cat([torch.zeros_like(own), own], dim=2), -1e9)
        positive = torch.einsum("ikd,ikd->ik", a, other) / temperature
        return ((logits.reshape(b, m, -1).logsumexp(dim=2) - positive) / m).mean()

    return one_way(u1, u2) + one_way(u2, u1)


def _detcon_case(seed=45, n=4, count=3, d=5):
    g = _generator(seed)
    regions1 = torch.randn(n, count, d, generator=g, dtype=torch.float64)
    regions2 = regions1 + 0.8 * torch.randn(n, count, d, generator=g, dtype=torch.float64)
    present = [torch.rand(n, count, generator=g) > 0.3 for _ in range(2)]
    for p in present:
        p[:, 0] = True  # each image has an anchor
    present[1][1, 1] = False
    present[0][2, 2] = True  # one region shown in one view only: a candidate there, not an anchor
    present[1][2, 2] = False
    return [regions1.requires_grad_(), regions2.requires_grad_()], present


def test_detcon_is_the_papers_loss_in_value_and_gradient():
    """Against the paper's loss written anchor by anchor, with regions missing from one view or both, in value and
    gradient. Told apart: the other regions of the anchor's own image left out of its negatives, and regions missing
    from a view kept among the candidates."""
    regions, present = _detcon_case()
    got, want = detcon_loss(*regions, *present, temperature=0.1), _paper_detcon(regions, present, 0.1)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for g, w in zip(torch.autograd.grad(got, regions), torch.autograd.grad(want, regions)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)

    regions = [r.detach() for r in regions]
    value = got.item()
    assert abs(value - _paper_detcon(regions, present, 0.1, same_image_negatives=False).item()) > 1e-2 * value
    every = [torch.ones_like(p) for p in present]
    both_shown = [p & q for p, q in zip(present, present[::-1])]
    kept = detcon_loss(*regions, *every, temperature=0.1).item()  # absent regions are candidates too ...
    assert abs(kept - _paper_detcon(regions, every, 0.1).item()) <= 1e-12 * kept
    assert abs(value - detcon_loss(*regions, *both_shown, temperature=0.1).item()) > 1e-3 * value  # ... or not


def test_detcon_is_lightlys_detcon_s_times_the_regions_over_two_when_every_region_shows():
    """lightly (and DeepMind's code) weigh each anchor by 1 / M and add the views' means: solo's mean over the anchors
    is that times M / 2. With every region shown, the same negatives."""
    regions, _ = _detcon_case(seed=46)
    regions = [r.detach() for r in regions]
    every = [torch.ones(4, 3, dtype=torch.bool)] * 2
    got = detcon_loss(*regions, *every, temperature=0.1).item()
    assert got == pytest.approx(_lightly_detcon_s(regions, 0.1).item() * 3 / 2, rel=1e-12)


def test_detcon_regions_are_the_grid_masks_average_pooled_to_the_map():
    """A 2 x 2 map of a view, regions of a 2 x 2 grid of the image: the fraction of each cell in each region, by
    hand. The view [1/8, 5/8) x [1/4, 3/4) mirrored: its left column shows the image's [1/2, 3/4), its right one
    [1/4, 1/2); its top cells lie in the top regions, its bottom cells half in the top and half in the bottom ones (the
    cell-centre rule would put them wholly in the bottom ones). A view of the top-left quarter shows that region only."""
    boxes = torch.tensor(
        [[1 / 8, 1 / 4, 1 / 2, 1 / 2, 1.0], [0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.5, 0.5, 0.0]], dtype=torch.float64
    )
    fractions, present = grid_regions(boxes, 2, 2, 2)
    # regions (top-left, top-right, bottom-left, bottom-right) x cells (top-left, top-right, bottom-left, bottom-right)
    mirrored = torch.tensor(
        [[0, 1, 0, 0.5], [1, 0, 0.5, 0], [0, 0, 0, 0.5], [0, 0, 0.5, 0]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(fractions[0], mirrored, rtol=0, atol=1e-15)
    torch.testing.assert_close(fractions[1], torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(fractions[2, 0], torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-15)
    assert present.tolist() == [[True] * 4, [True] * 4, [True, False, False, False]]
    unmirrored, _ = grid_regions(boxes[:1] * torch.tensor([1.0, 1, 1, 1, 0], dtype=torch.float64), 2, 2, 2)
    assert not torch.allclose(unmirrored[0], mirrored)


# --- FastSiam, MACL, VISReg ------------------------------------------------------------------------------------------


def _views(seed: int, count: int, n: int = 9, d: int = 4) -> list[torch.Tensor]:
    g = _generator(seed)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    return [(base + 0.6 * torch.randn(n, d, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(count)]


def _assert_same_value_and_gradient(got, want, inputs, rel=1e-12):
    assert got.item() == pytest.approx(want.item(), rel=rel)
    for a, b in zip(torch.autograd.grad(got, inputs, retain_graph=True), torch.autograd.grad(want, inputs)):
        torch.testing.assert_close(a, b, rtol=rel * 100, atol=rel)


def test_fastsiam_is_lightlys_example_loop_in_value_and_gradient():
    """lightly's examples/pytorch/fastsiam.py: for each of the 4 views, NegativeCosineSimilarity of its prediction and
    the mean of the other views' detached projections, over 4. Told apart: SimSiam's pairs (each view's target one
    other view), which FastSiam's averaged target replaces."""
    p, z = _views(1, 4), _views(2, 4)
    want = 0.0
    for i in range(4):
        target = torch.stack([z[j].detach() for j in range(4) if j != i]).mean(dim=0)
        want = want - F.cosine_similarity(p[i], target, dim=1).mean() / 4
    _assert_same_value_and_gradient(fastsiam_loss(p, z), want, p)  # the projections are targets: no gradient
    pairs = -sum(F.cosine_similarity(p[i], z[(i + 1) % 4].detach(), dim=1).mean() for i in range(4)) / 4
    assert abs(pairs.item() - want.item()) > 1e-2


def _lightly_macl(z1, z2, temperature, alpha, a0, eps=1e-8):
    """lightly's MACLLoss (lightly/loss/macl_loss.py), anchor by anchor: 2N anchors, each against the other 2N - 1
    views; t = temperature * (1 + alpha * (A - a0)), A the mean positive cosine (detached); each anchor's
    -log P(positive) weighted by 1 / (1 - P + eps), detached; the mean."""
    u = torch.cat([F.normalize(z1, dim=1), F.normalize(z2, dim=1)])
    n = len(z1)
    a = sum(u[i] @ u[i + n] for i in range(n)).detach() / n
    t = temperature * (1 + alpha * (a - a0))
    losses = []
    for i in range(2 * n):
        positive = (i + n) % (2 * n)
        logits = torch.stack([u[i] @ u[j] / t for j in range(2 * n) if j != i])
        log_p = u[i] @ u[positive] / t - torch.logsumexp(logits, dim=0)
        losses.append(-log_p / (1 - log_p.detach().exp() + eps))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("alpha, a0", [(0.5, 0.0), (1.0, 0.0), (0.3, 0.6)])
def test_macl_is_lightlys_loss_in_value_and_gradient(alpha, a0):
    """Against lightly's MACLLoss (its 1e-8 in the weight moves the value by about 1e-8 of it). Told apart: the
    authors' MACLb form (facebookresearch-style cross-view logits: each first view against the N second views only),
    and a fixed temperature (alpha 0)."""
    z1, z2 = _views(3, 2)
    got, want = macl_loss(z1, z2, 0.1, alpha, a0), _lightly_macl(z1, z2, 0.1, alpha, a0)
    _assert_same_value_and_gradient(got, want, (z1, z2), rel=1e-6)
    u1, u2 = F.normalize(z1.detach(), dim=1), F.normalize(z2.detach(), dim=1)
    t = 0.1 * (1 + alpha * (torch.trace(u1 @ u2.T) / 9 - a0))
    p = (u1 @ u2.T / t).softmax(dim=1)
    cross_view_only = (-p.diagonal().log() / (1 - p.diagonal())).mean()
    for wrong in (cross_view_only, _lightly_macl(z1, z2, 0.1, 0.0, a0)):
        assert abs(wrong.item() - got.item()) > 1e-4 * got.item()  # 1e4 times the tolerance above


def _visreg_by_hand(views, directions, lambd, num_global, weights, eps):
    """VISReg's equations (the paper's Algorithm 1, as lightly's VISRegLoss computes them in one process), with the
    standard normal's quantiles from Python's statistics.NormalDist: the invariance of every view to the global views'
    centre; per view, centre = mean of mu^2, scale = mean of (1 - sigma)^2 (biased), shape = the mean over directions
    and samples of (sorted projections of (z - mu) / (sigma.detach() + eps) - quantiles)^2."""
    import statistics

    n = len(views[0])
    quantiles = torch.tensor(
        [statistics.NormalDist().inv_cdf(i / (n + 1)) for i in range(1, n + 1)], dtype=torch.float64
    )
    stacked = torch.stack(views)
    invariance = (stacked - stacked[:num_global].mean(dim=0)).square().mean()
    terms = []
    for z in views:
        mu, sigma = z.mean(dim=0), ((z - z.mean(dim=0)).square().mean(dim=0)).sqrt()
        projected = ((z - mu) / (sigma.detach() + eps)) @ directions
        shape = torch.stack(
            [(projected[:, m].sort().values - quantiles).square().mean() for m in range(directions.shape[1])]
        )
        terms.append(
            weights[0] * (1 - sigma).square().mean() + weights[1] * shape.mean() + weights[2] * mu.square().mean()
        )
    return (1 - lambd) * invariance + lambd * torch.stack(terms).mean()


def test_visreg_is_the_papers_loss_in_value_and_gradient():
    """Two global views and two local ones, 6 directions, unequal weights. Told apart: LeJEPA's SIGReg in the
    regulariser's place (what VISReg replaces) and the statistics of two halves of the batch (per-rank ones)."""
    views = _views(4, 4, n=11)
    directions = random_directions(4, 6, seeded_uniforms(5), dtype=torch.float64)
    got = visreg_loss(views, directions, 0.6, 2, (1.0, 0.5, 2.0), 1e-4)
    want = _visreg_by_hand(views, directions, 0.6, 2, (1.0, 0.5, 2.0), 1e-4)
    _assert_same_value_and_gradient(got, want, views, rel=1e-10)
    detached = [v.detach() for v in views]
    halves = (
        sum(
            visreg_loss([v[s] for v in detached], directions, 0.6, 2, (1.0, 0.5, 2.0)).item()
            for s in (slice(0, 5), slice(5, None))
        )
        / 2
    )
    sigreg = lejepa_loss(detached, directions, 0.6, 2).item()
    for wrong in (halves, sigreg):
        assert abs(wrong - got.item()) > 1e-2 * got.item()


# --- SwAV's queue ----------------------------------------------------------------------------------------------------


def _official_swav_with_queue(scores, queue, epsilon=0.05, iterations=3, temperature=0.1):
    """facebookresearch/swav main_swav.py in one process: for each of the 2 global crops, its scores stacked under
    the queue's (torch.mm(queue[i], prototypes.t()) first), distributed_sinkhorn (Q = exp(out / eps).t(), divided by
    its sum, then `iterations` rounds of rows over K and columns over B, times B), the batch's last bs codes; the loss
    the mean over the other crops of -sum q log softmax(scores / temperature), averaged over the 2 crops."""
    loss = 0.0
    bs = len(scores[0])
    for i in range(2):
        with torch.no_grad():
            out = torch.cat([queue[i], scores[i]])
            q = torch.exp(out / epsilon).t()
            q /= q.sum()
            k, b = q.shape
            for _ in range(iterations):
                q /= q.sum(dim=1, keepdim=True)
                q /= k
                q /= q.sum(dim=0, keepdim=True)
                q /= b
            q = (q * b).t()[-bs:]
        others = [v for v in range(len(scores)) if v != i]
        loss += sum(-(q * F.log_softmax(scores[v] / temperature, dim=1)).sum(dim=1).mean() for v in others) / len(
            others
        )
    return loss / 2


def test_swav_queue_joins_the_sinkhorn_as_the_authors_code():
    """Two global crops and a local one, a queue of 7 rows per crop: solo's codes from the queue and the batch are the
    authors' in value and gradient. Told apart: the codes of the batch alone (no queue)."""
    g = _generator(21)
    scores = [F.normalize(torch.randn(9, 5, generator=g, dtype=torch.float64), dim=1).requires_grad_() for _ in "123"]
    queue = [F.normalize(torch.randn(7, 5, generator=g, dtype=torch.float64), dim=1) for _ in "12"]
    got = swav_loss(scores, 0.1, 0.05, 3, 2, queue, torch.ones(7, dtype=torch.bool))
    _assert_same_value_and_gradient(got, _official_swav_with_queue(scores, queue), scores, rel=1e-10)
    assert abs(swav_loss(scores, 0.1, 0.05, 3, 2).item() - got.item()) > 1e-3 * got.item()


# --- PIRL ------------------------------------------------------------------------------------------------------------


def _pirl_case(seed: int = 0, jigsaw_weight: float = 0.3):
    """A PIRL on a narrow timm ResNet in float64 (its BatchNorm in eval mode, so that a tile through the backbone alone
    gives what it gives among the batch's), a bank of 7 samples, and a batch of 3 of them: the image at 32 px and the
    jigsaw's view at 48 (16 px tiles), with their jigsaw orders."""
    from timm.models.resnet import BasicBlock, ResNet

    from solo.methods.pirl import PIRL, PIRLConfig

    torch.manual_seed(seed)
    backbone = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=0, stem_width=8, channels=(8, 16, 32, 32))
    cfg = PIRLConfig(proj_output_dim=6, temperature=0.2, jigsaw_weight=jigsaw_weight)
    method = PIRL(backbone, 32, cfg)
    method.set_data(7)
    method = method.double().eval()
    orders = torch.stack([torch.randperm(9) for _ in range(3)])
    views = [torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.randn(3, 3, 48, 48, dtype=torch.float64)]
    batch = {"views": views, "jigsaw": orders, "index": torch.tensor([5, 0, 3]), "label": torch.zeros(3).long()}
    return method, batch


def _paper_pirl(method, batch, follow_order: bool = True):
    """The paper's Equations 4-5 with the whole bank as the negatives (VISSL's NCELossWithMemory, loss_type
    cross_entropy, its 32,000 sampled negatives being every other entry here), sample by sample: f the image head on the
    image's features; g the jigsaw head on the nine tile-head outputs joined, slot k holding tile order[k] (tiles
    numbered row by row, each 16 px, through the backbone alone); each of f and g unit, scored against every unit bank
    entry at the temperature, -log of its own entry's softmax weight; lambda g's + (1 - lambda) f's, averaged over the
    samples. Returns the loss and the bank VISSL's update_memory leaves: normalise(0.5 entry + 0.5 unit f)."""
    cfg, bank = method.cfg, method.bank.rows.clone()
    image, whole = batch["views"]
    losses, updated = [], bank.clone()
    for i, sample in enumerate(batch["index"].tolist()):
        f = method.image_head(method.backbone(image[i : i + 1]))[0]
        tiles = [whole[i : i + 1, :, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16] for r in range(3) for c in range(3)]
        order = batch["jigsaw"][i].tolist() if follow_order else list(range(9))
        joined = torch.cat([method.tile_head(method.backbone(tiles[k]))[0] for k in order])
        g = method.jigsaw_head(joined)

        def nce(z, positive):
            scores = torch.stack([z / z.norm() @ entry for entry in bank]) / cfg.temperature
            return -(scores[positive] - torch.logsumexp(scores, dim=0))

        losses.append(cfg.jigsaw_weight * nce(g, sample) + (1 - cfg.jigsaw_weight) * nce(f, sample))
        blended = 0.5 * bank[sample] + 0.5 * (f / f.norm()).detach()
        updated[sample] = blended / blended.norm()
    return sum(losses) / len(losses), updated


def test_pirl_is_the_papers_loss_with_vissls_memory_in_value_and_gradient():
    """The method's loss against the paper's, sample by sample, in value and in the gradient of the backbone's stem and
    of the three heads; the bank it leaves is VISSL's momentum update (the step's samples' entries only). Told apart:
    the tiles joined in the image's order instead of the jigsaw's."""
    method, batch = _pirl_case()
    start = method.bank.rows.clone()
    want, bank = _paper_pirl(method, batch)
    params = [
        method.backbone.conv1.weight,
        method.image_head.weight,
        method.tile_head.weight,
        method.jigsaw_head.weight,
    ]
    expected = torch.autograd.grad(want, params)
    got = method(batch)["loss"]
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(got, params), expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(method.bank.rows, bank, rtol=0, atol=1e-14)
    untouched = [1, 2, 4, 6]
    assert torch.equal(method.bank.rows[untouched], start[untouched])
    assert (method.bank.rows[[5, 0, 3]] - start[[5, 0, 3]]).abs().max() > 1e-2

    method, batch = _pirl_case()
    unshuffled = _paper_pirl(method, batch, follow_order=False)[0]
    assert abs(unshuffled.item() - want.item()) > 1e-4 * want.item()


def test_pirl_jigsaw_orders_are_permutations_drawn_per_sample():
    from solo.methods.pirl import JigsawOrder

    draws = [JigsawOrder()(torch.zeros(2, 1), 16, 16, random.Random(seed)) for seed in range(50)]
    assert all(sorted(d.tolist()) == list(range(9)) for d in draws)
    assert len({tuple(d.tolist()) for d in draws}) == 50
    assert torch.equal(JigsawOrder()(torch.zeros(2, 1), 16, 16, random.Random(3)), draws[3])


def test_pirl_refuses_views_other_than_the_image_and_the_jigsaws():
    from solo.data import DATASETS
    from solo.methods.pirl import PIRL

    PIRL.check_data([16, 24], DATASETS["digits"])
    for sizes in ([16], [16, 24, 8], [16, 2]):
        with pytest.raises(ConfigError, match="method=pirl takes two views"):
            PIRL.check_data(sizes, DATASETS["digits"])


def test_pirl_backbone_keeps_the_images_running_statistics_not_the_tiles():
    """A training step leaves the backbone's BatchNorm running statistics (what it evaluates with) where the images
    alone take them: the tiles normalise with their own batch statistics and move no running statistic. The
    known-wrong variant, the tiles through the backbone as the images are (VISSL's trunk), moves them further."""
    from solo.methods.pirl import jigsaw_tiles

    method, batch = _pirl_case()
    method.train()
    images_only, both = copy.deepcopy(method.backbone), copy.deepcopy(method.backbone)
    images_only(batch["views"][0])
    both(batch["views"][0])
    both(jigsaw_tiles(batch["views"][1], batch["jigsaw"]))
    method(batch)
    got = dict(method.backbone.named_buffers())
    for name, want in images_only.named_buffers():
        assert torch.equal(got[name], want), name
    moved = [n for n, b in both.named_buffers() if n.endswith("running_mean") and not torch.equal(got[n], b)]
    assert moved, "the tiles' statistics would have left the running means where the images leave them"


def _lightly_co2(q, k, negatives, temperature):
    """lightly's CO2Regularizer (lightly/loss/regularizer/co2.py) with its memory bank's negatives, sample by sample:
    log-softmaxes of [q.k, q.n_j] and [k.q, k.n_j] at the temperature (unit rows), KLDivLoss(batchmean) both ways,
    halved (alpha 1). lightly returns it as a new tensor, without gradient; this one keeps q's (k is MoCo's key)."""
    losses = []
    for i in range(len(q)):
        u, v = F.normalize(q[i], dim=0), F.normalize(k[i].detach(), dim=0)
        log_p = (torch.stack([u @ v] + [u @ n for n in negatives]) / temperature).log_softmax(dim=0)
        log_r = (torch.stack([v @ u] + [v @ n for n in negatives]) / temperature).log_softmax(dim=0)
        losses.append(((log_p.exp() * (log_p - log_r)).sum() + (log_r.exp() * (log_r - log_p)).sum()) / 2)
    return torch.stack(losses).mean()


def test_co2_is_lightlys_regulariser_in_value_and_with_the_querys_gradient():
    """Over the filled rows of a queue (4 of 6): value and q's gradient against lightly's form. Told apart: one KL
    direction only, and both softmaxes over the negatives alone (without the positive's logit)."""
    q, k = _views(4, 2, n=5, d=6)
    queue = F.normalize(torch.randn(6, 6, generator=_generator(5), dtype=torch.float64), dim=1)
    valid = torch.tensor([True, True, False, True, True, False])
    got = co2_loss(q, k, queue, valid, 0.05)
    _assert_same_value_and_gradient(got, _lightly_co2(q, k, queue[valid], 0.05), (q,))
    assert co2_loss(q, k, queue, torch.zeros(6, dtype=torch.bool), 0.05).item() == 0  # nothing to be consistent on
    u, v = F.normalize(q.detach(), dim=1), F.normalize(k, dim=1)
    log_p, log_r = (u @ queue[valid].T / 0.05).log_softmax(dim=1), (v @ queue[valid].T / 0.05).log_softmax(dim=1)
    negatives_only = ((log_p.exp() - log_r.exp()) * (log_p - log_r)).sum(dim=1).mean() / 2
    log_p = (torch.cat([(u * v).sum(1, keepdim=True), u @ queue[valid].T], 1) / 0.05).log_softmax(dim=1)
    log_r = (torch.cat([(u * v).sum(1, keepdim=True), v @ queue[valid].T], 1) / 0.05).log_softmax(dim=1)
    one_way = (log_p.exp() * (log_p - log_r)).sum(dim=1).mean()
    for wrong in (negatives_only, one_way):
        assert abs(wrong.item() - got.item()) > 1e-3 * got.item()


def test_mocov2plus_adds_co2_times_its_weight_to_each_directions_loss():
    """MoCo v2+ with co2_weight 0.7: its loss minus the same step's without CO2 is 0.7 times the mean over the two
    directions of lightly's CO2 (each view's prediction against the other view's key and that view's queue), in value
    and in the predictions' gradient."""
    from solo.methods.mocov2plus import MoCoV2Plus, MoCoV2PlusConfig

    p1, p2, t1, t2 = _views(6, 4, n=5, d=4)
    losses = {}
    for weight in (0.0, 0.7):
        cfg = MoCoV2PlusConfig(proj_hidden_dim=4, proj_output_dim=4, queue_size=8, co2_weight=weight)
        method = MoCoV2Plus(torch.nn.Identity(), 4, cfg).double()
        for queue, seed in zip(method.queues, (7, 8)):
            queue.push(F.normalize(torch.randn(6, 4, generator=_generator(seed), dtype=torch.float64), dim=1))
        losses[weight] = method.pair_loss(p1, p2, t1, t2)
    rows = [F.normalize(torch.randn(6, 4, generator=_generator(s), dtype=torch.float64), dim=1) for s in (7, 8)]
    co2 = (_lightly_co2(p1, t2, rows[1], 0.05) + _lightly_co2(p2, t1, rows[0], 0.05)) / 2
    _assert_same_value_and_gradient(losses[0.7] - losses[0.0], 0.7 * co2, (p1, p2))


@pytest.mark.parametrize("name", ["simclr", "dcl", "macl"])
def test_contrastive_methods_add_co2_times_its_weight_both_ways(name):
    """SimCLR's, DCL's and MACL's `method.co2_weight` 0.7: the loss minus the same step's without CO2 is 0.7 times the
    mean over the two directions of lightly's CO2, each view's projection against the other's with the batch's other
    samples' embeddings as the negatives, in value and in both projections' gradient. Told apart: one direction."""
    from solo.methods import METHODS

    z1, z2, _, _ = _views(11, 4, n=5, d=6)
    losses = {}
    for weight in (0.0, 0.7):
        cfg = METHODS[name].schema(proj_hidden_dim=6, proj_output_dim=6, co2_weight=weight)
        losses[weight] = METHODS[name].target(torch.nn.Identity(), 6, cfg).double().loss(z1, z2)

    def lightly_one_way(q, k):
        unit = F.normalize(k.detach(), dim=1)
        return torch.stack(
            [_lightly_co2(q[i : i + 1], k[i : i + 1], torch.cat([unit[:i], unit[i + 1 :]]), 0.05) for i in range(5)]
        ).mean()

    both = (lightly_one_way(z1, z2) + lightly_one_way(z2, z1)) / 2
    _assert_same_value_and_gradient(losses[0.7] - losses[0.0], 0.7 * both, (z1, z2))
    assert abs((losses[0.7] - losses[0.0]).item() - 0.7 * lightly_one_way(z1, z2).item()) > 1e-4


def test_densecl_adds_co2_of_its_global_branch_times_its_weight():
    """DenseCL with co2_weight 0.7: its loss minus the same step's without CO2 is 0.7 times lightly's CO2 of the pooled
    query embedding against the momentum key over the global queue's filled rows, in value and in the query
    features' gradient."""
    from solo.methods.densecl import DenseCL, DenseCLConfig

    g = _generator(12)
    pooled = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    encoded = {
        "features": pooled,
        "query_map": torch.randn(5, 4, 2, 2, generator=g, dtype=torch.float64),
        "key_pooled": torch.randn(5, 4, generator=g, dtype=torch.float64),
        "key_map": torch.randn(5, 4, 2, 2, generator=g, dtype=torch.float64),
    }
    queue = F.normalize(torch.randn(8, 3, generator=g, dtype=torch.float64), dim=1)
    # A CNN of width 4 with a global pool, whose map DenseCL reads (the step below starts from given features).
    layers = {"conv": torch.nn.Conv2d(3, 4, 1), "avgpool": torch.nn.AdaptiveAvgPool2d(1), "flat": torch.nn.Flatten()}
    cnn = torch.nn.Sequential(collections.OrderedDict(layers))
    losses = {}
    for weight in (0.0, 0.7):
        torch.manual_seed(0)
        cfg = DenseCLConfig(proj_hidden_dim=6, proj_output_dim=3, queue_size=8, co2_weight=weight)
        method = DenseCL(cnn, 4, cfg).double()
        method.queues[0].push(queue[:6])
        losses[weight] = method.batch_loss(encoded, {"label": torch.zeros(5, dtype=torch.long)})["loss"]
    q, k = method.global_head(pooled), method.teacher[1](encoded["key_pooled"]).detach()
    _assert_same_value_and_gradient(losses[0.7] - losses[0.0], 0.7 * _lightly_co2(q, k, queue[:6], 0.05), (pooled,))


def test_co2_without_a_queue_takes_the_other_samples_keys_as_its_negatives():
    """SimCLR's and MoCo v3's CO2 (co2_batch_loss): each sample is lightly's form with the batch's other keys as its
    memory bank, in value and in the queries' gradient; the keys take none. Told apart: the own key among the
    negatives too."""
    q, k = _views(9, 2, n=5, d=6)
    k = k.detach().requires_grad_()
    got = co2_batch_loss(q, k, 0.05)
    unit = F.normalize(k.detach(), dim=1)  # the keys as MoCo's queue holds them
    others = [torch.cat([unit[:i], unit[i + 1 :]]) for i in range(5)]
    want = torch.stack([_lightly_co2(q[i : i + 1], k[i : i + 1], others[i], 0.05) for i in range(5)]).mean()
    _assert_same_value_and_gradient(got, want, (q,))
    assert torch.autograd.grad(co2_batch_loss(q, k, 0.05), k, allow_unused=True)[0] is None, "the keys are targets"
    with_itself = torch.stack([_lightly_co2(q[i : i + 1], k[i : i + 1], unit, 0.05) for i in range(5)]).mean()
    assert abs(with_itself.item() - got.item()) > 1e-3 * got.item()


def test_simclr_and_mocov3_add_co2_times_its_weight_to_their_loss():
    """co2_weight 0.7: SimCLR's loss minus the same loss without CO2 is 0.7 times the mean over the two directions of
    co2_batch_loss (each view's projection against the other's), and MoCo v3's per direction is 0.35 times it."""
    from solo.methods.mocov3 import MoCoV3, MoCoV3Config
    from solo.methods.simclr import SimCLR, SimCLRConfig

    z1, z2 = _views(10, 2, n=5, d=4)
    simclr, mocov3 = {}, {}
    for weight in (0.0, 0.7):
        simclr[weight] = SimCLR(
            torch.nn.Identity(), 4, SimCLRConfig(proj_hidden_dim=4, proj_output_dim=4, co2_weight=weight)
        ).loss(z1, z2)
        mocov3[weight] = MoCoV3(
            torch.nn.Identity(),
            4,
            MoCoV3Config(proj_hidden_dim=4, proj_output_dim=4, pred_hidden_dim=4, co2_weight=weight),
        ).loss(z1, z2)
    both = (co2_batch_loss(z1, z2, 0.05) + co2_batch_loss(z2, z1, 0.05)) / 2
    _assert_same_value_and_gradient(simclr[0.7] - simclr[0.0], 0.7 * both, (z1, z2))
    _assert_same_value_and_gradient(mocov3[0.7] - mocov3[0.0], 0.35 * co2_batch_loss(z1, z2, 0.05), (z1,))


def _paper_vcreg(h, alpha, beta, eps=1e-4):
    """VCReg's terms of one representation (rows, features), feature by feature and pair by pair: alpha times the
    mean over features of max(0, 1 - sqrt(var_j + eps)) (unbiased variances) plus beta times the mean over the
    d(d - 1) ordered pairs j != k of their squared covariance."""
    n, d = h.shape
    mean = h.mean(dim=0)
    cov = [[((h[:, j] - mean[j]) * (h[:, k] - mean[k])).sum() / (n - 1) for k in range(d)] for j in range(d)]
    hinge = sum(F.relu(1 - torch.sqrt(cov[j][j] + eps)) for j in range(d)) / d
    pairs = sum(cov[j][k] ** 2 for j in range(d) for k in range(d) if j != k) / (d * (d - 1))
    return alpha * hinge + beta * pairs


def test_vcreg_loss_is_the_papers_variance_and_covariance_terms_in_value_and_gradient():
    """Told apart: stable-pretraining's VCRegLoss normalisation (the hinge halved, the covariances summed over d:
    VICReg's), which weighs a wide layer's covariances d - 1 times more."""
    (h,) = _views(9, 1, n=7, d=5)
    h2 = (h * 0.4).detach().requires_grad_()  # standard deviations below 1: the hinge active
    for x in (h, h2):
        got, want = vcreg_loss(x, 0.7, 0.3), _paper_vcreg(x, 0.7, 0.3)
        _assert_same_value_and_gradient(got, want, (x,))
    centred = h2.detach() - h2.detach().mean(dim=0)
    cov = centred.T @ centred / 6
    hinge = F.relu(1 - torch.sqrt(torch.diagonal(cov) + 1e-4)).mean()
    stable_pretraining = 0.7 * hinge / 2 + 0.3 * (cov - torch.diag(torch.diagonal(cov))).pow(2).sum() / 5
    assert abs(stable_pretraining.item() - vcreg_loss(h2, 0.7, 0.3).item()) > 1e-2 * vcreg_loss(h2, 0.7, 0.3).item()


@pytest.mark.parametrize("backbone_name", ["resnet", "vit"])
def test_vcreg_is_cross_entropy_plus_each_blocks_terms_in_value_and_gradient(backbone_name):
    """The method's loss against one written by hand: the backbone run block by block (a ResNet's stem and four stages;
    a ViT's patch embedding, class token and blocks), each block's output regularised with every position or token a
    row, plus the head's cross-entropy on the pooled features; value and gradient of the first and last blocks and the
    head. Told apart: the last block's output alone (the representation, not every block's)."""
    from timm.models.resnet import BasicBlock, ResNet
    from timm.models.vision_transformer import VisionTransformer

    from solo.methods.vcreg import VCReg, VCRegConfig

    torch.manual_seed(3)
    if backbone_name == "resnet":
        backbone = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=0, stem_width=8, channels=(8, 16, 32, 32)).eval()
        images, width = torch.randn(4, 3, 64, 64, dtype=torch.float64), 32
    else:
        backbone = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=0)
        images, width = torch.randn(4, 3, 16, 16, dtype=torch.float64), 16
    method = VCReg(backbone, width, VCRegConfig(num_classes=3, var_weight=0.5, cov_weight=2.0)).double()
    labels = torch.tensor([0, 2, 1, 2])
    if backbone_name == "resnet":
        x = backbone.maxpool(backbone.act1(backbone.bn1(backbone.conv1(images))))
        outputs = []
        for stage in (backbone.layer1, backbone.layer2, backbone.layer3, backbone.layer4):
            x = stage(x)
            outputs.append(x.permute(0, 2, 3, 1).reshape(-1, x.shape[1]))
        pooled = x.mean(dim=(2, 3))
        first, last = backbone.conv1.weight, backbone.layer4[0].conv2.weight
    else:
        x = backbone._pos_embed(backbone.patch_embed(images))
        outputs = []
        for block in backbone.blocks:
            x = block(x)
            outputs.append(x.reshape(-1, x.shape[-1]))
        pooled = backbone.norm(x)[:, 0]
        first, last = backbone.patch_embed.proj.weight, backbone.blocks[-1].mlp.fc2.weight
    cross_entropy = F.cross_entropy(method.head(pooled), labels)
    want = cross_entropy + sum(_paper_vcreg(o, 0.5, 2.0) for o in outputs)
    params = (first, last, method.head.weight)
    got = method({"views": [images], "label": labels})["loss"]
    _assert_same_value_and_gradient(got, want, params, rel=1e-10)
    last_only = cross_entropy + _paper_vcreg(outputs[-1], 0.5, 2.0)
    assert abs(last_only.item() - got.item()) > 1e-3 * got.item()


def _lightly_smog_step(x0_encoded, x0_predicted, x1_encoded, groups, beta, temperature):
    """lightly's SMoG step (SMoGPrototypes in lightly/models/modules/heads.py, driven as in examples/pytorch/smog.py):
    assign_groups(x1_encoded), each row's group of highest cosine; get_updated_group_features(x0_encoded), group by
    group, beta * group + (1 - beta) * the mean of the x0 rows that chose it; cross-entropy of x0_predicted's cosines
    to the moved groups over the temperature. The moved groups detached (solo's convention, on SMoG's page: lightly's
    carry a gradient into x0_encoded)."""

    def assign(x, g):
        return torch.argmax(F.normalize(x, dim=1) @ F.normalize(g, dim=1).T, dim=-1)

    assignments, chosen, moved = assign(x1_encoded, groups), assign(x0_encoded, groups), groups.clone()
    for group in torch.unique(chosen):
        moved[group] = beta * groups[group] + (1 - beta) * x0_encoded[chosen == group].mean(dim=0)
    moved = moved.detach()
    logits = F.normalize(x0_predicted, dim=1) @ F.normalize(moved, dim=1).T / temperature
    return F.cross_entropy(logits, assignments), moved


def test_smog_is_lightlys_group_step_in_value_and_gradient():
    """The moved groups and the loss against lightly's step; a group no row chose stays. Told apart: the prediction
    classified among the groups before they move (SMoG's update is synchronous: within the step)."""
    encoded, predicted, teacher = _views(9, 3, n=12, d=5)
    groups = F.normalize(torch.randn(8, 5, generator=_generator(3), dtype=torch.float64), dim=1)
    want, want_moved = _lightly_smog_step(encoded, predicted, teacher, groups, 0.9, 0.1)
    moved = momentum_groups(groups, encoded, 0.9)
    torch.testing.assert_close(moved, want_moved, rtol=1e-12, atol=1e-12)
    assert (moved == groups).all(dim=1).any(), "some group no row chose, which stays"
    assigned = (F.normalize(teacher, dim=1) @ groups.T).argmax(dim=1)
    got = smog_loss(predicted, moved, assigned, 0.1)
    _assert_same_value_and_gradient(got, want, (predicted,))
    before = smog_loss(predicted, groups, assigned, 0.1)
    assert abs(before.item() - got.item()) > 1e-3 * got.item()


def _spherical_kmeans(points, k, iterations, seed):
    """k-means on unit rows, point by point: k distinct points drawn with `seed` as the start; each point to its
    centroid of highest cosine; each centroid the normalised sum of its points (kept when it has none)."""
    centroids = points[torch.randperm(len(points), generator=_generator(seed))[:k]].clone()
    for _ in range(iterations):
        assigned = [int(torch.argmax(torch.stack([p @ c for c in centroids]))) for p in points]
        for c in range(k):
            mine = [p for p, a in zip(points, assigned) if a == c]
            if mine:
                centroids[c] = F.normalize(torch.stack(mine).sum(dim=0), dim=0)
    return centroids


def test_smog_method_moves_the_groups_with_both_views_and_regroups_its_queue():
    """SMoG's step on two views' features (an identity backbone): the mean over both directions of each prediction
    against the other view's teacher group, the groups moved by both views' unit online embeddings (lightly's step
    above, both views at once), the first view's embeddings queued. After step regroup_every, the groups are spherical
    k-means of the queue and the teacher is a copy of the student."""
    from solo.methods.smog import SMoG, SMoGConfig

    cfg = SMoGConfig(
        proj_hidden_dim=8, proj_output_dim=4, pred_hidden_dim=8, num_groups=3, queue_size=12, regroup_every=2,
        kmeans_iterations=4, group_momentum=0.8, temperature=0.2,
    )  # fmt: skip
    method = SMoG(torch.nn.Identity(), 4, cfg).double()
    f1, f2 = _views(12, 2, n=6, d=4)
    groups = method.groups.clone()
    out = method.batch_loss({"features": [f1, f2], "teacher": [f1.detach(), f2.detach()]}, {"label": torch.zeros(6)})
    z1, z2 = method.projector(f1), method.projector(f2)
    p1, p2 = method.predictor(z1), method.predictor(z2)
    with torch.no_grad():
        t1, t2 = method.teacher[1](f1), method.teacher[1](f2)
    unit = F.normalize(torch.cat([z1, z2]), dim=1)
    loss1, moved = _lightly_smog_step(unit, p1, t2, groups, 0.8, 0.2)
    loss2, _ = _lightly_smog_step(unit, p2, t1, groups, 0.8, 0.2)
    _assert_same_value_and_gradient(out["loss"], (loss1 + loss2) / 2, (f1, f2))
    torch.testing.assert_close(method.groups, moved, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(method.queue.rows[:6], F.normalize(z1, dim=1).detach())
    f3, f4 = _views(13, 2, n=6, d=4)
    method.batch_loss({"features": [f3, f4], "teacher": [f3, f4]}, {"label": torch.zeros(6)})
    for p in method.parameters():
        if p.requires_grad:
            p.data.add_(0.01)  # an optimizer step: the student leaves its teacher
    method.prepare_step(1, 10)
    method.after_optimizer_step()
    torch.testing.assert_close(method.groups, _spherical_kmeans(method.queue.rows, 3, 4, seed=2))
    student = [*method.backbone.parameters(), *method.projector.parameters()]
    assert all(torch.equal(t, s) for t, s in zip(method.teacher.parameters(), student))


# --- CMAE ------------------------------------------------------------------------------------------------------------


def _cmae_case():
    """A CMAE on the tiny ViT (2 blocks, 4 x 4 patches), decoders of width 16 (2 and 1 blocks), a 16-8-16 projector and
    predictor, 3 images (the online and the target view) hiding 10 patches each; the target encoder moved off the
    backbone so that the two differ."""
    from solo.methods.cmae import CMAE, CMAEConfig

    cfg = CMAEConfig(
        mask_ratio=0.625, decoder_embed_dim=16, decoder_depth=2, feature_decoder_depth=1, decoder_heads=2,
        proj_hidden_dim=8, proj_output_dim=16, pred_hidden_dim=8, temperature=0.2, contrastive_weight=0.7,
    )  # fmt: skip
    method = CMAE(_tiny_vit(8), 32, cfg).double()
    method.feeds_probe = False
    g = _generator(34)
    with torch.no_grad():
        for t in method.teacher.parameters():
            t.add_(0.05 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    views = [torch.randn(3, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    hidden = torch.stack([torch.randperm(16, generator=g) < 10 for _ in range(3)])
    return method, {"views": views, "mask": hidden, "label": torch.zeros(3)}


def _official_mae_decoder(decoder, encoded, hidden):
    """mmselfsup's MAEPretrainDecoder (CMAE's neck) on one image: decoder_embed; mask tokens appended and put back in
    place (ids_restore), the class token first; positions (the class token's a zero vector); blocks, norm, the
    prediction; the class token dropped."""
    x = decoder.embed(encoded)
    tokens = decoder.mask_token[0].expand(len(hidden), -1).clone()
    tokens[~hidden] = x[1:]
    x = torch.cat([x[:1], tokens + decoder.positions[0].double()])
    for block in decoder.blocks:
        x = block(x[None])[0]
    return decoder.predict(decoder.norm(x))[1:]


def _official_cmae_loss(method, batch, target_final_norm=False):
    """ZhichengHuang/CMAE cmae.py and cmae_head.py, per image: the online encoder (final norm on) on the class token and
    the visible patches; the pixel decoder, and the MSE against the patches standardised with the unbiased variance +
    1e-6, over the hidden patches; the feature decoder's mean over every patch, projector, predictor; the target
    encoder (final_norm=False) on the whole target view, its patch tokens' mean, the target projector; the head:
    ct_weight x 2t x cross-entropy of normalised predictions against every normalised key, divided by t."""
    vit, teacher = method.backbone, method.teacher[0]
    (online, target), masks = batch["views"], batch["mask"]
    errors, pooled, keys = [], [], []
    for image, view, hidden in zip(online, target, masks):
        patches = vit.patch_embed(image[None])[0] + vit.pos_embed[0, 1:]
        x = torch.cat([vit.cls_token[0] + vit.pos_embed[0, :1], patches[~hidden]])
        for block in vit.blocks:
            x = block(x[None])[0]
        x = vit.norm(x)
        pixels = patchify(image[None], 4)[0]
        want = (pixels - pixels.mean(-1, keepdim=True)) / (pixels.var(-1, keepdim=True) + 1e-6) ** 0.5
        error = ((_official_mae_decoder(method.pixel_decoder, x, hidden) - want) ** 2).mean(-1)
        errors.append(error[hidden])
        pooled.append(_official_mae_decoder(method.feature_decoder, x, hidden).mean(0))
        t = torch.cat(
            [
                teacher.cls_token[0] + teacher.pos_embed[0, :1],
                teacher.patch_embed(view[None])[0] + teacher.pos_embed[0, 1:],
            ]
        )
        for block in teacher.blocks:
            t = block(t[None])[0]
        keys.append((teacher.norm(t) if target_final_norm else t)[1:].mean(0))
    prediction = F.normalize(method.predictor(method.projector(torch.stack(pooled))), dim=1)
    with torch.no_grad():
        key = F.normalize(method.teacher[1](torch.stack(keys)), dim=1)
    t = method.cfg.temperature
    contrast = F.cross_entropy(prediction @ key.T / t, torch.arange(len(key)))
    return torch.cat(errors).mean() + method.cfg.contrastive_weight * 2 * t * contrast


def test_cmae_is_the_official_model_and_head_in_value_and_gradient():
    """Against the official model written out image by image. Told apart: the target encoder with its final norm (the
    official target has final_norm=False)."""
    method, batch = _cmae_case()
    got = method(batch)["loss"]
    want = _official_cmae_loss(method, batch)
    params = [
        method.backbone.blocks[0].attn.qkv.weight,
        method.pixel_decoder.mask_token,
        method.feature_decoder.predict.weight,
        method.projector[0].weight,
        method.predictor[-1].weight,
    ]
    _assert_same_value_and_gradient(got, want, params, rel=1e-10)
    normed = _official_cmae_loss(method, batch, target_final_norm=True)
    assert abs(normed.item() - got.item()) > 1e-3 * got.item()


# --- CrossMAE --------------------------------------------------------------------------------------------------------


def _crossmae_case():
    """A CrossMAE on the tiny ViT (2 blocks, 4 x 4 patches), its decoder 2 blocks of width 16, and 2 images whose masks
    hide 12 patches and predict 5 of them."""
    from solo.methods.crossmae import CrossMAE, CrossMAEConfig

    cfg = CrossMAEConfig(
        mask_ratio=0.75, predict_ratio=0.3125, decoder_embed_dim=16, decoder_depth=2, decoder_heads=2
    )  # fmt: skip
    method = CrossMAE(_tiny_vit(7), 32, cfg).double()
    method.feeds_probe = False
    g = _generator(33)
    images = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)
    hidden = torch.zeros(2, 16, dtype=torch.bool)
    predicted = torch.zeros(2, 16, dtype=torch.bool)
    for i in range(2):
        order = torch.randperm(16, generator=g)
        hidden[i, order[:12]] = True
        predicted[i, order[:5]] = True
    return method, {"views": [images], "mask": torch.stack([hidden, predicted], dim=1), "label": torch.zeros(2)}


def _official_crossmae_loss(method, batch):
    """TonyLianLong/CrossMAE models_cross.py with --weight_fm --use_input --norm_pix_loss, written out per image: the
    encoder's input (class token, then the visible patches' embeddings plus positions, in order) and each block's
    output; for decoder block i, the maps weighted by row i of the wfm matrix, LayerNormed (dec_norms[i]); each
    predicted patch's query, the mask token plus its sine-cosine position, through pre-norm cross-attention (softmax
    of q k^T / sqrt(head dim) per head) and the MLP; decoder_norm, decoder_pred; the mean squared error against the
    patch's pixels standardised with the unbiased variance + 1e-6, over every predicted patch."""
    vit, decoder = method.backbone, method.decoder
    images, masks = batch["views"][0], batch["mask"]
    errors = []
    for image, hidden, predicted in zip(images, masks[:, 0], masks[:, 1]):
        patches = vit.patch_embed(image[None])[0] + vit.pos_embed[0, 1:]
        x = torch.cat([vit.cls_token[0] + vit.pos_embed[0, :1], patches[~hidden]])
        maps = [x]
        for block in vit.blocks:
            x = block(x[None])[0]
            maps.append(x)
        pixels = patchify(image[None], 4)[0]
        for at in predicted.nonzero().flatten():
            q = decoder.mask_token + decoder.positions.double()[at]
            for i, block in enumerate(decoder.blocks):
                mixed = sum(decoder.mix.weight[i, k] * maps[k] for k in range(len(maps)))
                context = decoder.context_norms[i](mixed)
                heads, width = block.heads, q.shape[0]
                query = block.query(block.norm1(q)).reshape(heads, -1)
                key, value = block.key_value(context).reshape(len(context), 2, heads, -1).unbind(1)
                attended = []
                for h in range(heads):
                    weights = torch.softmax(key[:, h] @ query[h] / math.sqrt(width // heads), dim=0)
                    attended.append(weights @ value[:, h])
                q = q + block.project(torch.cat(attended))
                q = q + block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(q))))
            out = decoder.predict(decoder.norm(q))
            target = pixels[at]
            target = (target - target.mean()) / (target.var() + 1e-6) ** 0.5
            errors.append(((out - target) ** 2).mean())
    return torch.stack(errors).mean()


def test_crossmae_is_the_official_decoder_and_loss_in_value_and_gradient():
    """Against the official model written out query by query. Told apart: the same decoder reading only the last
    block's output (MAE's single context, no weighted feature maps)."""
    method, batch = _crossmae_case()
    got = method(batch)["loss"]
    want = _official_crossmae_loss(method, batch)
    params = [method.decoder.mix.weight, method.backbone.blocks[0].attn.qkv.weight, method.decoder.mask_token]
    _assert_same_value_and_gradient(got, want, params, rel=1e-10)
    with torch.no_grad():
        method.decoder.mix.weight.copy_(torch.tensor([[0.0, 0.0, 1.0]] * 2))
        last_only = method(batch)["loss"]
        method.decoder.mix.weight.copy_(torch.ones(2, 3) / 3)
        mixed = method(batch)["loss"]
    assert abs(last_only.item() - mixed.item()) > 1e-3 * mixed.item()


def test_crossmae_queries_see_the_visible_patches_only_and_not_each_other():
    """A predicted patch's output depends on the visible pixels, on neither the hidden pixels nor which other patches
    are predicted (no self-attention among the queries); the loss reads the predicted patches' pixels only."""
    method, batch = _crossmae_case()
    images, masks = batch["views"][0], batch["mask"]

    def with_pixels(patch, delta=1.0):
        changed = images.clone()
        row, col = divmod(patch, 4)
        changed[:, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] += delta
        return changed

    before = method.encode(batch)
    visible = int((~masks[0, 0]).nonzero()[0])
    hidden_not_predicted = int((masks[0, 0] & ~masks[0, 1]).nonzero()[0])
    assert not torch.equal(
        method.encode({**batch, "views": [with_pixels(visible)]})["prediction"], before["prediction"]
    )
    after = method.encode({**batch, "views": [with_pixels(hidden_not_predicted)]})
    assert torch.equal(after["prediction"], before["prediction"])
    assert method(batch)["loss"] == method({**batch, "views": [with_pixels(hidden_not_predicted)]})["loss"]
    fewer = masks.clone()
    first = method.predicted_positions(masks)[:, :1]
    fewer[:, 1] = False
    fewer[:, 1].scatter_(1, first, True)
    alone = method.encode({**batch, "mask": fewer})
    torch.testing.assert_close(alone["prediction"][:, 0], before["prediction"][:, 0], rtol=1e-12, atol=1e-12)


def test_crossmae_masks_predict_a_share_of_all_patches_among_the_hidden():
    from solo.data.views.masks import PredictedRandomMask

    generator = PredictedRandomMask(196, 0.75, 0.25)
    for seed in range(5):
        hidden, predicted = generator(random.Random(seed))
        assert int(hidden.sum()) == 147 and int(predicted.sum()) == 49
        assert not (predicted & ~hidden).any()


# --- Franca ----------------------------------------------------------------------------------------------------------


def _level_weights(levels, level: int, detach: bool = False) -> tuple[list, torch.Tensor]:
    """Level `level`'s weights out of solo's NestedLevels (its levels' layers side by side), one (weight, bias) per
    linear layer and the prototypes, as the official head holds them level by level."""
    count = len(levels.widths)
    own = (lambda t: t.detach()) if detach else (lambda t: t)
    linear = [
        (levels.projections[level].weight, levels.projections[level].bias),
        (levels.inputs[level].weight, levels.inputs[level].bias),
        *((layer.weight[level], layer.bias.view(count, -1)[level]) for layer in (levels.hidden, levels.bottleneck)),
    ]
    return [(own(w), own(b)) for w, b in linear], own(levels.last_layers[level].weight)


def _official_level(weights: tuple[list, torch.Tensor], x, width, normalise_bottleneck=False):
    """One level of valeoai/Franca's MRLDINOHead written out (without BatchNorm): a square linear layer on the first
    `width` features, three linear layers each followed by GELU, the prototypes at unit norm (solo's convention)."""
    (square, *mlp), w = weights
    h = F.linear(x[:, :width], *square)
    for layer in mlp:
        h = F.gelu(F.linear(h, *layer))
    if normalise_bottleneck:  # DINOv2's head: the slip to reject
        h = F.normalize(h, dim=1)
    return h @ (w / w.norm(dim=1, keepdim=True)).T


def _official_franca(method, views, mask, centering, normalise_bottleneck=False, reduce_levels=sum, teacher_too=False):
    """Franca's DINO and iBOT losses for two global crops as its ssl_meta_arch computes them, level by level: the
    student's class tokens against the teacher's targets of the other crop, the mean over the 2B rows; each masked
    patch's cross-entropy weighted by 1 / its image's masked patches, summed, over the 2B crops; the levels summed.
    `normalise_bottleneck` L2-normalises the student's bottleneck, and with `teacher_too` the teacher's as well."""
    vit, teacher_vit = method.backbone, method.teacher[0]
    student = [output_tokens(vit, v, m, method.mask_token) for v, m in zip(views, mask.unbind(1))]
    with torch.no_grad():
        teacher = [output_tokens(teacher_vit, v) for v in views]
    masks = torch.cat(list(mask.unbind(1)))  # (2B, P), crop 0's images first
    weights = (1 / masks.sum(1).clamp(min=1).double())[:, None].expand_as(masks)[masks]  # the code's, in float64
    student_cls, teacher_cls = (
        torch.cat([s[:, 0] for s in student]),
        torch.cat([t[:, 0] for t in teacher]),
    )
    student_patches = torch.cat([s[:, 1:] for s in student])[masks]
    teacher_patches = torch.cat([t[:, 1:] for t in teacher])[masks]
    n = len(views[0])
    swapped = torch.cat([teacher_cls[n:], teacher_cls[:n]])  # each student crop against the other crop's teacher
    levels, temperature = [], method.teacher_temperature.item()  # 0.04 as a float32 buffer's
    for level, width in enumerate(method.head.levels.widths):
        mine, frozen = _level_weights(method.head.levels, level), _level_weights(method.teacher[1].levels, level, True)
        t_cls, t_patch = (
            _official_level(frozen, x, width, normalise_bottleneck and teacher_too) for x in (swapped, teacher_patches)
        )
        if centering == "sinkhorn_knopp":
            targets, patch_targets = (rank_sinkhorn(t, temperature) for t in (t_cls, t_patch))
        else:  # the first step's centres are zero
            targets, patch_targets = (F.softmax(t / temperature, dim=-1) for t in (t_cls, t_patch))
        s_cls = _official_level(mine, student_cls, width, normalise_bottleneck)
        s_patch = _official_level(mine, student_patches, width, normalise_bottleneck)
        dino = -(targets * F.log_softmax(s_cls / 0.1, dim=-1)).sum(-1).mean()
        ibot = -((patch_targets * F.log_softmax(s_patch / 0.1, dim=-1)).sum(-1) * weights).sum() / len(masks)
        levels.append(dino + ibot)
    return reduce_levels(levels)


@pytest.mark.parametrize("centering", ["sinkhorn_knopp", "centering"])
@pytest.mark.parametrize("normalize_bottleneck", [False, True])
def test_franca_is_the_official_nested_dino_and_ibot_losses_in_value_and_gradient(centering, normalize_bottleneck):
    """A ViT of width 32, three levels (8, 16 and 32 features; 4, 8 and 16 prototypes, shared by the class token and the
    patches), two global crops of 3 images with 0 to 6 masked patches: solo's loss against Franca's code written out
    level by level, in value and in the gradient of every student parameter; with DINO's centring, each level's
    centre moves with its own scores' mean. Rejected: a bottleneck L2-normalised as in DINOv2's head, and the levels
    averaged instead of summed. With method.normalize_bottleneck (the digits default), the same code with every
    level's bottleneck L2-normalised in the student and the teacher, as DINOv2's head; the official, unnormalised,
    is rejected."""
    from solo.methods.franca import Franca, FrancaConfig

    cfg = FrancaConfig(
        proj_hidden_dim=16,
        bottleneck_dim=8,
        num_prototypes=16,
        patch_prototypes=0,
        nesting_levels=3,
        koleo_weight=0.0,
        centering=centering,
        teacher_temperature=0.04,
        normalize_bottleneck=normalize_bottleneck,
    )
    method = Franca(_tiny_vit(0), 32, cfg).double()
    method.feeds_probe = False
    # Heads far from their initial near-uniform scores, the teacher's apart from the student's; at most about 4 (more
    # overflows the official Sinkhorn's exp(scores / 0.04), which has no max-shift).
    with torch.no_grad():
        for p in method.head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=_generator(2), dtype=p.dtype))
        for p in method.teacher.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=_generator(3), dtype=p.dtype))
        method.mask_token.normal_(generator=_generator(5))
    assert method.head.out_dims == [4, 8, 16] and method.head.levels.widths == [8, 16, 32]
    g = _generator(4)
    views = [torch.randn(3, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    mask = torch.zeros(3, 2, 16, dtype=torch.bool)
    mask[0, 0, [1, 2, 5, 6, 9]] = True
    mask[2, 0, [0, 15, 12]] = True
    mask[1, 1, 4:10] = True
    batch = {"views": views, "mask": mask, "label": torch.zeros(3, dtype=torch.long)}
    got = method.batch_loss(method.encode(batch), batch)["loss"]
    want = _official_franca(method, views, mask, centering, normalize_bottleneck, teacher_too=True)
    assert got.item() == pytest.approx(want.item(), rel=1e-10)
    params = [p for p in method.parameters() if p.requires_grad]
    for a, b in zip(
        torch.autograd.grad(got, params, allow_unused=True), torch.autograd.grad(want, params, allow_unused=True)
    ):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    if centering == "centering":
        with torch.no_grad():
            scores = method.teacher[1](torch.cat([output_tokens(method.teacher[0], v)[:, 0] for v in views]))
        torch.testing.assert_close(method.center, 0.1 * torch.cat([s.mean(0) for s in scores]))
    with torch.no_grad():
        for wrong in (
            _official_franca(
                method, views, mask, centering, not normalize_bottleneck, teacher_too=normalize_bottleneck
            ),
            _official_franca(
                method,
                views,
                mask,
                centering,
                normalize_bottleneck,
                reduce_levels=lambda levels: sum(levels) / len(levels),
                teacher_too=True,
            ),
        ):
            assert abs(got.item() - wrong.item()) > 1e-3 * abs(got.item())


def test_franca_masks_show_one_rolled_block_and_hide_the_drawn_share():
    """Franca's masks on a 6 x 6 grid, ratios 0.1-0.65, probability 0.5: a masked crop hides int(u x 36) patches for
    a u in the range, and shows one rolled rectangle; about half the crops are masked."""
    from solo.data.views.masks import BlockMask

    random.seed(0)
    generator = BlockMask((6, 6), 2, 0.5, 0.1, 0.65, rolled_inverse=True)
    counts = []
    for _ in range(40):
        for hidden in generator():
            count = int(hidden.sum())
            counts.append(count)
            if count:
                assert 3 <= count <= 23 and _is_rolled_block(~hidden.reshape(6, 6), 36 - count)
    assert 25 <= sum(c > 0 for c in counts) <= 55
    scattered = BlockMask((6, 6), 1, 1.0, 0.5, 0.5)  # BEiT's blocks: not one rolled rectangle's complement, mostly
    assert not all(_is_rolled_block(~hidden.reshape(6, 6), 18) for hidden in (scattered()[0] for _ in range(10)))
