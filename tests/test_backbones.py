import pytest
import torch

from solo.backbones import create_backbone


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


def test_small_stem_on_vit_rejected():
    with pytest.raises(ValueError, match="small_stem.*patch_size"):
        create_backbone("test_vit", small_stem=True)
