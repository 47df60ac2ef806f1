import pytest
import torch

from solo.backbones import create_backbone
from solo.errors import ConfigError


def _features(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("name", ["resnet18", "resnet18d", "torchvision.resnet18"])
def test_small_stem_keeps_resolution(name):
    model, width = create_backbone(name, small_stem=True)
    first = model.conv1[0] if isinstance(model.conv1, torch.nn.Sequential) else model.conv1
    assert first.kernel_size == (3, 3) and first.stride == (1, 1) and first.bias is None

    seen = {}
    model.layer1.register_forward_hook(lambda m, inp, out: seen.update(size=inp[0].shape[-2:]))
    out = _features(model, torch.randn(2, 3, 16, 16))

    assert seen["size"] == (16, 16)  # no stride-2 conv or max-pool before layer1
    assert width == 512 and out.shape == (2, width)


def test_torchvision_width_matches_output():
    model, width = create_backbone("torchvision.resnet50")
    assert width == 2048
    assert _features(model, torch.randn(1, 3, 32, 32)).shape == (1, width)


def test_timm_vit_with_model_kwargs():
    model, width = create_backbone("vit_tiny_patch16_224", img_size=32, patch_size=4)
    assert width == model.num_features == 192
    assert _features(model, torch.randn(3, 3, 32, 32)).shape == (3, width)


def test_unknown_name_suggests_close_matches():
    with pytest.raises(ValueError, match="resnet18") as err:
        create_backbone("resnet181")
    assert "torchvision." in str(err.value)


def test_non_resnet_torchvision_rejected():
    with pytest.raises(ValueError, match="torchvision.resnet50"):
        create_backbone("torchvision.vgg16")


@pytest.mark.parametrize("name", ["test_vit", "torchvision.resnet18"])
def test_a_keyword_the_model_does_not_take_names_the_key_and_how_to_drop_it(name):
    """resnet18_half's kwargs.channels left over when backbone.name picks another model: one line, not timm's or
    torchvision's TypeError."""
    with pytest.raises(ConfigError, match=r"backbone.kwargs.channels: .* takes no keyword 'channels'.*~backbone"):
        create_backbone(name, channels=[32, 64, 128, 256])


def test_small_stem_on_vit_rejected():
    with pytest.raises(ValueError, match="small_stem.*patch_size"):
        create_backbone("test_vit", small_stem=True)


def test_stochastic_depth_and_dropout_draw_per_sample_whoever_computes_it():
    """A sample's mask depends on (seed, step, sample, module, call, view) only: the same sample among other samples,
    alone, or as the other part of a micro-batch gets the same mask; another step, seed or sample another one. The
    drop rate is the one asked for, and kept rows are scaled by 1 / keep as timm's."""
    from solo.backbones import build_backbone
    from solo.backbones.stochastic import Draws, Dropout, DropPath

    vit, _ = build_backbone(
        {"name": "test_vit", "drop_path_rate": 0.5, "small_stem": False, "kwargs": {"img_size": 16}}
    )
    assert any(isinstance(m, DropPath) for m in vit.modules())
    drop, dropout = DropPath(0.3), Dropout(0.4)
    drop.key, dropout.key = 11, 12
    x = torch.ones(2000, 3, dtype=torch.float64)
    index = torch.arange(1000)

    def masks(module, index, seed=0, step=5, rows=None):
        draws = Draws(seed, torch.device("cpu")).attach(torch.nn.Sequential(drop, dropout))
        draws.set_step(step)
        with draws.on(index):
            return module(x[: 2 * len(index)] if rows is None else x[:rows])  # two views of each sample

    whole = masks(drop, index)
    assert set(whole.unique().tolist()) == {0.0, 1 / 0.7}
    assert abs(float((whole == 0).double().mean()) - 0.3) < 0.03
    # Sample 7 in a batch of 1000, alone, and second in a micro-batch: its two views' masks are the same.
    for part in (torch.tensor([7]), torch.tensor([900, 7, 3])):
        got = masks(drop, part).view(2, len(part), 3)
        assert torch.equal(got[:, (part == 7).nonzero().item()], whole.view(2, 1000, 3)[:, 7])
    for other in ({"step": 6}, {"seed": 1}):
        assert not torch.equal(masks(drop, index, **other), whole)
    assert not torch.equal(whole[:1000], whole[1000:])  # each view its own
    elements = masks(dropout, index)
    assert abs(float((elements == 0).double().mean()) - 0.4) < 0.02
    assert torch.equal(masks(dropout, index[7:9]), elements.view(2, 1000, 3)[:, 7:9].reshape(4, 3))
    with pytest.raises(RuntimeError, match="whole views"):
        masks(drop, index[:10], rows=25)
    drop.eval()
    assert torch.equal(masks(drop, index), x)


def test_a_teacher_is_built_without_stochastic_depth():
    from solo.backbones import build_backbone
    from solo.backbones.stochastic import DropPath
    from solo.methods.base import make_teacher

    vit, _ = build_backbone(
        {"name": "test_vit", "drop_path_rate": 0.5, "small_stem": False, "kwargs": {"img_size": 16}}
    )
    teacher = make_teacher(vit)
    student = [m.drop_prob for m in vit.modules() if isinstance(m, DropPath)]
    assert len(student) > 1 and all(p > 0 for p in student)
    assert [m.drop_prob for m in teacher.modules() if isinstance(m, DropPath)] == [0.0] * len(student)


def test_attention_dropout_which_cannot_be_drawn_per_sample_is_refused():
    from solo.backbones import build_backbone
    from solo.errors import ConfigError

    with pytest.raises(ConfigError, match="attn_drop_rate"):
        build_backbone({"name": "test_vit", "small_stem": False, "kwargs": {"img_size": 16, "attn_drop_rate": 0.1}})


def test_registers_are_read_by_no_pool_and_refused_outside_a_vit():
    """backbone.num_registers=2: timm's ViT gains 2 learnt tokens after the class token; the pooled feature is still
    the class token's output (or, pool=mean, the patch tokens' mean), never a register's; the registers change it (the
    blocks attend to them). A ResNet or torchvision model has no registers: one line naming the key."""
    from solo.backbones import build_backbone
    from solo.backbones.vit import pool_patch_tokens
    from solo.errors import ConfigError

    vit_cfg = {"name": "test_vit", "small_stem": False, "kwargs": {"img_size": 16, "patch_size": 4}}
    torch.manual_seed(0)
    vit, _ = build_backbone(vit_cfg | {"num_registers": 2})
    vit.eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = vit.forward_features(images)  # (B, 1 + 2 + 16, D), prefix first
        assert vit.num_prefix_tokens == 3 and tokens.shape[1] == 19
        torch.testing.assert_close(vit(images), tokens[:, 0])
        pool_patch_tokens(vit)
        torch.testing.assert_close(vit(images), tokens[:, 3:].mean(dim=1))
        vit.reg_token.add_(torch.randn_like(vit.reg_token))  # not a constant: each token is layer-normalised
        assert not torch.allclose(vit(images), tokens[:, 3:].mean(dim=1))
    for name in ("resnet18", "torchvision.resnet18"):
        with pytest.raises(ConfigError, match=f"backbone.num_registers=2: .*backbone.name={name} is not one"):
            build_backbone({"name": name, "small_stem": False, "num_registers": 2})


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("resnet18", {}),  # timm's ResNet: its global_pool
        ("torchvision.resnet18", {}),  # torchvision's: its avgpool
        ("convnext_atto", {}),  # timm's ConvNeXt: its head's global_pool
        ("vit_tiny_patch16_224", {"img_size": 64, "reg_tokens": 2}),  # a ViT with a class token and 2 registers
    ],
)
def test_dense_tokens_are_what_the_pool_reads_and_the_pooled_features_unchanged(name, kwargs):
    """solo.backbones.pooled_and_tokens: the backbone's own output, and its dense tokens as timm's forward_features gives
    them (a CNN's last map position by position, row-major; a ViT's patch tokens after its final norm, the class token
    and registers left out); torchvision's ResNet's map as its layer4's output."""
    from solo.backbones import pooled_and_tokens

    torch.manual_seed(0)
    backbone, _ = create_backbone(name, small_stem=False, pretrained=False, **kwargs)
    backbone.eval()
    images = torch.randn(3, 3, 64, 64)
    pooled, tokens = pooled_and_tokens(backbone, images)
    with torch.no_grad():
        torch.testing.assert_close(pooled, backbone(images))
        if name.startswith("torchvision."):
            b = backbone
            spatial = b.layer4(b.layer3(b.layer2(b.layer1(b.maxpool(b.relu(b.bn1(b.conv1(images))))))))
            want = spatial.flatten(2).mT
        elif "vit" in name:
            want = backbone.forward_features(images)[:, 3:]
            assert tokens.shape == (3, 16, 192)
        else:
            want = backbone.forward_features(images).flatten(2).mT
    torch.testing.assert_close(tokens, want)
