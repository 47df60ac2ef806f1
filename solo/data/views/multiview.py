"""Dataset wrappers that turn base ``(image, label)`` samples into model inputs."""

import operator
import random
from typing import Callable, Dict, Sequence, Tuple

import torch
from torch.utils.data import default_collate
from torchvision.io import ImageReadMode, decode_jpeg

from solo.data.decode import ImageReadError, raw_image, raw_pixels, read_or_skip
from solo.data.sampling.seeding import sample_seed
from solo.data.views.augment import make_views
from solo.data.views.batch_spec import SampleField
from solo.data.views.packed import PackedImages


def epoch_and_index(key, length: int, owner: str) -> Tuple[int, int]:
    """Unpack a sampler key `(epoch, index)`, with errors that say what went wrong."""
    try:
        epoch, index = (operator.index(k) for k in key)
    except (TypeError, ValueError):
        raise TypeError(
            f"{owner} keys are (epoch, index) tuples, got {key!r}; "
            "iterate it with the epoch-aware sampler from solo.data.sampling.sampler"
        ) from None
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for {length} samples")
    return epoch, index


class MultiViewDataset:
    """Several augmented views per sample, reproducible from (seed, epoch, index, view).

    Keys are ``(epoch, index)`` tuples (the epoch-aware sampler yields them), so
    the epoch reaches DataLoader workers without shared state. View ``v``'s parameters
    are drawn from ``random.Random(sample_seed(seed, epoch, index, v))``: the result
    does not depend on rank, worker, world size or read order, and the caller's
    RNG state is left untouched.

    A DataLoader worker reads a whole batch (``__getitems__``): the images (JPEG files
    decoded by torchvision's decode_jpeg, others by PIL) and each view's parameters,
    then makes each view of all its samples at once (solo.data.views.augment's batched
    operations, which give every sample the same view as alone). With ``raw`` it
    returns the images (JPEGs still encoded) and the parameters instead, for the
    views to be made on the device.

    ``fields`` (solo.data.views.batch_spec.SampleField) add entries drawn per sample with its views' parameters:
    field k from the sample's own generator of stream ``len(view_transforms) + k``, after its views'; drawn here, they
    are the same on the CPU and the device path. ``probe_transform`` (the evaluation transform) adds
    ``"probe_image"``, the sample as validation sees it (BatchSpec.probe_image); with ``raw``,
    solo.data.views.augment.DeviceViews makes it.
    """

    def __init__(
        self,
        base,
        view_transforms: Sequence[Callable],
        seed: int,
        skip_bad: bool = False,
        raw: bool = False,
        fields: Sequence[SampleField] = (),
        probe_transform: Callable | None = None,
    ):
        if len(view_transforms) == 0:
            raise ValueError("MultiViewDataset needs at least one view transform")
        self.base = base
        self.view_transforms = list(view_transforms)
        self.seed = seed
        self.skip_bad = skip_bad  # unreadable images: the next readable sample (see read_or_skip)
        self.raw = raw
        self.fields = tuple(fields)
        self.probe_transform = probe_transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: Tuple[int, int]) -> Dict:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list) -> list[Dict]:
        samples = [self._raw_sample(key) for key in keys]
        if self.raw:
            return samples
        images = [sample.pop("image") for sample in samples]
        params = views_parameters([sample.pop("params") for sample in samples])
        views = make_views(self.view_transforms, images, params)
        for i, (sample, image) in enumerate(zip(samples, images)):
            sample["views"] = [view[i] for view in views]
            if self.probe_transform is not None:
                sample["probe_image"] = self.probe_transform(image)
        return samples

    def _raw_sample(self, key: Tuple[int, int]) -> Dict:
        """The sample's image (its next readable one, with skip_bad: `"skipped"` unreadable ones from `"index"` on
        gave way to it) and each view's parameters."""
        epoch, index = epoch_and_index(key, len(self), type(self).__name__)
        ((image, height, width), label), used = read_or_skip(self._read, index, len(self), self.skip_bad)
        # A generator of its own per view: the same numbers as the process's seeded with it (seeded_rng), without
        # saving and restoring the process's generators (a large share of drawing a view: docs/performance.md).
        params: list[list[float]] = []
        for v, recipe in enumerate(self.view_transforms):
            params.append(recipe.draw(height, width, random.Random(sample_seed(self.seed, epoch, index, v)), params))
        sample = {
            "image": image,
            "params": params,
            "label": int(label),
            "index": index,
            "skipped": (used - index) % len(self),
        }
        if self.fields:
            views = torch.tensor(params, dtype=torch.float64)
            for k, field in enumerate(self.fields):
                rng = random.Random(sample_seed(self.seed, epoch, index, len(self.view_transforms) + k))
                sample[field.name] = field(views, height, width, rng)
        return sample

    def _read(self, index: int) -> tuple:
        """((image, height, width), label): JPEGs still encoded with `raw`, else decoded here, where an image that
        fails to decode is unreadable (and skipped with skip_bad)."""
        if not hasattr(self.base, "image_bytes"):
            image, label = self.base[index]
            return raw_pixels(image), label
        data, name = self.base.image_bytes(index)
        image, height, width = raw_image(data, name)
        if image.dim() == 1 and not self.raw:
            try:  # torchvision directly: solo.data.views.augment.decode's error is the device path's
                image = decode_jpeg(image, mode=ImageReadMode.RGB)
            except RuntimeError as e:
                raise ImageReadError(f"cannot read {name}: {e}") from e
        return (image, height, width), self.base.label(index)


def views_parameters(params: list[list[list[float]]]) -> torch.Tensor:
    """The samples' view parameters (per sample, per view, ViewRecipe.draw's list) as one (V, B, len(VIEW_PARAMS)) float64
    tensor: what make_views takes."""
    return torch.tensor(params, dtype=torch.float64).transpose(0, 1)


def collate_raw(samples: list[dict]) -> dict:
    """DataLoader collation of raw samples: images of one size are stacked (one copy to the device), of several
    sizes (JPEGs still encoded among them) packed into one tensor (PackedImages); the views' parameters as one (V, B, len(VIEW_PARAMS)) tensor; the rest is collated as usual."""
    batch = default_collate([{k: v for k, v in s.items() if k not in ("image", "params")} for s in samples])
    images = [s["image"] for s in samples]
    batch["image"] = torch.stack(images) if len({im.shape for im in images}) == 1 else PackedImages.pack(images)
    batch["params"] = views_parameters([s["params"] for s in samples])
    return batch


class EvalDataset:
    """One deterministic view per sample, for validation and probes; keys are plain indices. With `skip_bad`, an
    unreadable image's row holds the next readable one, marked `"readable": False` for consumers to drop
    (solo.data.real_rows): it is left out at every world size alike."""

    def __init__(self, base, transform: Callable, skip_bad: bool = False):
        self.base = base
        self.transform = transform
        self.skip_bad = skip_bad

    @property
    def classes(self):
        return self.base.classes

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Dict:
        index = operator.index(index)
        (image, label), used = read_or_skip(self.base.__getitem__, index, len(self), self.skip_bad)
        return {"image": self.transform(image), "label": int(label), "index": index, "readable": used == index}

    def read(self, index: int):
        """Sample `index` as the base dataset gives it (an ImageReadError if unreadable)."""
        return self.base[index]
