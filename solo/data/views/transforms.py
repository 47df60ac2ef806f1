"""Image transforms: random views for pretraining (their recipes; solo.data.views.augment draws and applies them),
a fixed one for evaluation.

All randomness comes from Python's generator: one of the view's own (solo.data.views.multiview seeds one per
sample and view), or the process's, which :func:`solo.data.sampling.seeding.seeded_rng` seeds.
"""

from dataclasses import dataclass, field, fields
from typing import List, Mapping, Optional, Sequence, Union

import torch
from PIL import Image
from torchvision.transforms import v2

from solo.data.decode import as_rgb
from solo.data.views.augment import ViewRecipe, blur_kernel_size


@dataclass
class ViewAugmentation:
    """Augmentation recipe for one view, or `count` views (also a Hydra structured-config schema)."""

    size: Optional[int] = None  # crop side in pixels; None: data.image_size (multi-crop: smaller local crops)
    count: int = 1  # how many views of this recipe, each seeded by its own view index
    crop_scale: List[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    hflip_prob: float = 0.5
    jitter_prob: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    grayscale_prob: float = 0.2
    blur_prob: float = 0.0  # GaussianBlur, kernel ~10% of image size (odd), sigma U(0.1, 2.0)
    solarize_prob: float = 0.0  # threshold 128 on uint8
    # CMAE's pixel shifting: this view takes the crop box and flip of the earlier view `shift_of` (its index in the
    # expanded list), moved down and towards the view's right by whole pixels drawn uniformly up to `max_shift` of the
    # box's side each, kept inside the image; its own crop_scale and hflip_prob are then not used
    shift_of: Optional[int] = None
    max_shift: float = 0.0
    # PaKA's local crops (DINOv3.1): this view's box is drawn inside the box of the earlier view `inside_of`, its area
    # a share in crop_scale of that box's (aspect 3/4-4/3, as RandomResizedCrop), with its own flip
    inside_of: Optional[int] = None

    def validate(self) -> None:
        if self.size is not None and self.size < 1:
            raise ValueError(f"size must be a positive number of pixels (or null for data.image_size), got {self.size}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        scale = list(self.crop_scale)
        if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
            raise ValueError(f"crop_scale must be [min, max] with 0 < min <= max <= 1, got {scale}")
        for name in ("hflip_prob", "jitter_prob", "grayscale_prob", "blur_prob", "solarize_prob"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} is a probability and must be in [0, 1], got {p}")
        for name in ("brightness", "contrast", "saturation"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5], got {self.hue}")
        if self.shift_of is not None and self.shift_of < 0:
            raise ValueError(f"shift_of={self.shift_of}: give the index of an earlier view (0 is the first)")
        if self.inside_of is not None and (self.inside_of < 0 or self.shift_of is not None):
            raise ValueError(
                f"inside_of={self.inside_of}: give the index of an earlier view (0 is the first), and no shift_of"
            )
        if not 0.0 <= self.max_shift <= 1.0 or (self.max_shift > 0 and self.shift_of is None):
            raise ValueError(
                f"max_shift={self.max_shift}: a share of the box's side in [0, 1], for a view with shift_of "
                f"(shift_of={self.shift_of})"
            )


AugmentationLike = Union[ViewAugmentation, Mapping]


def as_view_augmentation(aug: AugmentationLike) -> ViewAugmentation:
    """Accept a ViewAugmentation or a mapping (e.g. a yaml/DictConfig entry) and validate it."""
    if not isinstance(aug, ViewAugmentation):
        known = {f.name for f in fields(ViewAugmentation)}
        unknown = sorted(set(aug) - known)
        if unknown:
            raise ValueError(f"unknown augmentation keys {unknown}; valid keys: {sorted(known)}")
        values = dict(aug)
        if "crop_scale" in values:
            values["crop_scale"] = [float(v) for v in values["crop_scale"]]
        aug = ViewAugmentation(**values)
    aug.validate()
    return aug


def expand_views(views: Sequence[AugmentationLike], image_size: int) -> List[tuple]:
    """One (recipe, crop size) per view, in view order: each recipe `count` times, at its `size` or `image_size`."""
    views = [as_view_augmentation(aug) for aug in views]
    check_shifts(views)
    return [(aug, aug.size or image_size) for aug in views for _ in range(aug.count)]


def check_shifts(views: Sequence[ViewAugmentation]) -> None:
    """Raise ValueError unless every view with `shift_of` or `inside_of` names an earlier view (in the expanded
    list)."""
    before = 0
    for entry, aug in enumerate(views):
        for key in ("shift_of", "inside_of"):
            named = getattr(aug, key)
            if named is not None and named >= before:
                raise ValueError(
                    f"augmentation.views[{entry}].{key}={named}: it names view {named}, but {before} come before it; "
                    "name an earlier view (counted from 0, each entry `count` times)"
                )
        before += aug.count


def view_sizes(views: Sequence[AugmentationLike], image_size: int) -> List[int]:
    return [size for _, size in expand_views(views, image_size)]


def build_view_transforms(views: Sequence[AugmentationLike], image_size: int, mean, std) -> List[ViewRecipe]:
    """One transform per view (see expand_views)."""
    return [build_view_transform(aug, size, mean, std) for aug, size in expand_views(views, image_size)]


def build_view_transform(
    aug: AugmentationLike, image_size: int, mean: Sequence[float], std: Sequence[float]
) -> ViewRecipe:
    """PIL RGB image (or uint8 (3, H, W) tensor) -> normalised float32 tensor (3, image_size, image_size), randomly
    augmented; its parameters can also be drawn and applied to a whole batch on a device (solo.data.views.augment)."""
    return ViewRecipe(as_view_augmentation(aug), image_size, mean, std)


def rgb(image):
    """A PIL image as RGB (solo.data.decode.as_rgb); a tensor as it is."""
    return as_rgb(image) if isinstance(image, Image.Image) else image


def build_eval_transform(
    image_size: int, mean: Sequence[float], std: Sequence[float], *, resize: bool, fit: bool = False
) -> v2.Compose:
    """Deterministic transform for validation / probing; uses no randomness.

    resize=True (large images such as ImageNet): shorter side to
    image_size * 256 / 224, then a center crop of image_size. resize=False:
    images are already image_size (digits, CIFAR, synthetic), just to tensor + normalise;
    fit=True resizes the whole image to image_size x image_size first (any image, to such a model).
    A PIL image of any mode becomes RGB first, as the data's readers make it (solo.data.decode.as_rgb).
    """
    ops = [rgb, v2.ToImage()]
    if fit:
        ops.append(v2.Resize((image_size, image_size), antialias=True))
    if resize:
        ops += [
            v2.Resize(int(round(image_size * 256 / 224)), antialias=True),
            v2.CenterCrop(image_size),
        ]
    ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(ops)


__all__ = [
    "ViewAugmentation",
    "as_view_augmentation",
    "blur_kernel_size",
    "build_view_transform",
    "build_view_transforms",
    "build_eval_transform",
    "check_shifts",
    "expand_views",
    "view_sizes",
]
