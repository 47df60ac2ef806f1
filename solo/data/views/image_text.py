"""Image-text samples for CLIP-style training and evaluation, over the pairs of solo.data.sources.pairs:

- :class:`ImageTextDataset`: training samples keyed by ``(epoch, index)``; the image augmentation and the caption
  choice depend only on ``(seed, epoch, index)``, never on workers, ranks or read order.
- :class:`ZeroShotEvalDataset`: deterministic samples keyed by plain indices, for retrieval recall and zero-shot
  classification.
"""

from __future__ import annotations

import operator
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch

from solo.data.decode import raw_image, raw_pixels, read_or_skip
from solo.data.sampling.seeding import sample_seed, seeded_rng
from solo.data.sources.pairs import ImageTextPairs
from solo.data.views.multiview import epoch_and_index
from solo.errors import DataError


class ImageTextDataset:
    """Training samples ``{"image", "text", "label", "index"}`` keyed by ``(epoch, index)``.

    The image transform runs inside ``seeded_rng(sample_seed(seed, epoch, index, 0))``
    and the caption is drawn from ``pairs.caption_options(index)`` with a private
    generator seeded by ``sample_seed(seed, epoch, index, 1)``: a sample depends
    only on ``(seed, epoch, index)`` and reading never changes the caller's RNGs.

    Captions are tokenised when read. Those longer than the tokenizer's context are
    truncated (their prefix is kept); their number is ``truncated_captions``, counted
    at start from their lengths alone, and a single UserWarning reports it.
    """

    def __init__(
        self,
        pairs: ImageTextPairs,
        transform: Callable,
        tokenizer,
        seed: int,
        skip_bad: bool = False,
        raw: bool = False,
    ):
        if len(pairs) == 0:
            raise DataError(f"{type(pairs).__name__} is empty: no image-text pairs")
        self.pairs = pairs
        self.transform = transform
        self.tokenizer = tokenizer
        self.seed = seed
        self.skip_bad = skip_bad  # an unreadable image: the next readable pair (see read_or_skip)
        self.raw = raw  # the image and its view's parameters (ViewRecipe.draw), for the view to be made on the device
        distinct = set(pairs.captions_to_check())
        truncated = sorted(c for c in distinct if tokenizer.truncates(c))
        self.truncated_captions = len(truncated)
        if truncated:
            example = truncated[0]
            shown = example if len(example) <= 120 else example[:117] + "..."
            warnings.warn(
                f"{len(truncated)} of {len(distinct)} distinct captions are longer than the tokenizer "
                f"context ({tokenizer.context_length} tokens) and were truncated to it (the start is kept); e.g. "
                f"{shown!r} ({len(example.encode('utf-8'))} bytes). Raise the text context length "
                "to keep whole captions.",
                UserWarning,
                stacklevel=2,
            )

    @property
    def classes(self) -> Optional[List[str]]:
        return self.pairs.classes

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, key: Tuple[int, int]) -> Dict:
        epoch, key_index = epoch_and_index(key, len(self), type(self).__name__)
        image, index = read_or_skip(
            self._read_raw if self.raw else self.pairs.image, key_index, len(self), self.skip_bad
        )
        with seeded_rng(sample_seed(self.seed, epoch, key_index, 0)):
            if self.raw:
                image, height, width = image
                sample = {"image": image, "params": [self.transform.draw(height, width)]}  # one view
            else:
                sample = {"image": self.transform(image)}
        options = self.pairs.caption_options(index)
        choice = 0
        if len(options) > 1:
            g = torch.Generator().manual_seed(sample_seed(self.seed, epoch, index, 1))
            choice = int(torch.randint(len(options), (1,), generator=g))
        text, _ = self.tokenizer.encode(options[choice])
        label = int(self.pairs.label(index))
        return {**sample, "text": text, "label": label, "index": key_index, "skipped": (index - key_index) % len(self)}

    def _read_raw(self, index: int) -> tuple:
        if hasattr(self.pairs, "image_bytes"):
            return raw_image(*self.pairs.image_bytes(index))
        return raw_pixels(self.pairs.image(index))


class ZeroShotEvalDataset:
    """Deterministic samples ``{"image", "text", "label", "index"}`` keyed by plain indices.

    The caption is ``caption_options(index)[0]``; for retrieval recall on val
    pairs and zero-shot classification. ``transform`` should be deterministic.
    ``prompts``: per class, the captions whose mean text embedding is that class's
    zero-shot classifier (None: no zero-shot classification).
    """

    def __init__(
        self,
        pairs: ImageTextPairs,
        transform: Callable,
        tokenizer,
        prompts: Optional[List[List[str]]] = None,
        skip_bad: bool = False,
    ):
        self.pairs = pairs
        self.transform = transform
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.skip_bad = skip_bad  # an unreadable image: its row is marked "readable": False (as EvalDataset's)

    @property
    def classes(self) -> Optional[List[str]]:
        return self.pairs.classes

    def __len__(self) -> int:
        return len(self.pairs)

    def caption(self, index: int) -> str:
        return self.pairs.caption_options(index)[0]

    def __getitem__(self, index: int) -> Dict:
        index = operator.index(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        image, used = read_or_skip(self.pairs.image, index, len(self), self.skip_bad)
        text, _ = self.tokenizer.encode(self.caption(used))
        return {
            "image": self.transform(image),
            "text": text,
            "label": int(self.pairs.label(used)),
            "index": index,
            "readable": used == index,
        }

    def read(self, index: int):
        """Pair `index`'s image (an ImageReadError if unreadable)."""
        return self.pairs.image(index)
