"""solo.methods.base.through: the views of one size through a ViT in one call, with the outputs of one call per view; a
BatchNorm backbone still one call per view (its per-view statistics are the method's)."""

import torch

from solo.backbones import build_backbone
from solo.backbones.stochastic import drawn_per_sample, samples
from solo.methods.base import through


def _backbone(name: str, **kwargs) -> torch.nn.Module:
    backbone, _ = build_backbone({"name": name, "small_stem": False, **kwargs})
    return backbone.double().requires_grad_(False)


def _views(sizes: list[int], rows: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(rows, 3, s, s, dtype=torch.float64, generator=g) for s in sizes]


def _calls(module: torch.nn.Module) -> list[int]:
    rows: list[int] = []
    module.register_forward_hook(lambda m, inputs, out: rows.append(len(inputs[0])))
    return rows


def test_a_vit_takes_each_crop_size_in_one_call_and_gives_each_view_its_own_output():
    """2 global 16 px views and 3 local 8 px ones: two calls (6 and 9 rows); each view's output is that of its own call
    (float64, to rounding), per-view inputs (here a scaling of each view) concatenated alongside."""
    vit = _backbone("test_vit", kwargs={"img_size": 16, "patch_size": 4, "dynamic_img_size": True})
    views = _views([16, 16, 8, 8, 8])
    rows = _calls(vit)
    out = through(vit, views)
    assert rows == [6, 9] and len(out) == 5
    rows.clear()
    want = [vit(v) for v in views]
    assert rows == [3] * 5
    for got, expected in zip(out, want):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    scales = [torch.full((3, 1, 1, 1), float(i + 1), dtype=torch.float64) for i in range(5)]
    scaled = through(vit, views, scales, forward=lambda x, scale: vit(x * scale))
    for got, v, scale in zip(scaled, views, scales):
        torch.testing.assert_close(got, vit(v * scale), rtol=1e-12, atol=1e-12)


def test_a_batchnorm_backbone_takes_each_view_apart():
    """A ResNet in training mode: one call per view, as the method's per-view statistics need; one call on the
    concatenated views (the known-wrong variant for BatchNorm) gives other outputs."""
    resnet = _backbone("test_resnet")
    views = _views([16, 16])
    rows = _calls(resnet)
    out = through(resnet, views)
    assert rows == [3, 3]
    torch.testing.assert_close(out[0], resnet(views[0]), rtol=0, atol=0)
    joined = resnet(torch.cat(views))[:3]
    assert float((joined - out[0]).abs().max()) > 1e-3


def test_stochastic_depth_in_a_concatenated_call_draws_per_sample_and_view():
    """Drop path in a ViT, drawn per sample: a micro-batch's concatenated call gives its samples' rows of the whole
    batch's concatenated call, each view its own masks."""
    vit = _backbone("test_vit", drop_path_rate=0.5, kwargs={"img_size": 16, "patch_size": 4})
    views, index = _views([16, 16], rows=4), torch.arange(10, 14)
    with drawn_per_sample(0, 3):
        with samples(index):
            whole = through(vit, views)
        with samples(index[2:]):
            part = through(vit, [v[2:] for v in views])
    for got, expected in zip(part, whole):
        torch.testing.assert_close(got, expected[2:], rtol=1e-12, atol=1e-12)
