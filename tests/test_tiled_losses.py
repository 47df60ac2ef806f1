"""Tiled InfoNCE losses (solo.losses.tiled): the same values and gradients as the untiled ones, in one
process and in real gloo process groups with uneven per-rank batches; tile="auto" within its budget."""

import pytest
import torch
import torch.nn.functional as F

from solo.losses import LOSSES, clip_loss, nt_xent_loss, tiled
from solo.losses.check import TOLERANCE, run_check
from solo.losses.tiled import auto_tile, resolve_tile, tiled_logsumexp

REL = 1e-10  # float64, relative to the largest value of the same kind, as the gradient checker measures


def _pairs(n, d=6, seed=0, dtype=torch.float64, noise=0.8):
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=dtype)
    z2 = z1 + noise * torch.randn(n, d, generator=g, dtype=dtype)
    return z1, z2


def _loss_and_grads(loss: str, n: int, tile, seed: int = 0):
    """The loss and the gradients of the raw features and of the learnable temperature / logit scale."""
    z1, z2 = (v.requires_grad_() for v in _pairs(n, seed=seed))
    if loss == "nt_xent":
        scalar = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        value = nt_xent_loss(z1, z2, scalar, tile=tile)
    else:
        scalar = torch.tensor(1 / 0.07, dtype=torch.float64, requires_grad=True)
        value = clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), scalar, tile=tile)
    grads = torch.autograd.grad(value, [z1, z2, scalar])
    return value.detach(), dict(zip(["z1", "z2", "scalar"], grads))


def _assert_same(loss: str, n: int, tile):
    ref_value, ref_grads = _loss_and_grads(loss, n, None)
    value, grads = _loss_and_grads(loss, n, tile)
    assert abs(float(value - ref_value)) <= REL * abs(float(ref_value))
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    for name, g in ref_grads.items():
        assert float((grads[name] - g).abs().max()) <= REL * scale, (name, grads[name], g)
    # The learnable scalar's gradient is a sum over all n x N logits: check it on its own scale too.
    assert float((grads["scalar"] - ref_grads["scalar"]).abs()) <= REL * abs(float(ref_grads["scalar"]))


# (samples, tile): N a multiple of the tile or not (the last tile short), one tile wider than N, tile 1.
# NT-Xent has 2n candidates, CLIP n per direction.
LAYOUTS = [(12, 4), (12, 5), (7, 3), (7, 1), (7, 100), (9, 9), (9, "auto"), (2, 1)]


@pytest.mark.parametrize("n, tile", LAYOUTS, ids=[f"n{n}-tile{t}" for n, t in LAYOUTS])
@pytest.mark.parametrize("loss", ["nt_xent", "clip"])
def test_tiled_equals_untiled_in_one_process(loss, n, tile):
    _assert_same(loss, n, tile)


def test_default_is_the_untiled_path():
    z1, z2 = _pairs(8)
    assert torch.equal(nt_xent_loss(z1, z2, 0.2), nt_xent_loss(z1, z2, 0.2, tile=None))
    assert torch.equal(clip_loss(z1, z2, 5.0), clip_loss(z1, z2, 5.0, tile=None))


@pytest.mark.parametrize("tile", [1, 2, 4, 11, 50])
@pytest.mark.parametrize("with_exclude", [False, True])
def test_tiled_logsumexp_against_the_materialised_matrix(tile, with_exclude):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    c = torch.randn(11, 4, generator=g, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    exclude = torch.tensor([0, 10, 3, 4, 7]) if with_exclude else None
    weights = torch.randn(5, generator=g, dtype=torch.float64)  # a non-uniform incoming gradient

    logits = s * a @ c.T
    if with_exclude:
        logits = logits.masked_fill(F.one_hot(exclude, 11).bool(), float("-inf"))
    expected = torch.logsumexp(logits, dim=1)
    ref_grads = torch.autograd.grad((expected * weights).sum(), [a, c, s])

    got = tiled_logsumexp(a, c, s, tile, exclude=exclude)
    grads = torch.autograd.grad((got * weights).sum(), [a, c, s])
    torch.testing.assert_close(got, expected, rtol=REL, atol=0)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=REL, atol=REL * float(ref.abs().max()))


@pytest.mark.parametrize("tile", [1, 3, 8])
def test_tiled_logsumexp_of_one_tensor_against_itself(tile):
    # NT-Xent in one process passes the same tensor as anchors and candidates: one gradient buffer.
    x = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    diagonal = torch.arange(8)
    expected = torch.logsumexp((s * x @ x.T).masked_fill(torch.eye(8, dtype=torch.bool), float("-inf")), dim=1)
    weights = torch.linspace(0.5, 2.0, 8, dtype=torch.float64)
    ref_grads = torch.autograd.grad((expected * weights).sum(), [x, s])
    got = tiled_logsumexp(x, x, s, tile, exclude=diagonal)
    grads = torch.autograd.grad((got * weights).sum(), [x, s])
    torch.testing.assert_close(got, expected, rtol=REL, atol=0)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=REL, atol=REL * float(ref.abs().max()))


def test_tiled_logsumexp_with_a_python_scale_and_a_one_column_tile_that_is_only_excluded():
    a = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    # Row 0's only column in tile 0 is excluded (a tile of -inf), as is row 1's in tile 1.
    got = tiled_logsumexp(a, c, 3.0, 1, exclude=torch.tensor([0, 1, 0]))
    expected = torch.stack([3.0 * a[0] @ c[1], 3.0 * a[1] @ c[0], 3.0 * a[2] @ c[1]])
    torch.testing.assert_close(got, expected, rtol=REL, atol=0)
    got.sum().backward()
    assert torch.isfinite(a.grad).all() and torch.isfinite(c.grad).all()


# --- real gloo process groups, uneven per-rank batches ---------------------------------------------------

TILED = ["nt_xent_tiled", "clip_tiled"]
# Further tiles through the checker's "module:function" specs: tile 1 and "auto" (one tile, N columns).
EXTRA = ["tests.test_tiled_losses:nt_xent_tile_1", "tests.test_tiled_losses:clip_tile_auto"]


def nt_xent_tile_1(z1, z2):
    return nt_xent_loss(z1, z2, temperature=0.5, tile=1)


def clip_tile_auto(z1, z2):
    return clip_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), 10.0, tile="auto")


def test_tiled_cases_are_registered_next_to_their_losses():
    assert set(TILED) <= set(LOSSES.names())
    assert LOSSES["nt_xent_tiled"].target.__module__ == LOSSES["nt_xent"].target.__module__
    assert LOSSES["clip_tiled"].learnable == {"logit_scale": pytest.approx(1 / 0.07)}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.processes
def test_tiled_losses_exact_in_gloo_process_groups(world):
    results = run_check(TILED + EXTRA, world)
    layouts = {r.layout for r in results}
    assert len(results) == 3 * len(TILED + EXTRA) and any(0 in layout for layout in layouts)  # uneven, one rank empty
    for r in results:
        assert r.loss_error <= TOLERANCE and r.grad_error <= TOLERANCE, r
    clip = [r for r in results if r.spec == "clip_tiled"]
    assert all("scalars.logit_scale" in r.param_errors for r in clip)


# --- tile="auto", bad tiles, autocast --------------------------------------------------------------------


def test_auto_tile_is_the_widest_within_the_budget():
    budget = tiled.TILE_BUDGET_BYTES
    for n, total in [(131072, 131072), (4096, 65536), (1000, 7), (3, 5), (10**9, 100)]:
        tile = auto_tile(n, total, 4)
        assert 1 <= tile <= total
        assert tile == total or tile == 1 or (n * tile * 4 <= budget < n * (tile + 1) * 4)
    assert auto_tile(131072, 131072, 4) == 128  # 2 x 65,536 NT-Xent views in one process, float32
    assert auto_tile(1000, 7, 4) == 7  # all in one tile
    assert auto_tile(10**9, 100, 4) == 1  # even one column is over budget: never 0
    assert resolve_tile("auto", 4096, 65536, torch.float64) == budget // (4096 * 8)


def test_auto_tile_is_used_by_the_losses(monkeypatch):
    n = 9
    monkeypatch.setattr(tiled, "TILE_BUDGET_BYTES", n * 4 * 8)  # 4 float64 columns for 9 CLIP anchors
    seen = []
    apply = tiled._TiledLogSumExp.apply
    monkeypatch.setattr(tiled._TiledLogSumExp, "apply", lambda *args: seen.append(args[3]) or apply(*args))
    _assert_same("clip", n, "auto")
    assert seen and set(seen) == {4}
    seen.clear()
    _assert_same("nt_xent", n, "auto")  # 2n = 18 anchors: 2 columns
    assert seen and set(seen) == {2}


@pytest.mark.parametrize("tile", [0, -3, 2.5, "big", True])
def test_bad_tile_is_a_clear_error(tile):
    z1, z2 = _pairs(4)
    with pytest.raises(ValueError, match="tile must be a positive int, 'auto' or None"):
        nt_xent_loss(z1, z2, 0.1, tile=tile)
    with pytest.raises(ValueError, match="tile must be a positive int"):
        clip_loss(z1, z2, 10.0, tile=tile)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(5, 3), 0.1, tile=2), "batch sizes 4 and 5 differ"),
        (lambda: nt_xent_loss(torch.randn(4, 3), torch.randn(4, 3), 0.0, tile=2), "temperature must be a finite"),
        (lambda: clip_loss(torch.randn(4, 3), torch.full((4, 3), float("inf")), 10.0, tile=2), "non-finite"),
        (lambda: clip_loss(torch.randn(4, 3), torch.randn(4, 3), torch.tensor(-2.0), tile="auto"), "logit_scale"),
    ],
)
def test_inputs_are_checked_as_untiled(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("loss", ["nt_xent", "clip"])
def test_tiled_computes_in_float32_under_bf16_autocast(loss):
    # Noisy pairs: a loss well above 0 even at logit scale 100, so that a relative comparison means something.
    z1, z2 = (F.normalize(v.float(), dim=1) for v in _pairs(n=16, d=32, noise=3.0))
    fn = {
        "nt_xent": lambda a, b, t: nt_xent_loss(a, b, 0.1, tile=t),
        "clip": lambda a, b, t: clip_loss(a, b, 100.0, tile=t),
    }[loss]
    exact = fn(z1, z2, None)
    assert float(exact) > 0.1
    a, b = (v.bfloat16().requires_grad_() for v in (z1, z2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = fn(a, b, 5)
        mixed.backward()  # the backward under autocast too: its matrix products stay in float32
    assert mixed.dtype == torch.float32 and a.grad.dtype == torch.bfloat16
    assert float(mixed.detach()) == pytest.approx(float(exact), rel=2e-2)
    a32, b32 = (v.float().requires_grad_() for v in (a.detach(), b.detach()))
    fn(a32, b32, None).backward()  # untiled on the same bf16-rounded inputs, in float32
    torch.testing.assert_close(a.grad.float(), a32.grad, rtol=2e-2, atol=2e-2 * float(a32.grad.abs().max()))


@pytest.mark.parametrize("noise", [0.3, 3.0], ids=["saturated", "hard"])
@pytest.mark.parametrize("loss", ["nt_xent", "clip"])
def test_float32_tiled_is_as_accurate_as_untiled(loss, noise):
    # lse - positive is a difference of two large numbers (|logits| up to 100 here): summed in float32, or
    # with lse rounded to float32, the loss came out ~1e-6 off, and slightly negative on saturated batches.
    z1, z2 = _pairs(2048, d=64, seed=5, noise=noise)
    fn = {
        "nt_xent": lambda a, b, t: nt_xent_loss(a, b, 0.1, tile=t),
        "clip": lambda a, b, t: clip_loss(F.normalize(a, dim=1), F.normalize(b, dim=1), 100.0, tile=t),
    }[loss]
    exact = float(fn(z1, z2, None))
    for tile in [None, 300]:
        assert float(fn(z1.float(), z2.float(), tile)) == pytest.approx(exact, abs=2e-6, rel=1e-7), tile
