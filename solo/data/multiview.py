"""Dataset wrappers that turn base ``(image, label)`` samples into model inputs."""

import operator
from typing import Callable, Dict, Sequence, Tuple

from solo.data.seeding import sample_seed, seeded_rng


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

    def __init__(self, base, view_transforms: Sequence[Callable], seed: int):
        if len(view_transforms) == 0:
            raise ValueError("MultiViewDataset needs at least one view transform")
        self.base = base
        self.view_transforms = list(view_transforms)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: Tuple[int, int]) -> Dict:
        epoch, index = epoch_and_index(key, len(self), type(self).__name__)
        image, label = self.base[index]
        views = []
        for v, transform in enumerate(self.view_transforms):
            with seeded_rng(sample_seed(self.seed, epoch, index, v)):
                views.append(transform(image))
        return {"views": views, "label": int(label), "index": index}


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
