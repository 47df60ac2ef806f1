"""The masked-image pieces: solo.backbones.vit's token path against timm's own forward, the patch order against
torch's unfold, the masks drawn per sample, and the settings a masked-image method cannot use."""

import random

import pytest
import timm
import torch
import torch.nn.functional as F

from solo.backbones import create_backbone
from solo.backbones.vit import (
    embed_patches,
    keep,
    output_tokens,
    patchify,
    prefix_tokens,
    run_blocks,
    sincos_positions,
)
from solo.data import DigitsDataset
from solo.data.sampling.seeding import sample_seed, seeded_rng
from solo.data.views.augment import DeviceViews, ViewRecipe
from solo.data.views.batch_spec import PatchMasks
from solo.data.views.masks import MultiBlockMask, RandomMask
from solo.data.views.multiview import EvalDataset, MultiViewDataset, collate_raw
from solo.data.views.transforms import ViewAugmentation, build_eval_transform
from solo.errors import ConfigError
from solo.methods.ijepa import IJEPAConfig, IJEPAPredictor
from solo.train.trainer import build_model
from tests.test_accumulate import CASES
from tests.test_methods import method_overrides
from tests.test_train import TINY, compose_cfg


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # position embeddings over the class token too, dynamic image size (timm's test_vit)
        {"no_embed_class": True, "reg_tokens": 2, "dynamic_img_size": False},  # DeiT-3 / DINOv2 style prefix
    ],
)
def test_the_token_path_is_timms_forward(kwargs):
    torch.manual_seed(0)
    vit, _ = create_backbone("test_vit", img_size=16, patch_size=4, **kwargs)
    vit.eval()
    images = torch.randn(3, 3, 16, 16)
    tokens = torch.cat([prefix_tokens(vit, 3), embed_patches(vit, images)], dim=1)
    torch.testing.assert_close(run_blocks(vit, tokens), vit.forward_features(images))
    torch.testing.assert_close(output_tokens(vit, images), vit.forward_features(images), rtol=0, atol=0)


def test_smaller_crops_get_timms_resampled_positions_and_an_empty_batch_runs_through_the_backbone():
    torch.manual_seed(0)
    vit, _ = create_backbone("test_vit", img_size=16, patch_size=4)  # dynamic_img_size
    vit.eval()
    crops = torch.randn(3, 3, 8, 12)
    torch.testing.assert_close(output_tokens(vit, crops), vit.forward_features(crops), rtol=0, atol=0)
    assert output_tokens(vit, crops[:0]).shape == (0, 1 + 6, vit.embed_dim)
    assert vit(crops[:0]).shape == (0, vit.embed_dim)  # an empty rank: through output_tokens
    with pytest.raises(RuntimeError, match="0 elements"):  # timm's own forward, which the backbone replaces there
        timm.create_model("test_vit", img_size=16, patch_size=4, dynamic_img_size=True)(crops[:0])


def test_keep_takes_each_samples_visible_tokens_in_order():
    tokens = torch.randn(4, 6, 3)
    mask = torch.tensor([[1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 0]]).bool()
    torch.testing.assert_close(keep(tokens, mask, 3), tokens[~mask].view(4, 3, 3), rtol=0, atol=0)


def test_patches_are_pixels_row_major_channels_last():
    images = torch.randn(2, 3, 8, 12)
    # torch's unfold: (B, C * p * p, N) with channels first in each patch; MAE's order puts them last.
    unfolded = F.unfold(images, kernel_size=4, stride=4).view(2, 3, 4, 4, 6).permute(0, 4, 2, 3, 1).reshape(2, 6, 48)
    torch.testing.assert_close(patchify(images, 4), unfolded, rtol=0, atol=0)


def test_sine_cosine_positions():
    positions = sincos_positions(8, (3, 5))  # 2 frequencies, 1 and 1/100, for the row and for the column
    assert positions.shape == (15, 8)
    row, col = 2, 3
    expected = [
        *(torch.sin(torch.tensor([row, row / 100.0]))),
        *(torch.cos(torch.tensor([row, row / 100.0]))),
        *(torch.sin(torch.tensor([col, col / 100.0]))),
        *(torch.cos(torch.tensor([col, col / 100.0]))),
    ]
    torch.testing.assert_close(positions[row * 5 + col], torch.stack(expected))
    with pytest.raises(ConfigError, match="divisible by 4, got 6"):
        sincos_positions(6, (2, 2))


class Blank:
    """A dataset of blank 8 x 8 images."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.zeros(3, 8, 8, dtype=torch.uint8), 0


def test_masks_are_drawn_per_sample_whatever_the_batch():
    """A sample's mask is the same read alone or in any batch, differs between samples and epochs, and is the mask
    generator's draw in the sample's own seeded stream after its views."""
    generator = RandomMask(16, 0.75)
    recipe = ViewRecipe(ViewAugmentation(), 8, (0.5,) * 3, (0.5,) * 3)
    data = MultiViewDataset(Blank(), [recipe], seed=3, fields=(PatchMasks(generator),))
    batch = data.__getitems__([(0, i) for i in range(10)])
    masks = torch.stack([s["mask"] for s in batch])
    assert masks.dtype == torch.bool and (masks.sum(dim=1) == 12).all()
    assert torch.equal(data[(0, 7)]["mask"], masks[7])
    assert len({tuple(m.tolist()) for m in masks}) == 10
    assert not torch.equal(data[(1, 7)]["mask"], masks[7])
    with seeded_rng(sample_seed(3, 0, 7, 1)):
        assert torch.equal(generator(), masks[7])


MAE = CASES["mae_vit"]
MAE_ON_A_RESNET = [o for o in TINY if not o.startswith("method")] + ["method=mae", "method.decoder_embed_dim=16"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (MAE + ["method.mask_ratio=1.0"], r"method.mask_ratio=1.0: must be in \(0, 1\)"),
        (MAE + ["method.mask_ratio=0"], r"method.mask_ratio=0.*must be in \(0, 1\)"),
        (
            MAE_ON_A_RESNET,
            "method=mae masks the patches of a Vision Transformer, and the backbone is a ResNet: use backbone=vit_tiny",
        ),
        (
            MAE + ["backbone.kwargs.patch_size=5"],  # refused with the config, before the model is built
            r"data.image_size=16 does not tile into the backbone's 5 px patches \(backbone.kwargs.patch_size=5\)",
        ),
    ],
)
def test_settings_a_masked_image_method_cannot_use_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_model(compose_cfg(overrides), 10)


def test_mean_pooling_reads_the_patch_tokens():
    from solo.backbones.vit import pool_patch_tokens

    torch.manual_seed(0)
    vit, _ = create_backbone("test_vit", img_size=16, patch_size=4)
    images = torch.randn(2, 3, 16, 16)
    tokens = vit.eval().forward_features(images)
    torch.testing.assert_close(vit(images), tokens[:, 0])
    pool_patch_tokens(vit)
    torch.testing.assert_close(vit(images), tokens[:, 1:].mean(dim=1))
    resnet, _ = create_backbone("test_resnet")
    with pytest.raises(
        ConfigError, match="pool=mean averages a Vision Transformer's patch tokens, and the backbone is"
    ):
        pool_patch_tokens(resnet)


def test_drop_path_rate_reaches_timm_and_is_refused_for_torchvision():
    from solo.backbones import build_backbone

    vit, _ = build_backbone({"name": "test_vit", "drop_path_rate": 0.2, "kwargs": {"img_size": 16, "patch_size": 4}})
    rates = [getattr(block.drop_path1, "drop_prob", 0.0) for block in vit.blocks]  # a rate of 0: an Identity
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.2)  # timm's rule: rising over the blocks
    with pytest.raises(ConfigError, match="backbone.drop_path_rate: torchvision's torchvision.resnet18 has no"):
        build_backbone({"name": "torchvision.resnet18", "drop_path_rate": 0.1})


def test_block_masks_hide_rectangles_within_their_share():
    """Each crop masked with the given probability; a masked crop hides between the shares' bounds (never more than
    the upper one), as unions of rectangles: every masked patch has a masked neighbour (blocks are at least 2 wide
    or tall here, min_block 4)."""
    import random

    from solo.data.views.masks import BlockMask

    generator = BlockMask((8, 8), views=2, probability=0.5, ratio_min=0.1, ratio_max=0.5)
    assert generator.hidden == 32
    random.seed(0)
    masks = torch.stack([generator() for _ in range(400)])  # (400, 2, 64)
    counts = masks.sum(dim=-1).flatten()
    assert 0.4 < float((counts > 0).float().mean()) < 0.6
    assert int(counts.max()) <= 32 and int(counts[counts > 0].min()) >= 2
    grids = masks.view(-1, 8, 8)
    padded = F.pad(grids.float(), (1, 1, 1, 1))
    neighbours = padded[:, :-2, 1:-1] + padded[:, 2:, 1:-1] + padded[:, 1:-1, :-2] + padded[:, 1:-1, 2:]
    assert bool((neighbours[grids] > 0).all())


def test_beit_masks_hide_their_share_of_one_view_in_blocks():
    """data2vec's and MaskFeat's mask: one (patches,) mask per image, never more than the share, close to it (BEiT's
    blocks stop short only when no block fits what is left), every hidden patch with a hidden neighbour."""
    import random

    from solo.data.views.masks import BEiTMask

    generator = BEiTMask((14, 14), ratio=0.6, min_block=16)
    rng = random.Random(0)
    masks = torch.stack([generator(rng) for _ in range(200)])
    assert masks.shape == (200, 196) and masks.dtype == torch.bool
    counts = masks.sum(dim=1)
    assert int(counts.max()) <= 117 and float(counts.float().mean()) > 112
    grids = F.pad(masks.view(-1, 14, 14).float(), (1, 1, 1, 1))
    neighbours = grids[:, :-2, 1:-1] + grids[:, 2:, 1:-1] + grids[:, 1:-1, :-2] + grids[:, 1:-1, 2:]
    assert bool((neighbours[masks.view(-1, 14, 14)] > 0).all())


DINOV2 = CASES["dinov2_vit"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            DINOV2 + ["method.mask_ratio_min=0.6"],
            r"method.mask_ratio_min=0.6 is above method.mask_ratio_max=0.5: a masked crop hides a share",
        ),
        (DINOV2 + ["method.mask_ratio_max=1"], r"method.mask_ratio_max=1.*must be in \(0, 1\)"),
        (
            CASES["ijepa_vit"] + ["method.target_scale_min=0.3"],
            r"method.target_scale_min=0.3 is above method.target_scale_max=0.2: a block's scale is drawn between the two",
        ),
        (
            [o for o in DINOV2 if "dynamic_img_size" not in o] + ["+backbone.kwargs.dynamic_img_size=false"],
            "method=dinov2 runs the smaller local crops through the ViT: set backbone.kwargs.dynamic_img_size=true",
        ),
        (
            method_overrides("data2vec") + ["method.average_top_k_layers=99"],
            r"method.average_top_k_layers=99: the backbone has \d+ blocks; average at most \d+",
        ),
        (
            method_overrides("maskfeat") + ["method.hog_cell=3"],
            "method.hog_cell=3: a HOG cell must tile the 4 px patch; choose a divisor of 4",
        ),
    ],
)
def test_settings_dinov2_and_ijepa_cannot_use_are_refused(tmp_path, overrides, message):
    from solo.train.trainer import pretrain

    with pytest.raises(ConfigError, match=message):
        pretrain(compose_cfg(overrides), tmp_path)


def test_multi_block_masks_keep_their_sizes_and_leave_the_targets_out_of_the_context():
    generator = MultiBlockMask((8, 8), 4, (0.15, 0.2), (0.75, 1.5), (0.85, 1.0), min_context=10)
    # The largest target: scale 0.2 of 64 patches is 12.8; height round(sqrt(12.8 x 1.5)) = 4, width
    # round(sqrt(12.8 / 0.75)) = 4. The largest context: the whole grid.
    assert (generator.most_target, generator.most_context) == (16, 64)
    random.seed(0)
    for _ in range(100):
        masks = generator()
        assert masks.shape == (5, 64) and masks.dtype == torch.bool
        context, targets = masks[0], masks[1:]
        assert not (context & targets.any(dim=0)).any()
        assert 10 <= int(context.sum()) <= 64
        for target in targets:
            rows, cols = target.view(8, 8).nonzero().unbind(1)
            height, width = int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1
            assert int(target.sum()) == height * width <= 16  # a rectangle
    with pytest.raises(ValueError, match="no context of at least 60 patches was left beside 4 targets"):
        MultiBlockMask((8, 8), 4, (0.15, 0.2), (0.75, 1.5), (0.85, 1.0), min_context=60)()
    # I-JEPA with such masks stops when it is built, with the keys to change, not in a data worker at the first batch.
    overrides = [o for o in TINY if not o.startswith(("method.", "backbone"))] + ["method=ijepa", "backbone=vit_tiny"]
    with pytest.raises(ConfigError, match=r"no context of at least 100 patches .*\(method.min_context_patches\)"):
        build_model(compose_cfg(overrides + ["method.min_context_patches=100"]), None)


class Sizes:
    """A dataset of random images of several sizes, as ImageNet's are."""

    def __len__(self):
        return 6

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, 256, (3, 20 + 3 * index, 30 - 2 * index), dtype=torch.uint8, generator=generator), 0


@pytest.mark.parametrize("resize", [False, True])
def test_the_probe_image_is_what_validation_reads_in_the_workers_and_on_the_device(resize):
    """Each sample through the evaluation transform, as an EvalDataset gives it, whatever the training views: the
    digits (already the model's size) and images of several sizes (resized and centre-cropped; on the device those of
    one size in one call: the first and last here, one image at two epochs)."""
    base = Sizes() if resize else DigitsDataset("train", 16)
    evaluation = build_eval_transform(16, (0.3,) * 3, (0.2,) * 3, resize=resize)
    recipe = ViewRecipe(ViewAugmentation(crop_scale=[0.2, 0.5]), 16, (0.3,) * 3, (0.2,) * 3)
    keys = [(1, 0), (1, 5), (1, 3), (2, 0)]
    expected = torch.stack([EvalDataset(base, evaluation)[i]["image"] for _, i in keys])
    workers = MultiViewDataset(base, [recipe], seed=0, probe_transform=evaluation).__getitems__(keys)
    assert torch.equal(torch.stack([s["probe_image"] for s in workers]), expected)
    assert not torch.allclose(torch.stack([s["views"][0] for s in workers]), expected)
    raw = collate_raw(MultiViewDataset(base, [recipe], seed=0, raw=True).__getitems__(keys))
    on_device = DeviceViews([recipe], pairs=False, probe_transform=evaluation)(raw, torch.device("cpu"))
    torch.testing.assert_close(on_device["probe_image"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(on_device["views"][0], torch.stack([s["views"][0] for s in workers]))


def test_ijepa_probes_the_mean_patch_token_of_the_probe_image():
    torch.manual_seed(0)
    model = build_model(compose_cfg(CASES["ijepa_vit"] + ["data.batch_size=4"]), 10)
    vit, images, probe = model.method.backbone.eval(), *torch.randn(2, 4, 3, 16, 16, dtype=torch.float64)
    model.double()
    masks = torch.stack([model.method.mask_generator()() for _ in range(4)])
    batch = {"views": [images], "mask": masks, "probe_image": probe, "label": torch.zeros(4, dtype=torch.long)}
    mean_patch = vit.forward_features(probe)[:, vit.num_prefix_tokens :].mean(dim=1)
    torch.testing.assert_close(model.method.encode(batch)["features"], mean_patch)
    torch.testing.assert_close(vit(probe), mean_patch)  # what the probe and the k-NN read in evaluation


def test_dinov2_and_mae_probe_the_probe_image_not_their_masked_crops():
    """Not the class tokens DINOv2's loss reads, half of them of masked crops, nor MAE's training view."""
    torch.manual_seed(0)
    model = build_model(compose_cfg(DINOV2 + ["data.batch_size=4"]), 10)
    model.double()
    vit, method = model.method.backbone.eval(), model.method
    views = [torch.randn(4, 3, 16, 16, dtype=torch.float64) for _ in range(2)]
    views += [torch.randn(4, 3, 8, 8, dtype=torch.float64) for _ in range(4)]
    probe = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    masks = torch.ones(4, 2, 16, dtype=torch.bool)  # every patch of both global crops hidden from the student
    batch = {"views": views, "mask": masks, "probe_image": probe, "label": torch.zeros(4, dtype=torch.long)}
    mean_patch = vit.forward_features(probe)[:, vit.num_prefix_tokens :].mean(dim=1)
    torch.testing.assert_close(method.encode(batch)["features"], mean_patch)
    torch.testing.assert_close(vit(probe), mean_patch)  # what the probe and the k-NN read in evaluation

    mae = build_model(compose_cfg(MAE + ["data.batch_size=4"]), 10).double()
    vit = mae.method.backbone.eval()
    batch = {"views": views[:1], "mask": mae.method.mask_generator()()[None].expand(4, -1), "probe_image": probe}
    torch.testing.assert_close(mae.method.encode(batch)["features"], vit(probe))


def test_padding_kept_out_of_attention_changes_nothing():
    """The encoder's and I-JEPA's predictor's outputs at a sample's own tokens are those of the sample alone; padding
    that attention does not skip changes them (the known-wrong variant)."""
    torch.manual_seed(0)
    vit, _ = create_backbone("test_vit", img_size=16, patch_size=4)
    vit.eval()
    tokens = torch.randn(2, 7, vit.embed_dim)
    padded = torch.cat([tokens, torch.randn(2, 3, vit.embed_dim)], dim=1)
    attends = torch.arange(10) < 7
    alone = run_blocks(vit, tokens)
    torch.testing.assert_close(run_blocks(vit, padded, attends.expand(2, -1))[:, :7], alone)
    assert not torch.allclose(run_blocks(vit, padded)[:, :7], alone)

    cfg = IJEPAConfig(predictor_embed_dim=16, predictor_depth=2, predictor_heads=2)
    predictor = IJEPAPredictor(8, cfg, (4, 4))
    context, at = torch.randn(1, 5, 8), torch.tensor([[0, 3, 5, 9, 12]])
    targets = torch.tensor([[[1, 2, 6], [14, 15, 10]]])
    alone = predictor(context, at, torch.ones(1, 5, dtype=torch.bool), targets, torch.ones(1, 2, 3, dtype=torch.bool))
    # Two padding positions after the context, one after each target block's three
    padded_at, padded_targets = torch.tensor([[0, 3, 5, 9, 12, 0, 0]]), torch.cat([targets, targets[..., :1]], dim=2)
    valid, target_valid = torch.arange(7) < 5, torch.arange(4) < 3
    out = predictor(
        torch.cat([context, torch.randn(1, 2, 8)], dim=1),
        padded_at,
        valid[None],
        padded_targets,
        target_valid.expand(1, 2, 4),
    )
    torch.testing.assert_close(out[:, :, :3], alone)
