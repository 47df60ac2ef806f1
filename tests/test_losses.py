"""Single-process values of the losses against textbook formulas written independently, and input errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from solo.losses import (
    barlow_twins_loss,
    byol_loss,
    clip_loss,
    dino_center,
    dino_loss,
    masked_center,
    mocov3_loss,
    nt_xent_loss,
    siglip_loss,
    sinkhorn,
    swav_loss,
    vicreg_loss,
    whiten,
)
from solo.losses._checks import host_reads_deferred
from solo.train.host_reads import HostReads


def _pairs(n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    return z1, z1 + 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64)


def test_nt_xent_matches_per_anchor_definition():
    z1, z2 = _pairs()
    t = 0.3
    views = [F.normalize(v, dim=0) for v in list(z1) + list(z2)]  # 2N views; i and i+N are a pair
    n = z1.shape[0]
    total = 0.0
    for i, a in enumerate(views):
        positive = (i + n) % (2 * n)
        sims = [float(a @ b) / t for b in views]
        denom = sum(math.exp(s) for k, s in enumerate(sims) if k != i)
        total += -math.log(math.exp(sims[positive]) / denom)
    assert float(nt_xent_loss(z1, z2, t)) == pytest.approx(total / (2 * n), rel=1e-12)


def test_clip_matches_symmetric_cross_entropy_definition():
    img, txt = (F.normalize(v, dim=1) for v in _pairs(seed=1))
    scale = 14.0
    n = img.shape[0]
    i2t = t2i = 0.0
    for i in range(n):
        i2t += -math.log(
            math.exp(scale * float(img[i] @ txt[i])) / sum(math.exp(scale * float(img[i] @ txt[j])) for j in range(n))
        )
        t2i += -math.log(
            math.exp(scale * float(txt[i] @ img[i])) / sum(math.exp(scale * float(txt[i] @ img[j])) for j in range(n))
        )
    assert float(clip_loss(img, txt, scale)) == pytest.approx((i2t + t2i) / (2 * n), rel=1e-12)


def test_barlow_twins_matches_batchnorm_and_elementwise_sum():
    z1, z2 = _pairs(n=7, d=4, seed=2)
    lambd = 0.01
    bn = torch.nn.BatchNorm1d(4, affine=False).double().train()
    a, b = bn(z1), bn(z2)
    c = a.T @ b / z1.shape[0]
    expected = sum(
        (1 - float(c[i, j])) ** 2 if i == j else lambd * float(c[i, j]) ** 2 for i in range(4) for j in range(4)
    )
    assert float(barlow_twins_loss(z1, z2, lambd)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss", ["nt_xent", "clip"])
def test_logits_in_float32_under_bf16_autocast(loss):
    z1, z2 = (F.normalize(v.float(), dim=1) for v in _pairs(n=16, d=32))
    fn = {"nt_xent": lambda a, b: nt_xent_loss(a, b, 0.1), "clip": lambda a, b: clip_loss(a, b, 100.0)}[loss]
    exact = fn(z1, z2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = fn(z1.bfloat16(), z2.bfloat16())
    assert mixed.dtype == torch.float32
    # Only the inputs are rounded to bf16 (~3 significant digits); bf16 logits at scale 100 would be off by units.
    assert float(mixed) == pytest.approx(float(exact), rel=2e-2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(4, 5), 0.1), "feature sizes: 3 and 5"),
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(5, 3), 0.1), "batch sizes 4 and 5 differ"),
        (lambda: nt_xent_loss(torch.randn(4), torch.randn(4), 0.1), "2-D"),
        (
            lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(4, 3), 0.0),
            "temperature must be a finite number > 0, got 0.0",
        ),
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(4, 3), -1), "temperature"),
        (lambda: nt_xent_loss(torch.tensor([[1.0, float("nan")]] * 2), torch.randn(2, 2), 0.1), "z1 has non-finite"),
        (lambda: clip_loss(torch.randn(4, 3), torch.full((4, 3), float("inf")), 10.0), "text_features has non-finite"),
        (lambda: clip_loss(torch.randn(4, 3), torch.randn(4, 3), torch.tensor(-2.0)), "logit_scale"),
        (lambda: barlow_twins_loss(torch.randn(4, 3), torch.randn(3, 3), 0.005), "batch sizes 4 and 3"),
        (lambda: barlow_twins_loss(torch.randn(4, 3), torch.randn(4, 3), -0.1), "lambd"),
        (lambda: barlow_twins_loss(torch.randn(1, 3), torch.randn(1, 3), 0.005), "at least 2 samples"),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# --- BYOL, MoCo v3, VICReg, SigLIP, DINO, SwAV ------------------------------------------------------


def _views(v, n=6, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, k, generator=g, dtype=torch.float64) for _ in range(v)]


def _log_softmax(row):
    """Python floats: log softmax of a list, through the max for safety."""
    top = max(row)
    log_sum = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - log_sum for x in row]


def test_byol_is_the_squared_distance_of_normalised_vectors_and_stops_the_target_gradient():
    p, z = _pairs(seed=3)
    p.requires_grad_()
    z.requires_grad_()
    n = p.shape[0]
    # |a/|a| - b/|b||^2 = 2 - 2 cos(a, b)
    expected = sum(float(((a / a.norm() - b / b.norm()) ** 2).sum()) for a, b in zip(p.detach(), z.detach())) / n
    loss = byol_loss(p, z)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    assert p.grad is not None and z.grad is None


def test_mocov3_is_cross_entropy_against_all_keys_times_twice_the_temperature():
    q, k = _pairs(n=7, seed=4)
    q.requires_grad_()
    k.requires_grad_()
    t = 0.2
    logits = F.normalize(q.detach(), dim=1) @ F.normalize(k.detach(), dim=1).T / t
    expected = 2 * t * F.cross_entropy(logits, torch.arange(7))
    loss = mocov3_loss(q, k, t)
    assert loss.item() == pytest.approx(float(expected), rel=1e-12)
    loss.backward()
    assert q.grad is not None and k.grad is None  # the keys are the momentum teacher's


def test_vicreg_matches_torch_var_and_cov_term_by_term():
    z1, z2 = (0.5 * z for z in _pairs(n=7, d=4, seed=5))  # std < 1 in most dimensions: the hinge is active
    d = 4
    invariance = float(F.mse_loss(z1, z2))
    variance = sum(float(F.relu(1 - torch.sqrt(z.var(dim=0, unbiased=True) + 1e-4)).mean()) for z in (z1, z2)) / 2
    covariance = 0.0
    for z in (z1, z2):
        c = torch.cov(z.T)  # unbiased, variables in rows
        covariance += sum(float(c[i, j]) ** 2 for i in range(d) for j in range(d) if i != j) / d
    assert variance > 0
    assert float(vicreg_loss(z1, z2, 1.0, 0.0, 0.0)) == pytest.approx(invariance, rel=1e-12)
    assert float(vicreg_loss(z1, z2, 0.0, 1.0, 0.0)) == pytest.approx(variance, rel=1e-12)
    assert float(vicreg_loss(z1, z2, 0.0, 0.0, 1.0)) == pytest.approx(covariance, rel=1e-12)
    expected = 25 * invariance + 25 * variance + covariance
    assert float(vicreg_loss(z1, z2)) == pytest.approx(expected, rel=1e-12)


def test_siglip_matches_an_explicit_label_matrix_in_value_and_gradients():
    image, text = (F.normalize(v, dim=1).requires_grad_() for v in _pairs(seed=6))
    scale = torch.tensor(10.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)
    n = image.shape[0]
    labels = [[1.0 if i == j else -1.0 for j in range(n)] for i in range(n)]
    expected = 0.0
    for i in range(n):
        for j in range(n):
            logit = scale.item() * (image[i] @ text[j]).item() + bias.item()
            expected += math.log1p(math.exp(-labels[i][j] * logit))  # -log sigmoid(label * logit)
    loss = siglip_loss(image, text, scale, bias)
    assert loss.item() == pytest.approx(expected / n, rel=1e-12)
    # Gradients against the same definition in torch: log(1 + exp(-label * logit)), summed, / n.
    logits = scale * image @ text.T + bias
    reference = torch.log1p(torch.exp(-torch.tensor(labels, dtype=torch.float64) * logits)).sum() / n
    inputs = (image, text, scale, bias)
    for got, want in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(reference, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_dino_matches_a_double_loop_over_views_and_samples():
    student = [v.requires_grad_() for v in _views(4, seed=7)]  # 2 global crops, then 2 local ones
    teacher = [v.requires_grad_() for v in _views(2, seed=8)]
    center = torch.tensor([0.1, -0.3, 0.2, 0.0, 0.4], dtype=torch.float64)
    ts, tt = 0.1, 0.04
    n, k = student[0].shape
    pair_losses = []
    for g in range(2):
        for v in range(4):
            if v == g:
                continue
            total = 0.0
            for i in range(n):
                q = [
                    math.exp(x)
                    for x in _log_softmax([(teacher[g][i, c].item() - center[c].item()) / tt for c in range(k)])
                ]
                log_p = _log_softmax([student[v][i, c].item() / ts for c in range(k)])
                total += -sum(q[c] * log_p[c] for c in range(k))
            pair_losses.append(total / n)
    loss = dino_loss(student, teacher, center, ts, tt)
    assert loss.item() == pytest.approx(sum(pair_losses) / len(pair_losses), rel=1e-12)
    loss.backward()
    assert all(s.grad is not None for s in student) and all(t.grad is None for t in teacher)  # a target


def test_masked_center_averages_the_valid_rows_and_keeps_the_centre_without_any():
    scores = torch.tensor([[1.0, 2.0], [10.0, 20.0], [3.0, -4.0]], dtype=torch.float64)
    center = torch.tensor([0.5, -1.0], dtype=torch.float64)
    new = masked_center(scores, torch.tensor([True, False, True]), center, 0.9)
    assert new.tolist() == pytest.approx([0.9 * 0.5 + 0.1 * 2.0, 0.9 * -1.0 + 0.1 * -1.0], rel=1e-12)  # rows 0, 2
    assert torch.equal(masked_center(scores, torch.zeros(3, dtype=torch.bool), center, 0.9), center)
    assert torch.equal(center, torch.tensor([0.5, -1.0], dtype=torch.float64))  # a new tensor


def test_dino_center_is_a_moving_average_of_the_teacher_mean_and_a_new_tensor():
    teacher = _views(2, n=5, k=3, seed=9)
    center = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    before = center.clone()
    new = dino_center(teacher, center, 0.9)
    rows = [row for t in teacher for row in t]  # every sample of every view
    mean = [sum(float(r[c]) for r in rows) / len(rows) for c in range(3)]
    assert new.tolist() == pytest.approx([0.9 * float(before[c]) + 0.1 * mean[c] for c in range(3)], rel=1e-12)
    assert torch.equal(center, before) and new is not center and not new.requires_grad


def _sinkhorn_scaling_vectors(scores, epsilon, iterations):
    """Sinkhorn-Knopp as a pair of scaling vectors: Q = N diag(r) exp(S / eps) diag(c)."""
    p = torch.exp(scores / epsilon)
    n, k = p.shape
    r = torch.ones(n, dtype=p.dtype)
    for _ in range(iterations):
        c = 1 / (k * (r[:, None] * p).sum(dim=0))
        r = 1 / (n * (p * c[None, :]).sum(dim=1))
    return n * r[:, None] * p * c[None, :]


def test_sinkhorn_matches_the_scaling_vector_form_and_ignores_a_shift():
    scores = F.normalize(_views(1, n=9, k=4, seed=10)[0], dim=1)
    codes = sinkhorn(scores, 0.05, 3)
    torch.testing.assert_close(codes, _sinkhorn_scaling_vectors(scores, 0.05, 3), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(sinkhorn(scores + 3.0, 0.05, 3), codes, rtol=1e-12, atol=1e-15)
    assert not codes.requires_grad


def test_sinkhorn_rows_sum_to_one_and_prototypes_share_the_batch():
    n, k = 12, 4
    scores = F.normalize(_views(1, n=n, k=k, seed=11)[0], dim=1).requires_grad_()
    codes = sinkhorn(scores, 0.5, 200)
    assert codes.shape == (n, k) and not codes.requires_grad
    torch.testing.assert_close(codes.sum(dim=1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(codes.sum(dim=0), torch.full((k,), n / k, dtype=torch.float64), rtol=0, atol=1e-6)
    few = sinkhorn(scores, 0.05, 3)  # SwAV's setting: rows exact, columns only roughly balanced
    torch.testing.assert_close(few.sum(dim=1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)


def test_swav_matches_a_double_loop_over_code_and_predicted_views():
    scores = [F.normalize(v, dim=1).requires_grad_() for v in _views(3, n=6, k=4, seed=12)]
    t = 0.1
    codes = [sinkhorn(s, 0.05, 3) for s in scores[:2]]
    n, k = codes[0].shape
    pair_losses = []
    for i in range(2):
        for v in range(3):
            if v == i:
                continue
            total = 0.0
            for s in range(n):
                log_p = _log_softmax([scores[v][s, c].item() / t for c in range(k)])
                total += -sum(float(codes[i][s, c]) * log_p[c] for c in range(k))
            pair_losses.append(total / n)
    loss = swav_loss(scores, t, epsilon=0.05, iterations=3, code_views=2)
    assert loss.item() == pytest.approx(sum(pair_losses) / len(pair_losses), rel=1e-12)
    loss.backward()
    assert all(s.grad is not None for s in scores)  # every view predicts


SSL_LOSSES = {
    "byol": lambda a, b: byol_loss(a, b),
    "mocov3": lambda a, b: mocov3_loss(a, b, 0.2),
    "vicreg": lambda a, b: vicreg_loss(a, b),
    "siglip": lambda a, b: siglip_loss(F.normalize(a, dim=1), F.normalize(b, dim=1), 10.0, -10.0),
    "dino": lambda a, b: dino_loss([a, b], [b, a], torch.zeros(a.shape[1]), 0.1, 0.04),
    "swav": lambda a, b: swav_loss([F.normalize(a, dim=1), F.normalize(b, dim=1)], 0.1),
}


@pytest.mark.parametrize("loss", sorted(SSL_LOSSES))
def test_self_supervised_losses_in_float32_under_bf16_autocast(loss):
    z1, z2 = (v.float() for v in _pairs(n=16, d=32))
    fn = SSL_LOSSES[loss]
    exact = fn(z1, z2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = fn(z1.bfloat16(), z2.bfloat16())
    assert mixed.dtype == torch.float32
    assert float(mixed) == pytest.approx(float(exact), rel=2e-2)  # only the inputs are rounded


def _x(n=4, k=3):
    return torch.randn(n, k, dtype=torch.float64)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: byol_loss(_x(4), _x(5)), "batch sizes 4 and 5 differ"),
        (lambda: mocov3_loss(_x(), _x(), 0.0), "temperature must be a finite number > 0, got 0.0"),
        (lambda: mocov3_loss(_x(), _x(k=4), 0.2), "q and k have different feature sizes"),
        (lambda: vicreg_loss(_x(1), _x(1)), "at least 2 samples, got 1"),
        (lambda: vicreg_loss(_x(), _x(), sim_coeff=-1.0), "sim_coeff"),
        (lambda: siglip_loss(_x(), _x(), -1.0, -10.0), "logit_scale"),
        (lambda: siglip_loss(_x(), _x(), 10.0, float("nan")), "bias must be a finite number"),
        (lambda: dino_loss([_x(), _x()], [_x()], torch.zeros(3), 0.0, 0.04), "student_temperature"),
        (lambda: dino_loss([_x(), _x()], [_x()], torch.zeros(3), 0.1, -1.0), "teacher_temperature"),
        (lambda: dino_loss([_x(), _x()], [_x()], torch.zeros(4), 0.1, 0.04), r"center must be a \(3,\) tensor"),
        (lambda: dino_loss([_x()], [_x()], torch.zeros(3), 0.1, 0.04), "student must be a list of at least 2"),
        (lambda: dino_loss([_x(), _x(k=4)], [_x()], torch.zeros(3), 0.1, 0.04), r"student\[0\] and student\[1\]"),
        (lambda: dino_loss([_x(), _x()], [_x()] * 3, torch.zeros(3), 0.1, 0.04), "teacher has 3 views"),
        (lambda: dino_center([_x()], torch.zeros(3), 1.5), "momentum"),
        (lambda: sinkhorn(_x(), 0.0, 3), "epsilon"),
        (lambda: sinkhorn(_x(), 0.05, 0), "iterations must be an int >= 1"),
        (lambda: swav_loss([_x(), _x()], 0.0), "temperature"),
        (lambda: swav_loss([_x(), _x()], 0.1, code_views=3), r"code_views must be an int in \[1, 2\]"),
        (lambda: swav_loss(_x(), 0.1), "scores must be a list"),
    ],
)
def test_bad_input_to_the_self_supervised_losses_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_whitening_a_covariance_that_is_not_positive_definite():
    """A constant embedding column makes the covariance singular, exactly: outside the training step a ValueError
    that says what to change; inside it (host_reads_deferred) NaN rows, hence a non-finite loss, which the step
    records without a host read (solo.train.step), where torch.linalg.cholesky would read (tests/test_host_reads.py)."""
    x = torch.randn(6, 3, dtype=torch.float64)
    x[:, 2] = 5.0
    with pytest.raises(ValueError, match=r"leading minor of order 3 is not.*method\.whitening_eps"):
        whiten(x, 0.0)
    with host_reads_deferred(), HostReads() as reads:
        whitened = whiten(x, 0.0)
    assert whitened.isnan().all() and not reads.found, reads.report()
