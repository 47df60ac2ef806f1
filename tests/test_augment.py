"""Views as parameters (solo.data.views.augment): drawn per sample, applied to a whole batch; the crop checked against
a hand-written sampler on torch's grid_sample, the colour operations against torchvision's functional ops."""

from __future__ import annotations

import collections
import math

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torchvision.transforms.v2 import functional as TF

from solo.data.sampling.seeding import seeded_rng
from solo.data.views.augment import (
    JITTER,
    PARAM_INDEX,
    SOLARIZE_THRESHOLD,
    DeviceViews,
    ViewRecipe,
    crop_box,
    crop_resize,
    make_views,
    padded_canvas,
)
from solo.data.views.transforms import ViewAugmentation, expand_views

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
CPU = torch.device("cpu")


def torchvision_colours(recipe: ViewRecipe, crop: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The reference for everything after the crop: torchvision's functional ops on one float crop in [0, 1]."""
    x = crop
    if p[PARAM_INDEX["flip"]]:
        x = TF.horizontal_flip(x)
    if p[PARAM_INDEX["jitter"]]:
        adjust = {
            "brightness": TF.adjust_brightness,
            "contrast": TF.adjust_contrast,
            "saturation": TF.adjust_saturation,
            "hue": TF.adjust_hue,
        }
        for op in p[PARAM_INDEX["order0"] : PARAM_INDEX["order3"] + 1].long().tolist():
            if getattr(recipe.aug, JITTER[op]) > 0:
                x = adjust[JITTER[op]](x, float(p[PARAM_INDEX[JITTER[op]]]))
    if p[PARAM_INDEX["grayscale"]]:
        x = TF.rgb_to_grayscale(x, num_output_channels=3)
    if p[PARAM_INDEX["blur"]]:
        x = TF.gaussian_blur(x, [recipe.kernel] * 2, [float(p[PARAM_INDEX["sigma"]])] * 2)
    if p[PARAM_INDEX["solarize"]]:
        x = TF.solarize(x, SOLARIZE_THRESHOLD)
    return TF.normalize(x, list(MEAN), list(STD))


def box_of(p: torch.Tensor, image: int = 0) -> torch.Tensor:
    """A view's crop box as crop_resize takes it: (image, left, top, right, bottom)."""
    top, left, h, w = (float(p[PARAM_INDEX[k]]) for k in ("top", "left", "height", "width"))
    return torch.tensor([[image, left, top, left + w, top + h]])


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
    return images, torch.tensor(params, dtype=torch.float64)


def sampled(image: torch.Tensor, box: tuple[float, float, float, float], size: int) -> torch.Tensor:
    """The hand-written reference of the crop: output pixel (i, j) the mean of s_h x s_w bilinear samples spread
    evenly over its share of the box (s = ceil(box side / size)), each sample at the image's pixel-centre coordinate
    (pixel k's centre at k), the image's edge repeated beyond it: torch's grid_sample, border padding."""
    left, top, right, bottom = box
    _, height, width = image.shape
    s_h, s_w = math.ceil((bottom - top) / size), math.ceil((right - left) / size)
    ys = top - 0.5 + (torch.arange(size * s_h, dtype=torch.float64) + 0.5) * (bottom - top) / (size * s_h)
    xs = left - 0.5 + (torch.arange(size * s_w, dtype=torch.float64) + 0.5) * (right - left) / (size * s_w)
    grid = torch.stack(torch.meshgrid((xs + 0.5) / width * 2 - 1, (ys + 0.5) / height * 2 - 1, indexing="xy"), -1)
    samples = F.grid_sample(image[None].double(), grid[None], "bilinear", "border", align_corners=False)[0]
    return samples.view(3, size, s_h, size, s_w).mean(dim=(2, 4)).float() / 255


@pytest.mark.parametrize(
    "box, size",
    [
        ((0.0, 0.0, 52.0, 40.0), 64),  # the whole image, upsampled
        ((5.0, 7.0, 17.0, 16.0), 24),  # a small box inside, upsampled: its edges read the pixels beyond it
        ((3.0, 2.0, 51.0, 38.0), 16),  # downsampled, 3 x 3 samples per output pixel
        ((10.0, 4.0, 49.0, 29.0), 11),  # downsampled, 3 x 4 samples
    ],
)
def test_the_crop_is_the_mean_of_bilinear_samples_over_each_output_pixel(box, size):
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 40, 52), dtype=torch.uint8, generator=g)
    other = torch.randint(0, 256, (3, 70, 61), dtype=torch.uint8, generator=g)  # a larger neighbour: padding around
    canvas = padded_canvas([image, other], CPU)
    got = crop_resize(canvas, torch.tensor([[0.0, *box]]), size)[0]
    assert (got - sampled(image, box, size)).abs().max() < 1e-5


def test_the_batch_is_placed_alike_by_the_device_paths_gather_and_the_workers_copies():
    """Images of several sizes and memory layouts ((3, H, W); (H, W, 3) seen as (3, H, W), as decode_jpeg gives them):
    each at the top left of the canvas, its last row and column repeated past its edge, whichever way they are placed."""
    g = torch.Generator().manual_seed(2)
    images = [torch.randint(0, 256, (3, 9, 14), dtype=torch.uint8, generator=g)]
    images.append(torch.randint(0, 256, (11, 7, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1))
    images.append(torch.randint(0, 256, (3, 5, 20), dtype=torch.uint8, generator=g)[:, :, ::2])  # neither: copied
    gathered, copied = (padded_canvas(images, CPU, whole_batch=w) for w in (True, False))
    assert gathered.shape == (3, 3, 12, 15) and torch.equal(gathered, copied)
    for b, image in enumerate(images):
        h, w = image.shape[-2:]
        assert torch.equal(gathered[b, :, :h, :w], image.float())
        assert torch.equal(gathered[b, :, h:, w:], image[:, -1:, -1:].float().expand(3, 12 - h, 15 - w))


def test_the_crop_of_the_whole_image_is_torchvisions_resize_up_and_a_box_average_down():
    """Upsampling the whole image is torchvision's bilinear resize; downsampling by a whole factor k averages k x k
    pixels (what an antialiased resize approximates with a wider triangle filter)."""
    g = torch.Generator().manual_seed(1)
    image = torch.randint(0, 256, (3, 12, 10), dtype=torch.uint8, generator=g)
    up = crop_resize(padded_canvas([image], CPU), torch.tensor([[0.0, 0.0, 0.0, 10.0, 12.0]]), 30)[0]
    resized = TF.resize(image.float(), [30, 30], antialias=True) / 255
    assert (up - resized).abs().max() < 1e-5
    big = torch.randint(0, 256, (3, 48, 48), dtype=torch.uint8, generator=g)
    down = crop_resize(padded_canvas(big[None], CPU), torch.tensor([[0.0, 0.0, 0.0, 48.0, 48.0]]), 16)[0]
    assert (down - F.avg_pool2d(big.float()[None], 3)[0] / 255).abs().max() < 1e-5


@pytest.mark.parametrize(
    "aug",
    [
        EVERYTHING,
        ViewAugmentation(jitter_prob=1.0, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.5),  # every order, strong
        ViewAugmentation(
            crop_scale=[0.5, 1.0], hflip_prob=0.0, jitter_prob=0.0, grayscale_prob=1.0, blur_prob=1.0, solarize_prob=1.0
        ),
        ViewAugmentation(brightness=0.4, contrast=0.4, saturation=0.0, hue=0.0, grayscale_prob=0.0),  # the digits'
    ],
    ids=["simclr-like", "colour", "grey-blur-solarize", "digits"],
)
@pytest.mark.parametrize("whole_batch", [True, False], ids=["whole-batch", "selected-rows"])
@pytest.mark.parametrize("size", [8, 32])
def test_every_operation_after_the_crop_is_torchvisions(aug, whole_batch, size):
    """Every sample of a batch of images of different sizes, each with its own parameters, gets torchvision's flip,
    jitter (in its own order), grayscale, blur, solarisation and normalisation of its crop, whichever way the rows
    are reached."""
    recipe = ViewRecipe(aug, size, MEAN, STD)
    images, params = images_and_params(recipe, 48)
    batch = make_views([recipe], images, params[None], whole_batch=whole_batch)[0]
    assert batch.shape == (48, 3, size, size) and batch.dtype == torch.float32
    for i, (image, p) in enumerate(zip(images, params)):
        crop = crop_resize(padded_canvas([image], CPU), box_of(p), size)[0]
        expected = torchvision_colours(recipe, crop, p)
        worst = float(((batch[i] - expected) * torch.tensor(STD).view(3, 1, 1)).abs().max())
        assert worst < 2e-6, (
            f"sample {i}: {worst} off torchvision's view (in [0, 1] pixel units); parameters {p.tolist()}"
        )


def test_whole_batch_and_selected_rows_give_the_same_pixels():
    """The device path's way (every operation on every row, gated) and the workers' (each on its rows): bit for bit,
    views of two sizes from images of several sizes."""
    recipes = [ViewRecipe(EVERYTHING, 24, MEAN, STD)] * 2 + [ViewRecipe(EVERYTHING, 12, MEAN, STD)]
    images, _ = images_and_params(recipes[0], 32)
    params = torch.stack([images_and_params(r, 32)[1] for r in recipes])
    params[1] = images_and_params(recipes[1], 64)[1][32:]  # the second view: other parameters than the first's
    whole = make_views(recipes, images, params, whole_batch=True)
    selected = make_views(recipes, images, params, whole_batch=False)
    assert all(torch.equal(a, b) for a, b in zip(whole, selected))


def test_a_view_is_the_same_alone_and_in_a_batch_of_32(monkeypatch):
    """On the device path each sample's views depend on its own image and parameters only: made alone they are
    bit-identical to the same sample's views in a batch of 32 images of other sizes (so the world size, which sets
    the batch each rank makes, changes no view). The known-wrong variant, contrast towards the batch's mean grey
    rather than each image's own, is caught by the same comparison."""
    import solo.data.views.augment as augment

    recipes = [ViewRecipe(EVERYTHING, 24, MEAN, STD)] * 2 + [ViewRecipe(EVERYTHING, 12, MEAN, STD)]
    images, params = images_and_params(recipes[0], 32)
    params = params[None].repeat(3, 1, 1)

    def differing() -> list[int]:
        batch = make_views(recipes, images, params, whole_batch=True)
        alone = [make_views(recipes, [image], params[:, i : i + 1], whole_batch=True) for i, image in enumerate(images)]
        return [i for i in range(32) if not all(torch.equal(a[0], b[i]) for a, b in zip(alone[i], batch))]

    assert differing() == []

    def batch_contrast(x, f, to_mean, to_grey=None):
        luma = augment.grey(x)
        return (f * x + to_mean * luma.mean() + (0 if to_grey is None else to_grey * luma)).clamp_(0, 1)

    monkeypatch.setattr(augment, "blend", batch_contrast)
    assert len(differing()) > 5


def test_the_device_views_operations_do_not_grow_with_the_batch():
    """DeviceViews on a raw batch of 4 and of 32 images: the same aten operations (those called from Python; what runs
    inside one, such as zero_'s fill_ on a large CPU tensor, is its own business) for images of one size (stacked by
    the collate), and one more per image for images of several sizes (its pixels, as they lie in memory, placed in the
    batch's buffer: a view, no kernel): a fixed number of launches per batch on a GPU."""

    def operations(batch: dict) -> collections.Counter:
        views = DeviceViews([ViewRecipe(EVERYTHING, 24, MEAN, STD)] * 2, pairs=False)
        views(batch, CPU)  # warm: constants sent to the device once
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            views(batch, CPU)
        called = [e for e in prof.events() if e.name.startswith("aten::")]
        return collections.Counter(
            e.name for e in called if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        )

    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)

    def raw(n: int, same_size: bool) -> dict:
        images, params = images_and_params(recipe, n, same_size)
        return {
            "image": torch.stack(images) if same_size else images,
            "params": params[None].repeat(2, 1, 1),
            "label": torch.zeros(n, dtype=torch.long),
        }

    assert operations(raw(4, same_size=True)) == operations(raw(32, same_size=True))
    assert operations(raw(32, same_size=False)) - operations(raw(4, same_size=False)) == {"aten::as_strided": 28}


def test_cpu_path_is_the_batched_path_on_one_sample():
    """A view made alone in a worker (ViewRecipe called on the image) equals the same sample's view in a batch:
    the same operations, so the same pixels, whichever path makes them."""
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    images, params = images_and_params(recipe, 16, same_size=True)
    batch = recipe.apply_batch(torch.stack(images), params)
    for i, image in enumerate(images):
        with seeded_rng(i):
            alone = recipe(image)
        assert torch.equal(alone, batch[i]), i


def test_parameters_depend_on_the_seed_only():
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    with seeded_rng(7):
        a = recipe.draw(50, 60)
    torch.rand(5)  # other use of the global RNG in between changes nothing
    with seeded_rng(7):
        b = recipe.draw(50, 60)
    with seeded_rng(8):
        c = recipe.draw(50, 60)
    assert a == b and a != c


def test_operations_fire_at_their_probabilities():
    recipe = ViewRecipe(EVERYTHING, 24, MEAN, STD)
    _, params = images_and_params(recipe, 4000, same_size=True)
    for field, p in [("flip", 0.5), ("jitter", 0.8), ("grayscale", 0.2), ("blur", 0.5), ("solarize", 0.2)]:
        rate = float(params[:, PARAM_INDEX[field]].mean())
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / 4000), (field, rate)
    assert torch.all((params[:, PARAM_INDEX["brightness"]] >= 0.6) & (params[:, PARAM_INDEX["brightness"]] <= 1.4))
    assert torch.all(params[:, PARAM_INDEX["hue"]].abs() <= 0.1)
    assert torch.all((params[:, PARAM_INDEX["sigma"]] >= 0.1) & (params[:, PARAM_INDEX["sigma"]] <= 2.0))
    orders = params[:, PARAM_INDEX["order0"] : PARAM_INDEX["order3"] + 1].long()
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


def _assert_second_view_is_its_box(recipes, image, params):
    """The second view's pixels are its box's (the hand-written crop) at its size, mirrored where it is, normalised."""
    top, left, h, w, flip = (params[1][PARAM_INDEX[k]] for k in ("top", "left", "height", "width", "flip"))
    view = make_views(recipes, [image], torch.tensor([[p] for p in params], dtype=torch.float64))[1][0]
    want = sampled(image, (left, top, left + w, top + h), recipes[1].size)
    want = TF.normalize(TF.horizontal_flip(want) if flip else want, list(MEAN), list(STD))
    torch.testing.assert_close(view, want, atol=2e-5, rtol=0)


def test_a_shifted_view_is_the_first_views_box_and_flip_moved_down_and_to_the_views_right():
    """CMAE's pixel shifting (ViewAugmentation.shift_of, max_shift): view 1 takes view 0's box and flip, moved by whole
    pixels, each axis up to max_shift of the box's side, down and towards the view's right (the image's left when
    mirrored), never out of the image; its pixels are that box's, mirrored with view 0 although its own hflip_prob is
    0 (the hand-written crop and torchvision's flip)."""
    still = dict(jitter_prob=0.0, grayscale_prob=0.0)
    online = ViewRecipe(ViewAugmentation(crop_scale=[0.3, 0.7], hflip_prob=0.5, **still), 24, MEAN, STD)
    aug = ViewAugmentation(shift_of=0, max_shift=0.25, hflip_prob=0.0, **still)
    shifted = ViewRecipe(aug, 16, MEAN, STD)  # another size: made apart from view 0, its own flip gate
    image = torch.randint(0, 256, (3, 40, 52), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    moves, flips = set(), set()
    for seed in range(300):
        with seeded_rng(seed):
            p0 = online.draw(40, 52)
            p1 = shifted.draw(40, 52, earlier=[p0])
        (top0, left0, h, w, flip), (top1, left1, h1, w1, flip1) = (
            [q[PARAM_INDEX[k]] for k in ("top", "left", "height", "width", "flip")] for q in (p0, p1)
        )
        assert (h1, w1, flip1) == (h, w, flip)
        down, across = top1 - top0, (left0 - left1) if flip else (left1 - left0)
        assert 0 <= down <= 0.25 * h and 0 <= across <= 0.25 * w
        assert top1 + h <= 40 and 0 <= left1 and left1 + w <= 52
        moves.add((down, across))
        flips.add(flip)
        if seed < 8:
            _assert_second_view_is_its_box([online, shifted], image, [p0, p1])
    assert len(moves) > 50 and flips == {0.0, 1.0}
    with pytest.raises(ValueError, match=r"views\[1\].shift_of=1: it names view 1, but 1 come before it"):
        expand_views([EVERYTHING, ViewAugmentation(shift_of=1)], 24)


def test_a_view_inside_another_lies_in_its_box_at_its_share_of_the_area_with_its_own_flip():
    """PaKA's local crops (ViewAugmentation.inside_of): view 1's box lies inside view 0's, its area a share of view
    0's box in crop_scale (RandomResizedCrop's rule inside that box), its flip its own; its pixels are that box's (the
    hand-written crop). A view naming a later view, or both shift_of and inside_of, is refused."""
    still = dict(jitter_prob=0.0, grayscale_prob=0.0)
    parent = ViewRecipe(ViewAugmentation(crop_scale=[0.4, 1.0], hflip_prob=0.5, **still), 24, MEAN, STD)
    local = ViewRecipe(ViewAugmentation(inside_of=0, crop_scale=[0.2, 0.5], hflip_prob=0.5, **still), 8, MEAN, STD)
    image = torch.randint(0, 256, (3, 40, 52), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    flips, shares = set(), []
    for seed in range(300):
        with seeded_rng(seed):
            p0 = parent.draw(40, 52)
            p1 = local.draw(40, 52, earlier=[p0])
        (top0, left0, h0, w0), (top1, left1, h1, w1, flip1) = (
            [p0[PARAM_INDEX[k]] for k in ("top", "left", "height", "width")],
            [p1[PARAM_INDEX[k]] for k in ("top", "left", "height", "width", "flip")],
        )
        assert top0 <= top1 and top1 + h1 <= top0 + h0 and left0 <= left1 and left1 + w1 <= left0 + w0
        shares.append(h1 * w1 / (h0 * w0))
        flips.add(flip1)
        if seed < 4:
            _assert_second_view_is_its_box([parent, local], image, [p0, p1])
    assert flips == {0.0, 1.0} and 0.15 <= min(shares) and max(shares) <= 0.6 and max(shares) - min(shares) > 0.2
    with pytest.raises(ValueError, match=r"views\[1\].inside_of=1: it names view 1, but 1 come before it"):
        expand_views([EVERYTHING, ViewAugmentation(inside_of=1)], 24)
    with pytest.raises(ValueError, match="and no shift_of"):
        expand_views([EVERYTHING, ViewAugmentation(inside_of=0, shift_of=0)], 24)


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
    # Its first Huffman table's 16 code counts (after the marker, length and table id) sum past 256: PIL parses the
    # markers without reading the table, libjpeg refuses it when decoding.
    counts = good.index(b"\xff\xc4") + 5
    bad = good[:counts] + b"\xff" * 16 + good[counts + 16 :]
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
