"""Dataset wrappers that turn base ``(image, label)`` samples into model inputs."""

import operator
from typing import Callable, Dict, Sequence, Tuple

from solo.data.datasets import ImageReadError
from solo.data.seeding import sample_seed, seeded_rng
from solo.errors import DataError


def read_or_skip(read: Callable, index: int, length: int, skip: bool):
    """(read(i), i) for i = index; with `skip`, an unreadable image gives way to the next readable sample
    (index + 1, ...), which depends on the files alone: the same on every rank, worker and world size."""
    for offset in range(length if skip else 1):
        i = (index + offset) % length
        try:
            return read(i), i
        except ImageReadError:
            if not skip:
                raise
    raise DataError(f"no image of the {length} samples can be read")


def check_images(read: Callable, count: int, skip: bool) -> list[str]:
    """Decode the first `count` samples; unreadable ones are an error naming them, or with `skip` returned."""
    bad = []
    for i in range(count):
        try:
            read(i)
        except ImageReadError as e:
            bad.append(str(e))
    if bad and not skip:
        raise DataError(
            f"{len(bad)} of the first {count} images cannot be read: {'; '.join(bad[:3])}"
            f"{'; ...' if len(bad) > 3 else ''}. Fix or remove them, or set data.on_bad_image=skip"
        )
    return bad


def epoch_and_index(key, length: int, owner: str) -> Tuple[int, int]:
    """Unpack a sampler key `(epoch, index)`, with errors that say what went wrong."""
    try:
        epoch, index = (operator.index(k) for k in key)
    except (TypeError, ValueError):
        raise TypeError(
            f"{owner} keys are (epoch, index) tuples, got {key!r}; "
            "iterate it with the epoch-aware sampler from solo.data.sampler"
        ) from None
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for {length} samples")
    return epoch, index


class MultiViewDataset:
    """Several augmented views per sample, reproducible from (seed, epoch, index, view).

    Keys are ``(epoch, index)`` tuples (the epoch-aware sampler yields them), so
    the epoch reaches DataLoader workers without shared state. View ``v`` is
    computed inside ``seeded_rng(sample_seed(seed, epoch, index, v))``: the result
    does not depend on rank, worker, world size or read order, and the caller's
    RNG state is left untouched.
    """

    def __init__(self, base, view_transforms: Sequence[Callable], seed: int, skip_bad: bool = False):
        if len(view_transforms) == 0:
            raise ValueError("MultiViewDataset needs at least one view transform")
        self.base = base
        self.view_transforms = list(view_transforms)
        self.seed = seed
        self.skip_bad = skip_bad  # unreadable images: the next readable sample (see read_or_skip)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: Tuple[int, int]) -> Dict:
        epoch, index = epoch_and_index(key, len(self), type(self).__name__)
        (image, label), used = read_or_skip(self.base.__getitem__, index, len(self), self.skip_bad)
        views = []
        for v, transform in enumerate(self.view_transforms):
            with seeded_rng(sample_seed(self.seed, epoch, index, v)):
                views.append(transform(image))
        return {"views": views, "label": int(label), "index": index, "skipped": int(used != index)}


class EvalDataset:
    """One deterministic view per sample, for validation and probes; keys are plain indices."""

    def __init__(self, base, transform: Callable):
        self.base = base
        self.transform = transform

    @property
    def classes(self):
        return self.base.classes

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Dict:
        index = operator.index(index)
        image, label = self.base[index]
        return {"image": self.transform(image), "label": int(label), "index": index}
