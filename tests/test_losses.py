"""Single-process values of the losses against textbook formulas written independently, and input errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from solo.losses import barlow_twins_loss, clip_loss, nt_xent_loss


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
        i2t += -math.log(math.exp(scale * float(img[i] @ txt[i])) / sum(math.exp(scale * float(img[i] @ txt[j])) for j in range(n)))
        t2i += -math.log(math.exp(scale * float(txt[i] @ img[i])) / sum(math.exp(scale * float(txt[i] @ img[j])) for j in range(n)))
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
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(4, 3), 0.0), "temperature must be a finite number > 0, got 0.0"),
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
