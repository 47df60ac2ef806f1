"""A view as its parameters: every random choice is drawn on the CPU, then applied to one image or to a batch.

`ViewRecipe.draw` draws one view's parameters (crop box, flip, colour jitter factors and order, grayscale,
blur sigma, solarisation) on the CPU from a Python generator, which solo seeds per (seed, epoch, sample, view).
`ViewRecipe.apply_batch` applies them to a batch of images at once, each sample with its own parameters,
on whatever device the images are: the whole batch on the GPU (`data.augment_on=device`), or each DataLoader
worker's batch on the CPU (`data.augment_on=cpu`). One implementation for both, so a view is the same on
either path (to the devices' rounding).

The parameters and the pixel operations follow torchvision's transforms (RandomResizedCrop,
RandomHorizontalFlip, ColorJitter in a random order inside RandomApply, RandomGrayscale, GaussianBlur inside
RandomApply, RandomSolarize at 128 of 255): the tests check every operation against torchvision's functional
ops on float images. Pixels are float32 in [0, 1] from the crop's resize on (no uint8 rounding in between).
kornia's batched augmentations were not used: its ColorJitter takes one order of operations per batch (we
need one per sample) and its resized crop samples without antialiasing, unlike torchvision's CPU path.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, decode_jpeg

from solo.data.decode import as_uint8_tensor
from solo.errors import DataError

# One view's parameters, as a float64 vector (integers are exact): what the DataLoader collates per view.
FIELDS = (
    "top",
    "left",
    "height",
    "width",
    "flip",
    "jitter",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "order0",
    "order1",
    "order2",
    "order3",
    "grayscale",
    "blur",
    "sigma",
    "solarize",
)
AT = {name: i for i, name in enumerate(FIELDS)}
JITTER = ("brightness", "contrast", "saturation", "hue")  # ColorJitter's operations, numbered as in "order*"
SOLARIZE_THRESHOLD = 128 / 255  # RandomSolarize(threshold=128) on uint8 images, in [0, 1] units
GREY_WEIGHTS = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision's rgb_to_grayscale


def blur_kernel_size(image_size: int) -> int:
    """~10% of the image side, odd (SimCLR: 23 for 224), at least 3 so blur does something."""
    return max(3, int(0.1 * image_size) // 2 * 2 + 1)


def crop_box(
    height: int, width: int, scale: Sequence[float], ratio=(3 / 4, 4 / 3), rng=random
) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (top, left, height, width): an area fraction in `scale` and an aspect ratio in
    `ratio` (log-uniform), up to 10 tries; else the whole image's centre, its aspect clamped to `ratio`. `rng`: a
    random.Random, or the module `random` (the process's generator)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif aspect > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class ViewRecipe:
    """One view: an augmentation recipe (solo.data.transforms.ViewAugmentation) at an output `size`, normalised
    with `mean` and `std`. Called on an image (PIL or a uint8 (3, H, W) tensor) it is the CPU path: draw, apply."""

    def __init__(self, aug, size: int, mean: Sequence[float], std: Sequence[float]):
        self.aug, self.size = aug, size
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self._on_device: dict = {}  # device -> (mean, std) tensors
        self.kernel = blur_kernel_size(size)
        # Operations whose recipe can change nothing are left out of both paths.
        self.jitter_ops = [i for i, op in enumerate(JITTER) if getattr(aug, op) > 0] if aug.jitter_prob > 0 else []

    def draw(self, height: int, width: int, rng=random) -> torch.Tensor:
        """This view's parameters for an image of `height` x `width`, from Python's generator (~50 times faster
        than torch's for scalars): `rng`, a random.Random (solo.data.views.multiview seeds one per sample and view),
        or the module `random`, the process's (as solo.data.seeding.seeded_rng seeds it)."""
        a = self.aug

        def coin(p: float) -> float:
            return float(rng.random() < p)

        p = [0.0] * len(FIELDS)
        p[AT["top"]], p[AT["left"]], p[AT["height"]], p[AT["width"]] = crop_box(height, width, a.crop_scale, rng=rng)
        p[AT["flip"]] = coin(a.hflip_prob)
        p[AT["jitter"]] = coin(a.jitter_prob)
        for op, spread in zip(JITTER, (a.brightness, a.contrast, a.saturation, a.hue)):
            if op == "hue":
                p[AT[op]] = rng.uniform(-spread, spread) if spread > 0 else 0.0
            else:
                p[AT[op]] = rng.uniform(max(0.0, 1 - spread), 1 + spread) if spread > 0 else 1.0
        p[AT["order0"] : AT["order3"] + 1] = rng.sample(range(4), 4)
        p[AT["grayscale"]] = coin(a.grayscale_prob)
        p[AT["blur"]] = coin(a.blur_prob)
        p[AT["sigma"]] = rng.uniform(0.1, 2.0)
        p[AT["solarize"]] = coin(a.solarize_prob)
        return torch.tensor(p, dtype=torch.float64)

    def __call__(self, image) -> torch.Tensor:
        """The CPU path: one view of one image (PIL or uint8 (3, H, W)), normalised float32 (3, size, size)."""
        pixels = as_uint8_tensor(image)
        return self.apply_batch([pixels], self.draw(pixels.shape[-2], pixels.shape[-1])[None])[0]

    def apply_batch(self, images: torch.Tensor | list[torch.Tensor], p: torch.Tensor) -> torch.Tensor:
        """The views of a batch, on the images' device: `images` uint8 (3, H_i, W_i) tensors (or one (B, 3, H, W)
        tensor), `p` their (B, len(FIELDS)) parameters, on the CPU. Returns normalised float32 (B, 3, size, size).

        Each operation runs on the samples that have it (all of the batch, or those gathered, changed and put back
        in place); which samples these are is read from the CPU copy of the parameters, never from the device."""
        boxes = p[:, : AT["width"] + 1].long().tolist()
        on = (p > 0).tolist()

        def rows(field: str) -> list[int]:
            return [i for i, flags in enumerate(on) if flags[AT[field]]]

        x = crop_resize(images, boxes, self.size)  # a new tensor: the operations below may change it in place
        x = on_rows(x, rows("flip"), lambda x, _: x.flip(-1))
        x = self._jitter(x, p, rows("jitter"))
        x = on_rows(x, rows("grayscale"), lambda x, _: grey(x).expand_as(x).contiguous())
        if self.aug.blur_prob > 0:
            x = on_rows(x, rows("blur"), lambda x, r: gaussian_blur(x, p[r, AT["sigma"]], self.kernel))
        x = on_rows(x, rows("solarize"), solarize)
        mean, std = self._normalisation(x.device)
        return (x - mean) / std

    def _normalisation(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and std as (1, 3, 1, 1) tensors on `device`, sent there once: a copy from the host each step
        would wait for the device's queue of kernels."""
        if device not in self._on_device:
            self._on_device[device] = tuple(torch.tensor(v).view(1, 3, 1, 1).to(device) for v in (self.mean, self.std))
        return self._on_device[device]

    def _jitter(self, x: torch.Tensor, p: torch.Tensor, jittered: list[int]) -> torch.Tensor:
        """ColorJitter on the `jittered` samples, each sample's operations in its own order: at position k, each
        operation runs on the samples that have it there, so every sample is changed once per position."""
        orders = p[:, AT["order0"] : AT["order3"] + 1].long().tolist()
        adjust = (*BLENDS, shift_hue)
        for k in range(4):
            for op in self.jitter_ops:
                rows = [i for i in jittered if orders[i][k] == op]
                factor = p[rows, AT[JITTER[op]]].to(x.device, torch.float32, non_blocking=True).view(-1, 1, 1, 1)
                x = on_rows(x, rows, lambda x, _: adjust[op](x, factor))  # noqa: B023 (called at once, in this iteration)
        return x


def on_rows(x: torch.Tensor, rows: list[int], operation) -> torch.Tensor:
    """x with x[rows] replaced by operation(x[rows], rows) (in place, unless every sample is in `rows`: then the
    whole batch at once, into a new tensor)."""
    if len(rows) == len(x):
        return operation(x, rows)
    if rows:
        where = torch.tensor(rows).to(x.device, non_blocking=True)
        x.index_copy_(0, where, operation(x.index_select(0, where), rows))
    return x


def solarize(x: torch.Tensor, rows=None) -> torch.Tensor:
    """Pixels at or above the threshold inverted (RandomSolarize at 128 of 255)."""
    return x + (x >= SOLARIZE_THRESHOLD).to(x.dtype) * (1 - 2 * x)  # not torch.where: 5 times slower on the CPU


def crop_resize(images, boxes: list[list[int]], size: int) -> torch.Tensor:
    """Each image's box (top, left, height, width) resized to size x size (bilinear, antialiased, as
    torchvision's resized_crop), in float32 [0, 1]. One small resize per sample: boxes differ in size."""
    out = []
    for image, (top, left, h, w) in zip(images, boxes):
        crop = image[None, :, top : top + h, left : left + w].float()
        out.append(F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False))
    return torch.cat(out).div_(255.0)


def grey(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    return (GREY_WEIGHTS[0] * r + GREY_WEIGHTS[1] * g + GREY_WEIGHTS[2] * b).unsqueeze(1)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (factor * x + (1 - factor) * other).clamp(0, 1)


BLENDS = (
    lambda x, f: _blend(x, torch.zeros_like(x), f),  # brightness: towards black
    lambda x, f: _blend(x, grey(x).mean(dim=(1, 2, 3), keepdim=True), f),  # contrast: towards the mean grey
    lambda x, f: _blend(x, grey(x), f),  # saturation: towards the grey image
)


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each image's hue by its `shift` (B, 1, 1, 1) of a full turn, through HSV (torchvision's hexcone). In
    arithmetic on 0/1 masks, not torch.where, and with amax/amin, not max/min: on the CPU those two are 5 and 20
    times slower than an addition (5.5 against 14 ms for 40 images of 64 px)."""
    high, low = x.amax(dim=1), x.amin(dim=1)
    spread = high - low  # = value x saturation
    r, g, b = x.unbind(1)
    # The hue's sector: where the largest channel is (red before green before blue on ties), in sixths of a turn.
    at_r = (high == r).to(x.dtype)
    at_g = (high == g).to(x.dtype) * (1 - at_r)
    at_b = 1 - at_r - at_g
    within = (at_r * (g - b) + at_g * (b - r) + at_b * (r - g)) / spread.clamp_min(torch.finfo(x.dtype).tiny)
    sixths = within + 2 * at_g + 4 * at_b + 6 * shift.view(-1, 1, 1)  # a grey pixel's: anything (spread 0 below)
    # HSV -> RGB: each channel from its own offset around the colour wheel.
    channels = []
    for offset in (5.0, 3.0, 1.0):
        k = sixths + offset
        k = k - 6 * torch.floor(k / 6)
        channels.append(high - spread * torch.minimum(k, 4 - k).clamp_(0, 1))
    return torch.stack(channels, dim=1).clamp_(0, 1)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """Each image blurred with its own `sigma` (B,), by a separable `kernel`-tap Gaussian with reflected edges
    (torchvision's GaussianBlur kernel: exp(-(t / sigma)^2) at t evenly spaced in +-(kernel - 1) / (2 sqrt 2))."""
    b, c, h, w = x.shape
    reach = (kernel - 1) / (2 * math.sqrt(2))
    t = torch.linspace(-reach, reach, kernel, device=x.device, dtype=x.dtype)
    sigma = sigma.to(x.device, x.dtype, non_blocking=True).view(-1, 1)
    weights = torch.softmax(-((t / sigma) ** 2), dim=1).repeat_interleave(c, dim=0)  # (B*C, k)
    pad = kernel // 2
    flat = F.pad(x.reshape(1, b * c, h, w), (pad, pad, pad, pad), mode="reflect")
    flat = F.conv2d(flat, weights.view(b * c, 1, 1, kernel), groups=b * c)
    flat = F.conv2d(flat, weights.view(b * c, 1, kernel, 1), groups=b * c)
    return flat.view(b, c, h, w)


class DeviceViews:
    """`data.augment_on=device`: turns a raw batch (uint8 images, each view's parameters; see
    MultiViewDataset(raw=True)) into its views on the training device, the whole batch at once; with
    `probe_transform` (the evaluation transform), also each image as validation sees it, `"probe_image"`."""

    def __init__(self, recipes: Sequence[ViewRecipe], pairs: bool, probe_transform: Callable | None = None):
        self.recipes, self.pairs, self.probe_transform = list(recipes), pairs, probe_transform

    def __call__(self, batch: dict, device: torch.device) -> dict:
        batch = dict(batch)
        images = batch.pop("image")
        images = decode(images, device) if isinstance(images, list) else images.to(device, non_blocking=True)
        params = batch.pop("params")
        if self.pairs:  # image-text pairs: one view, the image
            batch["image"] = self.recipes[0].apply_batch(images, params)
        else:
            batch["views"] = [recipe.apply_batch(images, p) for recipe, p in zip(self.recipes, params)]
        if self.probe_transform is not None:  # images of one size in one call, of several sizes one by one
            probe = self.probe_transform
            batch["probe_image"] = (
                torch.stack([probe(im) for im in images]) if isinstance(images, list) else probe(images)
            )
        return batch


def decode(images: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The batch's images as uint8 (3, H, W) tensors on `device`: those still encoded (1-D JPEG bytes, see
    solo.data.multiview.raw_image) decoded there in one call (nvJPEG on a GPU), the others moved there."""
    encoded = [i for i, image in enumerate(images) if image.dim() == 1]
    out = list(images)
    if encoded:
        try:
            decoded = decode_jpeg([images[i] for i in encoded], mode=ImageReadMode.RGB, device=device)
        except RuntimeError as e:
            raise DataError(
                f"decoding the batch's JPEG images on {device} failed ({e}): a file passed the DataLoader worker's "
                "checks (header, end marker) but does not decode there. data.augment_on=cpu decodes each image in the "
                "workers, where one that fails is named and, with data.on_bad_image=skip, skipped"
            ) from None
        for i, image in zip(encoded, decoded):
            out[i] = image
    return [image.to(device, non_blocking=True) for image in out]
