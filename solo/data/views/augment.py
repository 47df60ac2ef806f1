"""A view as its parameters: every random choice is drawn on the CPU, then applied to a whole batch at once.

`ViewRecipe.draw` draws one view's parameters (crop box, flip, colour jitter factors and order, grayscale,
blur sigma, solarisation) on the CPU from a Python generator, which solo seeds per (seed, epoch, sample, view).
`make_views` applies them to a batch of images, each sample with its own parameters, on whatever device the
images are: the whole batch on the GPU (`data.augment_on=device`), or each DataLoader worker's batch on the CPU
(`data.augment_on=cpu`). The views of one size are made together, every operation once for all their rows.

Two ways to reach the rows an operation applies to, with the same pixels (tested bit for bit):

- `whole_batch` (the device path): every operation runs on every row, and a row that does not have it keeps its
  input exactly (a 0/1 weight in `torch.lerp`; a brightness, contrast or saturation factor of 1). The number of
  operations is fixed by the recipes, never by the batch or its parameters: on a GPU the launches do not grow with
  the batch, and nothing is read on the host.
- row selection (the CPU workers' path): each operation gathers the rows that have it, changes them and puts them
  back. Fewer pixels computed, which is what counts on a CPU core.

The parameters and the colour operations follow torchvision's transforms (RandomResizedCrop, RandomHorizontalFlip,
ColorJitter in a random order inside RandomApply, RandomGrayscale, GaussianBlur inside RandomApply, RandomSolarize
at 128 of 255): the tests check them against torchvision's functional ops on float images. The crop and resize is
torchvision's `roi_align` (adaptive sampling, `aligned=True`) on the batch of images: the box is sampled from the
image as a continuous signal, each output pixel the mean of bilinear samples spread over its share of the box (as
many per axis as the box is larger than the output). Upsampling is bilinear, as torchvision's resize; downsampling
averages like its antialiased resize with a box instead of a triangle; unlike it, the outermost half pixel of the
box reads the image beyond the box instead of repeating the box's edge (docs/data.md gives the distances). Pixels
are float32 in [0, 1] from the crop on (no uint8 rounding in between). kornia's batched augmentations were not used:
its ColorJitter takes one order of operations per batch (we need one per sample).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from solo.data.decode import as_uint8_tensor
from solo.data.views.packed import PackedImages
from solo.errors import DataError

# One view's parameters, as a float64 vector (integers are exact): what the DataLoader collates per view.
VIEW_PARAMS = (
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
PARAM_INDEX = {name: i for i, name in enumerate(VIEW_PARAMS)}
JITTER = ("brightness", "contrast", "saturation", "hue")  # ColorJitter's operations, numbered as in "order*"
SOLARIZE_THRESHOLD = 128 / 255  # RandomSolarize(threshold=128) on uint8 images, in [0, 1] units
BOX_AND_FLIP = ("top", "left", "height", "width", "flip")
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
    """One view: an augmentation recipe (solo.data.views.transforms.ViewAugmentation) at an output `size`,
    normalised with `mean` and `std`. Called on an image (PIL or a uint8 (3, H, W) tensor) it is the CPU path:
    draw, apply."""

    def __init__(self, aug, size: int, mean: Sequence[float], std: Sequence[float]):
        self.aug, self.size = aug, size
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self.kernel = blur_kernel_size(size)
        # Operations whose recipe can change nothing are left out of both paths.
        self.jitter_ops = [i for i, op in enumerate(JITTER) if getattr(aug, op) > 0] if aug.jitter_prob > 0 else []

    def draw(self, height: int, width: int, rng=random, earlier: Sequence[list[float]] = ()) -> list[float]:
        """This view's parameters for an image of `height` x `width` (a list in VIEW_PARAMS' order), from Python's
        generator (much faster than torch's for scalars: docs/performance.md): `rng`, a random.Random
        (solo.data.views.multiview seeds one per sample and view), or the module `random`, the process's (as
        solo.data.sampling.seeding's seeded_rng seeds it). A batch's parameters become one tensor when they are
        collated. `earlier`: the sample's earlier views' parameters, which a view with `shift_of` moves and one with
        `inside_of` draws its box inside."""
        a = self.aug

        def coin(p: float) -> float:
            return float(rng.random() < p)

        p = [0.0] * len(VIEW_PARAMS)
        p[PARAM_INDEX["top"]], p[PARAM_INDEX["left"]], p[PARAM_INDEX["height"]], p[PARAM_INDEX["width"]] = crop_box(
            height, width, a.crop_scale, rng=rng
        )
        p[PARAM_INDEX["flip"]] = coin(a.hflip_prob)
        p[PARAM_INDEX["jitter"]] = coin(a.jitter_prob)
        for op, spread in zip(JITTER, (a.brightness, a.contrast, a.saturation, a.hue)):
            if op == "hue":
                p[PARAM_INDEX[op]] = rng.uniform(-spread, spread) if spread > 0 else 0.0
            else:
                p[PARAM_INDEX[op]] = rng.uniform(max(0.0, 1 - spread), 1 + spread) if spread > 0 else 1.0
        p[PARAM_INDEX["order0"] : PARAM_INDEX["order3"] + 1] = rng.sample(range(4), 4)
        p[PARAM_INDEX["grayscale"]] = coin(a.grayscale_prob)
        p[PARAM_INDEX["blur"]] = coin(a.blur_prob)
        p[PARAM_INDEX["sigma"]] = rng.uniform(0.1, 2.0)
        p[PARAM_INDEX["solarize"]] = coin(a.solarize_prob)
        if a.inside_of is not None:
            if a.inside_of >= len(earlier):
                raise ValueError(f"a view with inside_of={a.inside_of} is drawn after that view: pass its parameters")
            top, left, h, w = (earlier[a.inside_of][PARAM_INDEX[k]] for k in ("top", "left", "height", "width"))
            inner = crop_box(int(h), int(w), a.crop_scale, rng=rng)
            for k, value in zip(("top", "left", "height", "width"), (top + inner[0], left + inner[1], *inner[2:])):
                p[PARAM_INDEX[k]] = value
        if a.shift_of is not None:
            if a.shift_of >= len(earlier):
                raise ValueError(f"a view with shift_of={a.shift_of} is drawn after that view: pass its parameters")
            top, left, h, w, flip = (earlier[a.shift_of][PARAM_INDEX[k]] for k in BOX_AND_FLIP)
            down, across = rng.randint(0, int(a.max_shift * h)), rng.randint(0, int(a.max_shift * w))
            # Towards the view's right: the image's left where the view is mirrored.
            left = max(left - across, 0) if flip else min(left + across, width - w)
            for k, value in zip(BOX_AND_FLIP, (min(top + down, height - h), left, h, w, flip)):
                p[PARAM_INDEX[k]] = value
        return p

    def __call__(self, image) -> torch.Tensor:
        """The CPU path: one view of one image (PIL or uint8 (3, H, W)), normalised float32 (3, size, size)."""
        pixels = as_uint8_tensor(image)
        params = torch.tensor([self.draw(pixels.shape[-2], pixels.shape[-1])], dtype=torch.float64)
        return self.apply_batch([pixels], params)[0]

    def apply_batch(self, images, p: torch.Tensor, *, whole_batch: bool = False) -> torch.Tensor:
        """This view of a batch (see make_views): `p` its (B, len(VIEW_PARAMS)) parameters."""
        return make_views([self], images, p[None], whole_batch=whole_batch)[0]


def make_views(
    recipes: Sequence[ViewRecipe],
    images,
    params: torch.Tensor,
    *,
    whole_batch: bool = False,
    device: torch.device | None = None,
) -> list[torch.Tensor]:
    """Each recipe's view of every image: normalised float32 (B, 3, size, size) tensors, on `device` (by default the
    images').

    `images`: uint8 (3, H_i, W_i) tensors (or one (B, 3, H, W) tensor) on one device; `params`: the views' (V, B,
    len(VIEW_PARAMS)) parameters, float64, on the CPU; `whole_batch`: the device path's way to reach the rows (see the
    module's docstring). The views of one size are made together, rows v * B + i of one tensor."""
    device = device or images[0].device
    canvas = padded_canvas(images, device, whole_batch)
    batch = canvas.shape[0]
    out: list = [None] * len(recipes)
    sizes: dict[int, list[int]] = {}
    for v, recipe in enumerate(recipes):
        sizes.setdefault(recipe.size, []).append(v)
    for members in sizes.values():
        p = (
            params[members[0] : members[-1] + 1]
            if members == list(range(members[0], members[-1] + 1))
            else params[members]
        )
        p = p.flatten(0, 1).numpy()
        views = _views_of_one_size([recipes[v] for v in members], canvas, p, whole_batch)
        for v, view in zip(members, views.split(batch)):
            out[v] = view
    return out


def padded_canvas(images, device: torch.device, whole_batch: bool = False) -> torch.Tensor:
    """The batch as one float32 (B, 3, H, W) tensor on `device`, each image at the top left, its last row and column
    repeated to at least one pixel past its edge (so that a crop's samples in its last half pixel read the edge,
    whatever the batch's other images: a sample's view does not depend on its neighbours). Images of several sizes:
    with `whole_batch` (the device path), one copy to the device of all their pixels and one gather that places them,
    its index computed there from each image's size and strides (a fixed number of launches); else three copies per
    image (the CPU workers' path: no index to compute). The same canvas either way (tested)."""
    if isinstance(images, torch.Tensor):
        return F.pad(images.to(device, non_blocking=True), (0, 1, 0, 1), mode="replicate").float()
    height, width = max(int(im.shape[-2]) for im in images) + 1, max(int(im.shape[-1]) for im in images) + 1
    if not whole_batch:
        canvas = torch.empty(len(images), 3, height, width, dtype=torch.uint8, device=device)
        for b, image in enumerate(images):
            h, w = image.shape[-2:]
            canvas[b, :, :h, :w] = image
            canvas[b, :, h:, :w] = image[:, -1:, :]
            canvas[b, :, :, w:] = canvas[b, :, :, w - 1 : w]
        return canvas.float()
    # Each image's pixels as they lie in memory: (3, H, W) as decoded by PIL, or a view of (H, W, 3) as decode_jpeg
    # gives them on the CPU; any other layout copied to the first.
    images = [im if im.is_contiguous() or _pixel_major(im) else im.contiguous() for im in images]
    flat = torch.cat([im.as_strided((im.numel(),), (1,)) for im in images]).to(device, non_blocking=True)
    # Where each canvas row and column starts in `flat` (its image's start, the last row and column repeated past the
    # edge) and each image's channel stride, from the sizes on the host, sent in one copy; the index from them there.
    starts = np.cumsum([0] + [im.numel() for im in images])[:-1, None]
    strides = np.array([im.stride() for im in images])
    heights, widths = (np.array([int(im.shape[axis]) for im in images])[:, None] for axis in (-2, -1))
    rows = starts + np.minimum(np.arange(height), heights - 1) * strides[:, 1:2]
    columns = np.minimum(np.arange(width), widths - 1) * strides[:, 2:3]
    dtype = np.int32 if starts[-1, 0] + images[-1].numel() < 2**31 else np.int64
    layout = torch.from_numpy(np.concatenate([rows, columns, strides[:, :1]], axis=1).astype(dtype))
    rows, columns, channel = layout.to(device, non_blocking=True).split([height, width, 1], dim=1)
    channels = channel.view(-1, 1, 1, 1) * torch.arange(3, device=device, dtype=channel.dtype).view(1, 3, 1, 1)
    return flat[(rows[:, :, None] + columns[:, None, :])[:, None] + channels].float()


def _pixel_major(image: torch.Tensor) -> bool:
    """Whether a (3, H, W) tensor is a view of dense (H, W, 3) memory."""
    return image.stride() == (1, 3 * image.shape[2], 3)


def crop_resize(canvas: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """`boxes` (R, 5): each row's image in `canvas` and its box (left, top, right, bottom) in pixels, resized to
    size x size, in float32 [0, 1] (see the module's docstring). One call for all the rows."""
    return roi_align(canvas, boxes, size, spatial_scale=1.0, sampling_ratio=0, aligned=True).div_(255.0)


# The colour jitter as passes over all rows, each row's four operations in its own order: its brightness, contrast
# and saturation before its hue rotation in the passes "before" (positions 0-3), the hue, then those after it in the
# passes "after" (positions 1-3). A row with no blend in a pass keeps its pixels (f = 1).
BLEND_PASSES = ("before0", "before1", "before2", "before3", "after1", "after2", "after3")
# Per-row values the operations read (float32): which rows each operation changes (gates; the device gets those of
# the operations that are not an exact identity where a row does not have them), and the operations' factors.
GATES = ("flip", "hue", "grayscale", "blur", "solarize", *BLEND_PASSES)
GATED = 5  # the first GATES, those the device path reads
FACTORS = (*(f"{kind}_{step}" for step in BLEND_PASSES for kind in ("f", "mean", "grey")), "shift")


def _row_values(p: np.ndarray, hue_on: np.ndarray) -> np.ndarray:
    """GATES then FACTORS for every row, (len(GATES) + len(FACTORS), R) float32, from the rows' parameters `p` (R,
    len(VIEW_PARAMS)), on the host. A blend pass's factors f, mean and grey: x -> f x + mean x the image's mean grey +
    grey x its grey image; torchvision's f x + (1 - f) other, other black (brightness), the mean grey (contrast) or
    the grey image (saturation), with 1 - f where the other is, 0 elsewhere; f = 1 and zeros where the row has no
    blend in that pass. `hue_on`: whether each row's recipe rotates the hue (a drawn shift of 0 is not an exact
    identity, so it is gated); the hue's factor is 6 x its shift (in sixths of a turn)."""
    rows = len(p)
    order = p[:, PARAM_INDEX["order0"] : PARAM_INDEX["order3"] + 1].astype(np.int64)
    jitter = p[:, PARAM_INDEX["jitter"]] > 0
    has_hue = jitter & hue_on & (order == 3).any(1)
    hue_at = np.where(has_hue, (order == 3).argmax(1), 4)  # the hue's position, 4 where the row has none
    gates = {name: p[:, PARAM_INDEX[name]] > 0 for name in ("flip", "grayscale", "blur", "solarize")}
    gates["hue"] = has_hue
    factors = {"shift": (np.float32(6) * p[:, PARAM_INDEX["hue"]].astype(np.float32))}
    for step in BLEND_PASSES:
        k = int(step[-1])
        op = order[:, k]
        on = jitter & (op < 3) & ((k < hue_at) if step.startswith("before") else (k > hue_at))
        factor = p[np.arange(rows), PARAM_INDEX["brightness"] + np.minimum(op, 2)].astype(np.float32)
        f = np.where(on, factor, np.float32(1))
        g = np.float32(1) - f
        gates[step] = on
        factors |= {f"f_{step}": f, f"mean_{step}": g * (on & (op == 1)), f"grey_{step}": g * (on & (op == 2))}
    return np.stack([gates[name] for name in GATES] + [factors[name] for name in FACTORS]).astype(np.float32)


def _blur_weights(sigma: np.ndarray, kernel: int) -> np.ndarray:
    """Each row's Gaussian taps (R, kernel), torchvision's GaussianBlur kernel: exp(-(x / sigma)^2 / 2) at x evenly
    spaced in +-(kernel - 1) / 2, normalised to sum 1."""
    x = np.linspace(-(kernel - 1) / 2, (kernel - 1) / 2, kernel)
    taps = np.exp(-0.5 * (x / sigma[:, None]) ** 2)
    return (taps / taps.sum(1, keepdims=True)).astype(np.float32)


class _WholeBatch:
    """Every operation on every row: a row without it keeps its input exactly (see the module's docstring)."""

    def __init__(self, gates: list[torch.Tensor], factors: list[torch.Tensor]):
        self.gate, self.factor = dict(zip(GATES[:GATED], gates)), dict(zip(FACTORS, factors))

    def apply(self, x: torch.Tensor, operation: Callable, gate: str, *factors, identity: bool = False):
        """x after `operation(x, *factors)` (names of FACTORS, or tensors with a row each) on the rows whose `gate`
        is on; `identity`: the factors of the rows whose gate is off already make it an exact identity."""
        changed = operation(x, *(self.factor[f] if isinstance(f, str) else f for f in factors))
        return changed if identity else torch.lerp(x, changed, self.gate[gate])


class _SelectedRows:
    """Each operation on the rows that have it, gathered and put back (which rows: read from the host's values)."""

    def __init__(self, gates: np.ndarray, factors: list[torch.Tensor]):
        self.rows = {name: np.flatnonzero(gate).tolist() for name, gate in zip(GATES, gates)}
        self.factor = dict(zip(FACTORS, factors))

    def apply(self, x: torch.Tensor, operation: Callable, gate: str, *factors, identity: bool = False):
        rows = self.rows[gate]
        values = [self.factor[f] if isinstance(f, str) else f for f in factors]
        if len(rows) == len(x):
            return operation(x, *values)
        if rows:
            where = torch.tensor(rows).to(x.device, non_blocking=True)
            chosen = [value.index_select(0, where) for value in values]
            x.index_copy_(0, where, operation(x.index_select(0, where), *chosen))
        return x


def _views_of_one_size(recipes: list[ViewRecipe], canvas: torch.Tensor, p: np.ndarray, whole_batch: bool):
    """The views of `recipes` (all of one size) of the images in `canvas`: rows v * B + i, normalised float32.
    `p`: their (V * B, len(VIEW_PARAMS)) parameters. Everything the rows' operations read is computed on the host from
    `p` and sent to the device in one copy: the crop boxes, the gates and factors, the blur's taps."""
    size, kernel, batch, rows = recipes[0].size, recipes[0].kernel, canvas.shape[0], len(p)
    hue_on = np.repeat([r.aug.hue > 0 for r in recipes], batch)
    values = _row_values(p, hue_on)
    left_top = p[:, [PARAM_INDEX["left"], PARAM_INDEX["top"]]]
    boxes = np.concatenate(
        [(np.arange(rows) % batch)[:, None], left_top, left_top + p[:, [PARAM_INDEX["width"], PARAM_INDEX["height"]]]],
        1,
    )
    blur = any(r.aug.blur_prob > 0 for r in recipes)
    taps = np.repeat(_blur_weights(p[:, PARAM_INDEX["sigma"]], kernel), 3, axis=0) if blur else np.zeros((0, kernel))
    read = np.concatenate([values[:GATED], values[len(GATES) :]]) if whole_batch else values[len(GATES) :]
    parts = (read, boxes.astype(np.float32), taps.astype(np.float32))
    sent = torch.from_numpy(np.concatenate([part.reshape(-1) for part in parts]))
    sent = sent.to(canvas.device, non_blocking=True).split([part.size for part in parts])
    on_device = sent[0].view(-1, rows, 1, 1, 1).unbind(0)
    if whole_batch:
        on = _WholeBatch(on_device[:GATED], on_device[GATED:])
    else:
        on = _SelectedRows(values[: len(GATES)], on_device)

    x = crop_resize(canvas, sent[1].view(rows, 5), size)  # a new tensor: the operations below may change it in place
    jitter = {op for r in recipes for op in r.jitter_ops}
    if any(r.aug.hflip_prob > 0 or r.aug.shift_of is not None for r in recipes):
        x = on.apply(x, lambda x: x.flip(-1), "flip")
    passes = [s for s in BLEND_PASSES if s.startswith("before") or 3 in jitter] if jitter & {0, 1, 2} else []
    factors = ("f", "mean", "grey") if 2 in jitter else ("f", "mean")  # no saturation: no grey image to blend with
    for step in passes[:4]:
        x = on.apply(x, blend, step, *(f"{kind}_{step}" for kind in factors), identity=True)
    if 3 in jitter:
        x = on.apply(x, shift_hue, "hue", "shift")
    for step in passes[4:]:
        x = on.apply(x, blend, step, *(f"{kind}_{step}" for kind in factors), identity=True)
    if any(r.aug.grayscale_prob > 0 for r in recipes):
        x = on.apply(x, lambda x: grey(x).expand_as(x), "grayscale")
    if blur:
        x = on.apply(x, gaussian_blur, "blur", sent[2].view(rows, 3, kernel))
    if any(r.aug.solarize_prob > 0 for r in recipes):
        x = on.apply(x, solarize, "solarize")
    mean, std = _normalisation(recipes, batch, x.device)
    return (x - mean) / std


_CONSTANTS: dict = {}  # (what, ..., device) -> a small tensor made on its device once


def _constant(key: tuple, values, shape: tuple, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """A small constant tensor, sent to its device once: a copy from the host each step would wait for the device's
    queue of kernels."""
    key = (*key, str(device), dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(values, dtype=dtype).view(shape).to(device)
    return _CONSTANTS[key]


def _normalisation(recipes: list[ViewRecipe], batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The views' mean and std: (1, 3, 1, 1) where the recipes share them, else a row each."""
    stats = [(tuple(r.mean), tuple(r.std)) for r in recipes]
    repeat = 1 if len(set(stats)) == 1 else batch
    stats = stats[:1] if repeat == 1 else stats
    mean = [m for means, _ in stats for m in [means] * repeat]
    std = [s for _, stds in stats for s in [stds] * repeat]
    return (
        _constant(("mean", tuple(mean)), mean, (-1, 3, 1, 1), device),
        _constant(("std", tuple(std)), std, (-1, 3, 1, 1), device),
    )


def solarize(x: torch.Tensor) -> torch.Tensor:
    """Pixels at or above the threshold inverted (RandomSolarize at 128 of 255, as torchvision computes it)."""
    return torch.where(x >= SOLARIZE_THRESHOLD, 1 - x, x)


def grey(x: torch.Tensor) -> torch.Tensor:
    """The luma of (R, 3, H, W) images, (R, 1, H, W) (torchvision's rgb_to_grayscale)."""
    return (x * _constant(("grey",), GREY_WEIGHTS, (1, 3, 1, 1), x.device, x.dtype)).sum(1, keepdim=True)


def blend(x: torch.Tensor, f: torch.Tensor, to_mean: torch.Tensor, to_grey: torch.Tensor | None = None) -> torch.Tensor:
    """ColorJitter's brightness, contrast or saturation, each row by its own factors (see _row_values): f x +
    to_mean x the mean grey + to_grey x the grey image, clamped to [0, 1]; without `to_grey`, no row blends with its
    grey image. f = 1 and zeros change nothing. Each step one operation (no fused multiply-add), so that a row's
    pixels never depend on the batch."""
    luma = grey(x)
    other = to_mean * luma.mean(dim=(1, 2, 3), keepdim=True)
    if to_grey is not None:
        other = other + to_grey * luma  # where one of the two is non-zero, the other is an exact 0
    return (f * x + other).clamp_(0, 1)


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each image's hue by its `shift` (R, 1, 1, 1), in sixths of a turn, through HSV (torchvision's
    hexcone)."""
    high, largest = x.max(dim=1, keepdim=True)  # the first largest channel: red before green before blue on ties
    spread = high - x.amin(dim=1, keepdim=True)  # = value x saturation
    # Where channel c is the largest, the hue is 2c + (the next channel - the one after) / spread, in sixths.
    turns = x.index_select(1, _constant(("next",), [1, 2, 0], (3,), x.device, torch.long))
    turns = turns - x.index_select(1, _constant(("after",), [2, 0, 1], (3,), x.device, torch.long))
    sectors = _constant(("sectors",), [0.0, 2.0, 4.0], (1, 3, 1, 1), x.device, x.dtype)
    sixths = (turns / spread.clamp_min(torch.finfo(x.dtype).tiny) + sectors).gather(1, largest) + shift
    # HSV -> RGB: each channel from its own offset around the colour wheel (a grey pixel's hue: anything, spread 0).
    k = torch.remainder(sixths + _constant(("offsets",), [5.0, 3.0, 1.0], (1, 3, 1, 1), x.device, x.dtype), 6)
    return (high - spread * torch.minimum(k, 4 - k).clamp_(0, 1)).clamp_(0, 1)


def gaussian_blur(x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """Each image blurred by its own separable Gaussian `taps` (R, 3, kernel): one grouped convolution per axis for
    the whole batch, reflected edges (torchvision's GaussianBlur)."""
    b, c, h, w = x.shape
    kernel = taps.shape[-1]
    pad = kernel // 2
    flat = F.pad(x.reshape(1, b * c, h, w), (pad, pad, pad, pad), mode="reflect")
    flat = F.conv2d(flat, taps.reshape(b * c, 1, 1, kernel), groups=b * c)
    flat = F.conv2d(flat, taps.reshape(b * c, 1, kernel, 1), groups=b * c)
    return flat.view(b, c, h, w)


class DeviceViews:
    """`data.augment_on=device`: turns a raw batch (uint8 images, each view's parameters; see
    MultiViewDataset(raw=True)) into its views on the training device, the whole batch at once (`make_views`'
    whole-batch way); with `probe_transform` (the evaluation transform), also each image as validation sees it,
    `"probe_image"` (probe_images)."""

    def __init__(self, recipes: Sequence[ViewRecipe], pairs: bool, probe_transform: Callable | None = None):
        self.recipes, self.pairs, self.probe_transform = list(recipes), pairs, probe_transform

    def __call__(self, batch: dict, device: torch.device) -> dict:
        batch = dict(batch)
        images = batch.pop("image")
        if isinstance(images, PackedImages):
            images = images.unpack()
        images = decode(images, device) if isinstance(images, list) else images.to(device, non_blocking=True)
        params = batch.pop("params")  # (V, B, len(VIEW_PARAMS)), on the host: make_views sends what the views need
        recipes = self.recipes[:1] if self.pairs else self.recipes  # image-text pairs: one view, the image
        views = make_views(recipes, images, params, whole_batch=True, device=device)
        if self.pairs:
            batch["image"] = views[0]
        else:
            batch["views"] = views
        if self.probe_transform is not None:
            batch["probe_image"] = probe_images(self.probe_transform, images)
        return batch


def probe_images(transform: Callable, images) -> torch.Tensor:
    """`transform` (the evaluation transform) of each image, (B, 3, size, size): the images of one size in one call,
    so that a batch of one size (a tensor, or decoded JPEGs of one size) costs the same launches at any batch size;
    each size a call of its own (ImageNet's images: about one per image)."""
    if isinstance(images, torch.Tensor):
        return transform(images)
    groups: dict[tuple, list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    if len(groups) == 1:
        return transform(torch.stack(images))
    made = {tuple(rows): transform(torch.stack([images[i] for i in rows])) for rows in groups.values()}
    order = torch.tensor([i for rows in made for i in rows], device=images[0].device).argsort()
    return torch.cat(list(made.values()))[order]


def decode(images: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The batch's images as uint8 (3, H, W) tensors: those still encoded (1-D JPEG bytes, see
    solo.data.decode.raw_image) decoded on `device` in one call (nvJPEG on a GPU). The others stay where they are
    (make_views sends them to the device in one copy), unless some were decoded there: then they are moved too."""
    encoded = [i for i, image in enumerate(images) if image.dim() == 1]
    if not encoded:
        return images
    try:
        decoded = decode_jpeg([images[i] for i in encoded], mode=ImageReadMode.RGB, device=device)
    except RuntimeError as e:
        raise DataError(
            f"decoding the batch's JPEG images on {device} failed ({e}): a file passed the DataLoader worker's "
            "checks (header, end marker) but does not decode there. data.augment_on=cpu decodes each image in the "
            "workers, where one that fails is named and, with data.on_bad_image=skip, skipped"
        ) from None
    out = list(images)
    for i, image in zip(encoded, decoded):
        out[i] = image
    if len(encoded) == len(images):
        return out
    return [image.to(device, non_blocking=True) for image in out]
