"""Views as parameters (solo.data.views.augment): drawn per sample, applied to a batch; checked against torchvision."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from solo.data.sampling.seeding import seeded_rng
from solo.data.views.augment import AT, JITTER, SOLARIZE_THRESHOLD, ViewRecipe, crop_box
from solo.data.views.transforms import ViewAugmentation

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EVERYTHING = ViewAugmentation(
    crop_scale=[0.08, 1.0],
    hflip_prob=0.5,
    jitter_prob=0.8,
    brightness=0.4,
    contrast=0.4,
    saturation=0.4,
    hue=0.1,
    grayscale_prob=0.2,
    blur_prob=0.5,
    solarize_prob=0.2,
)


def torchvision_view(recipe: ViewRecipe, image: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The reference: torchvision's functional ops, one sample at a time, on the float image (resized as float)."""
    top, left, h, w = (int(p[AT[k]]) for k in ("top", "left", "height", "width"))
    x = TF.resized_crop(image.float() / 255, top, left, h, w, [recipe.size, recipe.size], antialias=True)
    if p[AT["flip"]]:
        x = TF.horizontal_flip(x)
    if p[AT["jitter"]]:
        adjust = {
            "brightness": TF.adjust_brightness,
            "contrast": TF.adjust_contrast,
            "saturation": TF.adjust_saturation,
            "hue": TF.adjust_hue,
        }
        for op in p[AT["order0"] : AT["order3"] + 1].long().tolist():
            if getattr(recipe.aug, JITTER[op]) > 0:
                x = adjust[JITTER[op]](x, float(p[AT[JITTER[op]]]))
    if p[AT["grayscale"]]:
        x = TF.rgb_to_grayscale(x, num_output_channels=3)
    if p[AT["blur"]]:
        x = TF.gaussian_blur(x, [recipe.kernel] * 2, [float(p[AT["sigma"]])] * 2)
    if p[AT["solarize"]]:
        x = TF.solarize(x, SOLARIZE_THRESHOLD)
    return TF.normalize(x, list(MEAN), list(STD))


def images_and_params(recipe: ViewRecipe, n: int, same_size: bool = False):
    g = torch.Generator().manual_seed(0)
    sizes = (
        [(40, 52)] * n if same_size else [tuple(torch.randint(12, 70, (2,), generator=g).tolist()) for _ in range(n)]
    )
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]
    params = []
    for i, image in enumerate(images):
        with seeded_rng(i):
            params.append(recipe.draw(*image.shape[-2:]))
    return images, torch.stack(params)


@pytest.mark.parametrize(
    "aug",
    [
        EVERYTHING,
        ViewAugmentation(jitter_prob=1.0, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.5),  # every order, strong
        ViewAugmentation(
            crop_scale=[0.5, 1.0], hflip_prob=0.0, jitter_prob=0.0, grayscale_prob=1.0, blur_prob=1.0, solarize_prob=1.0
        ),
    ],
    ids=["simclr-like", "colour", "grey-blur-solarize"],
)
@pytest.mark.parametrize("size", [8, 32])
def test_batched_views_equal_torchvision_sample_by_sample(aug, size):
    """Every sample of a batch of images of different sizes, each with its own parameters, gets torchvision's view."""
    recipe = ViewRecipe(aug, size, MEAN, STD)
    images, params = images_and_params(recipe, 48)
    batch = recipe.apply_batch(images, params)
    assert batch.shape == (48, 3, size, size) and batch.dtype == torch.float32
    for i, (image, p) in enumerate(zip(images, params)):
        expected = torchvision_view(recipe, image, p)
        worst = float(((batch[i] - expected) * torch.tensor(STD).view(3, 1, 1)).abs().max())
        assert worst < 2e-6, (
            f"sample {i}: {worst} off torchvision's view (in [0, 1] pixel units); parameters {p.tolist()}"
        )


def test_cpu_path_is_the_batched_path_on_one_sample():
    """A view made alone in a worker (ViewRecipe called on the image) equals the same sample's view in a batch:
    the same operations, so the same pixels, whichever path makes them."""
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    images, params = images_and_params(recipe, 16, same_size=True)
    batch = recipe.apply_batch(torch.stack(images), params)
    for i, image in enumerate(images):
        with seeded_rng(i):
            alone = recipe(image)
        assert torch.allclose(alone, batch[i], atol=1e-6), i


def test_parameters_depend_on_the_seed_only():
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    with seeded_rng(7):
        a = recipe.draw(50, 60)
    torch.rand(5)  # other use of the global RNG in between changes nothing
    with seeded_rng(7):
        b = recipe.draw(50, 60)
    with seeded_rng(8):
        c = recipe.draw(50, 60)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_operations_fire_at_their_probabilities():
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    _, params = images_and_params(recipe, 4000, same_size=True)
    for field, p in [("flip", 0.5), ("jitter", 0.8), ("grayscale", 0.2), ("blur", 0.5), ("solarize", 0.2)]:
        rate = float(params[:, AT[field]].mean())
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / 4000), (field, rate)
    assert torch.all((params[:, AT["brightness"]] >= 0.6) & (params[:, AT["brightness"]] <= 1.4))
    assert torch.all(params[:, AT["hue"]].abs() <= 0.1)
    assert torch.all((params[:, AT["sigma"]] >= 0.1) & (params[:, AT["sigma"]] <= 2.0))
    orders = params[:, AT["order0"] : AT["order3"] + 1].long()
    assert torch.equal(orders.sort(dim=1).values, torch.arange(4).expand_as(orders))  # each a permutation
    assert len({tuple(o) for o in orders.tolist()}) == 24  # and all 24 occur


@pytest.mark.parametrize("height, width", [(64, 64), (30, 200), (200, 30)])
def test_crop_boxes_follow_random_resized_crop(height, width):
    """Inside the image; area fraction in the scale range and aspect in [3/4, 4/3] (up to rounding), or the
    whole image's centre with its aspect clamped when 10 tries fail (very elongated images)."""
    torch.manual_seed(0)
    for _ in range(300):
        top, left, h, w = crop_box(height, width, (0.2, 0.9))
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        fallback = (h, w) in {(height, width), (height, round(height * 4 / 3)), (round(width / (3 / 4)), width)}
        if not fallback:
            assert 0.2 - 0.05 <= h * w / (height * width) <= 0.9 + 0.05
            assert 3 / 4 - 0.1 <= w / h <= 4 / 3 + 0.1


def test_a_jpeg_that_parses_but_does_not_decode_is_unreadable_in_the_worker():
    """Its header and end marker pass the workers' check (kept encoded for the device), but on the CPU path it is
    decoded in the worker's read: named, and skipped with data.on_bad_image=skip, not a crash of the batch."""
    import io

    from PIL import Image

    from solo.data.decode import ImageReadError, raw_image
    from solo.data.views.multiview import MultiViewDataset

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 90)).save(buffer, "JPEG")
    good = buffer.getvalue()
    bad = good[:600] + bytes(len(good) - 602) + b"\xff\xd9"  # the header, then zeros where the scan was
    assert raw_image(bad, "image bad.jpg")[0].dim() == 1

    class Files:
        def __len__(self):
            return 2

        def image_bytes(self, index):
            return (bad, "image bad.jpg") if index == 0 else (good, "image good.jpg")

        def label(self, index):
            return index

    recipe = ViewRecipe(EVERYTHING, 16, MEAN, STD)
    with pytest.raises(ImageReadError, match="cannot read image bad.jpg"):
        MultiViewDataset(Files(), [recipe], seed=0)[(0, 0)]
    samples = MultiViewDataset(Files(), [recipe], seed=0, skip_bad=True).__getitems__([(0, 0), (0, 1)])
    assert [s["skipped"] for s in samples] == [1, 0] and samples[0]["label"] == 1
