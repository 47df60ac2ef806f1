"""solo.methods.base.encode_views: the views of one size through a ViT in one call, with the outputs of one call per view; a
BatchNorm backbone in one call too where its BatchNorms take row groups (each view's statistics, the method's), else one
call per view."""

import copy

import torch

from solo.backbones import build_backbone
from solo.backbones.stochastic import Draws
from solo.distributed.batchnorm import group_batchnorms
from solo.methods.base import encode_views


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
    out = encode_views(vit, views)
    assert rows == [6, 9] and len(out) == 5
    rows.clear()
    want = [vit(v) for v in views]
    assert rows == [3] * 5
    for got, expected in zip(out, want):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    scales = [torch.full((3, 1, 1, 1), float(i + 1), dtype=torch.float64) for i in range(5)]
    scaled = encode_views(vit, views, scales, forward=lambda x, scale: vit(x * scale))
    for got, v, scale in zip(scaled, views, scales):
        torch.testing.assert_close(got, vit(v * scale), rtol=1e-12, atol=1e-12)


def test_a_batchnorm_backbone_takes_each_view_apart():
    """A ResNet in training mode: one call per view, as the method's per-view statistics need; one call on the
    concatenated views (the known-wrong variant for BatchNorm) gives other outputs."""
    resnet = _backbone("test_resnet")
    views = _views([16, 16])
    rows = _calls(resnet)
    out = encode_views(resnet, views)
    assert rows == [3, 3]
    torch.testing.assert_close(out[0], resnet(views[0]), rtol=0, atol=0)
    joined = resnet(torch.cat(views))[:3]
    assert float((joined - out[0]).abs().max()) > 1e-3


def test_a_batchnorm_backbone_with_row_groups_takes_the_views_of_one_size_in_one_call():
    """Its BatchNorms taking row groups (solo.distributed.batchnorm.group_batchnorms, as the trainer's models): two
    16 px views in one call of 6 rows, a 8 px one alone; each view's output, every gradient and every running statistic
    equal those of a call per view on a plain copy (float64, to rounding)."""
    resnet = _backbone("test_resnet").requires_grad_(True)
    plain = copy.deepcopy(resnet)
    group_batchnorms(resnet)
    views = _views([16, 16, 8])
    rows, plain_rows = _calls(resnet), _calls(plain)
    out, want = encode_views(resnet, views), encode_views(plain, views)
    assert rows == [6, 3] and plain_rows == [3, 3, 3]
    for got, expected in zip(out, want):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(3, *out[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for outputs in (out, want):  # a loss that weighs each view's outputs differently
        sum((o * u).sum() for o, u in zip(outputs, upstream)).backward()
    for (name, a), b in zip(resnet.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=name)
    for (name, a), b in zip(resnet.named_buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_shared_statistics_take_each_crop_size_in_one_call_as_the_multi_crop_references():
    """per_view_statistics=False (SwAV, DINO, LeJEPA, MMCR): 2 global 16 px views and 2 local 8 px ones in two calls
    of 6 rows, each without row groups, with or without BatchNorms that take them; outputs, every gradient and every
    running statistic equal the references' multi-crop forward written out (one plain call on each size's views
    concatenated; float64, to rounding). The known-wrong variant, each view's own statistics, gives other outputs."""
    resnet = _backbone("test_resnet").requires_grad_(True)
    plain, grouped = copy.deepcopy(resnet), group_batchnorms(copy.deepcopy(resnet))
    views = _views([16, 16, 8, 8])
    reference = [part for size in (views[:2], views[2:]) for part in plain(torch.cat(size)).split(3)]
    upstream = torch.randn(4, *reference[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sum((o * u).sum() for o, u in zip(reference, upstream)).backward()
    for model in (resnet, grouped):
        rows = _calls(model)
        out = encode_views(model, views, per_view_statistics=False)
        assert rows == [6, 6]
        for got, expected in zip(out, reference):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        sum((o * u).sum() for o, u in zip(out, upstream)).backward()
        for (name, a), b in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=name)
        for (name, a), b in zip(model.named_buffers(), plain.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    with torch.no_grad():
        per_view = encode_views(group_batchnorms(copy.deepcopy(plain)), views)
    assert float((per_view[0] - reference[0]).abs().max()) > 1e-3


def test_a_nested_head_with_row_grouped_batchnorm_gives_each_view_its_levels_from_one_call():
    """Franca's head (three levels, BatchNorm taking row groups) on 4 views of 5 rows: one call of 20 rows, each view
    its list of levels, equal to a call per view on a plain copy in value and gradient (float64); the known-wrong
    variant, the joined call without row groups, gives other levels."""
    from solo.methods.franca import MatryoshkaHead

    torch.manual_seed(0)
    head = MatryoshkaHead(16, 12, 6, 32, levels=3, use_bn=True).double()
    plain, ungrouped = copy.deepcopy(head), copy.deepcopy(head)
    group_batchnorms(head)
    g = torch.Generator().manual_seed(2)
    views = [torch.randn(5, 16, dtype=torch.float64, generator=g) for _ in range(4)]
    rows, plain_rows = _calls(head), _calls(plain)
    out, want = encode_views(head, views), [plain(v) for v in views]
    assert rows == [20] and plain_rows == [5] * 4 and [len(levels) for levels in out] == [3] * 4
    for outputs in (out, want):  # a loss that weighs each view's levels differently
        sum(
            ((levels[i] ** 2) * (i + 1)).sum() * (v + 1) for v, levels in enumerate(outputs) for i in range(3)
        ).backward()
    for got, expected in zip(out, want):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    scale = max(float(p.grad.abs().max()) for p in plain.parameters())  # a bias before BatchNorm: zero, to rounding
    for (name, a), b in zip(head.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12 * scale, msg=name)
    joined = ungrouped(torch.cat(views))
    assert float((joined[0][:5] - want[0][0]).abs().max()) > 1e-3


def test_stochastic_depth_in_a_concatenated_call_draws_per_sample_and_view():
    """Drop path in a ViT, drawn per sample: a micro-batch's concatenated call gives its samples' rows of the whole
    batch's concatenated call, each view its own masks."""
    vit = _backbone("test_vit", drop_path_rate=0.5, kwargs={"img_size": 16, "patch_size": 4})
    views, index = _views([16, 16], rows=4), torch.arange(10, 14)
    draws = Draws(0, torch.device("cpu")).attach(vit)
    draws.set_step(3)
    with draws.on(index):
        whole = encode_views(vit, views)
    with draws.on(index[2:]):
        part = encode_views(vit, [v[2:] for v in views])
    for got, expected in zip(part, whole):
        torch.testing.assert_close(got, expected[2:], rtol=1e-12, atol=1e-12)
