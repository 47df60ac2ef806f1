"""What a method's batches carry besides the views (or image-text pairs), "label", "index" and "skipped".

A method declares it in one object, a `BatchSpec` (solo.methods.base.Method.batch_spec), and the data layer reads it
in one place (solo.train.loaders.build_loaders). A new need is a new `SampleField`, written beside the method (in its
own module, inside solo or not): the data workers call it for every sample with that sample's views' parameters,
and the batch carries what it returns under its name, on the CPU path and the device path alike, split into
micro-batches by trainer.accumulate like every other entry.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from solo.data.views.augment import BOX_AND_FLIP, PARAM_INDEX


class SampleField(Protocol):
    """One entry of every sample of a batch, `batch[name]`, drawn in the data worker with the sample's views."""

    name: str

    def __call__(self, params: torch.Tensor, height: int, width: int, rng: random.Random) -> torch.Tensor:
        """The sample's entry. `params`: its views' parameters, (V, len(VIEW_PARAMS)) float64 (solo.data.views.augment);
        `height`, `width`: its image's; `rng`: a generator of its own, seeded by the run's seed, the epoch, the sample
        and the field's place in BatchSpec.fields, so that the entry does not depend on the world size, the number of
        workers, the read order or a resume."""
        ...


@dataclass(frozen=True)
class PatchMasks:
    """The sample's patch mask from a generator of solo.data.views.masks, as `batch["mask"]`."""

    generator: Callable[[random.Random], torch.Tensor]
    name: str = "mask"

    def __call__(self, params: torch.Tensor, height: int, width: int, rng: random.Random) -> torch.Tensor:
        return self.generator(rng)


@dataclass(frozen=True)
class ViewBoxes:
    """Each view's crop box in the image and its flip, as `batch["view_boxes"]` (see `view_boxes`): for losses that
    pair the views' feature-map cells by where they lie in the image (VICRegL, DetCon: solo.methods.local)."""

    name: str = "view_boxes"

    def __call__(self, params: torch.Tensor, height: int, width: int, rng: random.Random) -> torch.Tensor:
        return view_boxes(params, height, width)


def view_boxes(params: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Each view's crop box in the image and its flip, (V, 5) float32: top, left, height and width in units of the
    image's height and width (the box's rows are [top, top + height) of [0, 1)), then 1.0 where the view is mirrored
    left-right after the crop. `params`: the views' (V, len(VIEW_PARAMS)) parameters (solo.data.views.augment)."""
    columns = [PARAM_INDEX[name] for name in BOX_AND_FLIP]
    box = params[:, columns]
    return (box / box.new_tensor([height, width, height, width, 1.0])).float()


@dataclass(frozen=True)
class BatchSpec:
    """What a method's batches carry besides the views (or pairs), "label", "index" and "skipped"."""

    # Per-sample entries drawn in the data workers with the views (field k from the sample's stream V + k).
    fields: tuple[SampleField, ...] = ()
    # `batch["probe_image"]`: each image through the evaluation transform, for an online probe that learns on what it
    # is evaluated on (methods whose views are masked or far from whole images: MAE, I-JEPA, DINOv2, EMP-SSL).
    probe_image: bool = False
    # Image-text methods: the tokenizer of the captions (`batch["text"]`) and of zero-shot prompts.
    tokenizer: Callable | None = None
