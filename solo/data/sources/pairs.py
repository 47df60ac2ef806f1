"""Image-text pairs for CLIP-style contrastive pretraining.

Three layers, mirroring the image-only pipeline:

- *pairs* (:class:`ImageTextPairs`): which images and captions exist.
  :class:`DigitsPairs` captions the bundled digits with templates;
  :class:`CsvPairs` reads ``image,caption[,label]`` rows from a ``.csv`` or
  ``.jsonl`` file and validates everything at construction.
- :class:`ImageTextDataset`: training samples keyed by ``(epoch, index)``; the
  image augmentation and the caption choice depend only on
  ``(seed, epoch, index)``, never on workers, ranks or read order.
- :class:`ZeroShotEvalDataset`: deterministic samples keyed by plain indices,
  for retrieval recall and zero-shot classification.
"""

from __future__ import annotations

import csv
import json
import operator
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from omegaconf import MISSING
from PIL import Image

from solo.data.decode import decode, read_file
from solo.data.sources.images import DIGITS_STATS, DigitsDataset
from solo.data.sources.registry import DataConfig, register_dataset
from solo.errors import DataError, NotFound

# ------------------------------------------------------------------------- captions

DIGIT_TEMPLATES: List[str] = [
    "a photo of the number {word}.",
    "a handwritten {numeral}.",
    "the digit {word}.",
    "a picture of a {numeral}.",
    "an image of the number {numeral}.",
    "a scan of a handwritten {word}.",
    "the number {numeral}, written by hand.",
    "a small grey image of a {word}.",
]


def digit_caption(template: str, label: int) -> str:
    """Fill ``template``: ``{word}`` -> class name ("seven"), ``{numeral}`` -> "7"."""
    label = operator.index(label)
    if not 0 <= label < len(DigitsDataset.classes):
        raise DataError(f"digit label must be in 0..9, got {label}")
    return template.format(word=DigitsDataset.classes[label], numeral=str(label))


# ---------------------------------------------------------------------------- pairs

CAPTIONS_CHECKED = 10_000


class ImageTextPairs:
    """Interface of a set of image-text pairs.

    Subclasses implement ``__len__``, ``caption_options(index)`` (the non-empty
    list of captions sample ``index`` may get; element 0 is the one evaluation
    uses), ``image(index)`` (PIL RGB) and ``label(index)`` (-1 when unknown),
    and set ``classes`` (a list of class names, or ``None``).
    ``pairs[index]`` returns ``(image, label)``, so pairs also serve as a base
    dataset for :class:`solo.data.EvalDataset` (e.g. a linear probe).
    """

    classes: Optional[List[str]] = None

    def __len__(self) -> int:
        raise NotImplementedError

    def caption_options(self, index: int) -> List[str]:
        raise NotImplementedError

    def image(self, index: int) -> Image.Image:
        raise NotImplementedError

    def label(self, index: int) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        return self.image(index), self.label(index)

    def captions_to_check(self) -> List[str]:
        """The captions whose length is checked against the tokenizer's context at start: those of the first
        CAPTIONS_CHECKED samples (reading every caption of a large corpus would hold the start back)."""
        return [caption for index in range(min(len(self), CAPTIONS_CHECKED)) for caption in self.caption_options(index)]

    def _check_index(self, index: int) -> int:
        index = operator.index(index)
        if not 0 <= index < len(self):
            raise IndexError(f"{type(self).__name__}: index {index} out of range for {len(self)} samples")
        return index


class DigitsPairs(ImageTextPairs):
    """scikit-learn digits with template captions: every template filled with the sample's class."""

    def __init__(self, split: str, image_size: int, templates: Sequence[str] = DIGIT_TEMPLATES):
        if len(templates) == 0:
            raise DataError("DigitsPairs needs at least one caption template")
        self.base = DigitsDataset(split, image_size)
        self.templates = list(templates)
        self.classes = list(DigitsDataset.classes)
        # 10 classes x len(templates) captions, built once.
        self._captions = [[digit_caption(t, c) for t in self.templates] for c in range(len(self.classes))]

    def __len__(self) -> int:
        return len(self.base)

    def caption_options(self, index: int) -> List[str]:
        return list(self._captions[self.base.targets[self._check_index(index)]])

    def image(self, index: int) -> Image.Image:
        return self.base[self._check_index(index)][0]

    def label(self, index: int) -> int:
        return self.base.targets[self._check_index(index)]


_INT_RE = re.compile(r"^[+-]?\d+$")


class CsvPairs(ImageTextPairs):
    """Image-caption pairs listed in a ``.csv`` or ``.jsonl`` file.

    - ``.csv``: a header row with the columns ``image`` and ``caption``, and
      optionally ``label``; read with :class:`csv.DictReader` (UTF-8, a BOM is fine).
    - ``.jsonl``: one JSON object per line with the keys ``"image"`` and
      ``"caption"``, and optionally ``"label"``; blank lines are skipped.

    Image paths are relative to ``root`` (to the caption file's folder when
    ``root`` is None); absolute paths are used as they are. Captions are
    stripped of surrounding whitespace. Labels are non-negative integers; -1,
    an empty cell or a missing / null JSON label means unknown (-1).
    ``classes`` is ``["0", ..., str(max_label)]`` when every row has a label
    (so ``len(classes)`` is a valid class count and ``classes[label]`` works),
    else ``None``.

    The rows are validated here, nothing is skipped: unknown or missing
    columns, empty captions and bad labels each raise an error naming the file
    and the row. Image files are not looked at until read (start-up does not
    grow with a million stat calls): a missing or undecodable one raises
    :class:`ImageReadError` in :meth:`image`, named, or skipped and counted
    with ``data.on_bad_image=skip``.
    """

    REQUIRED = ("image", "caption")
    OPTIONAL = ("label",)

    def __init__(self, file: str, root: Optional[str] = None):
        self.file = os.fspath(file)
        ext = os.path.splitext(self.file)[1].lower()
        if ext not in (".csv", ".jsonl"):
            raise DataError(f"{self.file}: unsupported caption file type {ext!r}; use .csv or .jsonl")
        if not os.path.isfile(self.file):
            raise NotFound(f"caption file {self.file} does not exist")
        self.root = os.fspath(root) if root is not None else os.path.dirname(os.path.abspath(self.file))

        rows = self._read_csv() if ext == ".csv" else self._read_jsonl()
        if not rows:
            raise DataError(f"{self.file}: no data rows")

        self.paths: List[str] = []
        self.captions: List[str] = []
        self.labels: List[int] = []
        for row_no, line_no, image, caption, label in rows:
            self.paths.append(self._resolve(image, row_no, line_no))
            self.captions.append(self._check_caption(caption, row_no, line_no))
            self.labels.append(self._check_label(label, row_no, line_no))

        if all(label >= 0 for label in self.labels):
            self.classes = [str(c) for c in range(max(self.labels) + 1)]
        else:
            self.classes = None

    # -- reading

    @property
    def _row_note(self) -> str:
        skipped = "the header" if self.file.lower().endswith(".csv") else "blank lines"
        return f"rows counted from 1 over data rows, not {skipped}"

    def _where(self, row_no: int, line_no: int) -> str:
        return f"{self.file}, row {row_no} (line {line_no} of the file; {self._row_note})"

    def _check_fields(self, found: Sequence[str], where: str) -> None:
        expected = list(self.REQUIRED) + [f"{c} (optional)" for c in self.OPTIONAL]
        missing = [c for c in self.REQUIRED if c not in found]
        unknown = [c for c in found if c not in self.REQUIRED + self.OPTIONAL]
        duplicated = sorted({c for c in found if list(found).count(c) > 1})
        if missing or unknown or duplicated:
            problems = []
            if missing:
                problems.append(f"missing {missing}")
            if unknown:
                problems.append(f"unknown {unknown}")
            if duplicated:
                problems.append(f"duplicated {duplicated}")
            raise DataError(f"{where}: wrong columns ({'; '.join(problems)}): expected {expected}, found {list(found)}")

    def _read_csv(self):
        rows = []
        with open(self.file, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise DataError(
                    f"{self.file}: empty file; expected a header row with the columns "
                    f"{list(self.REQUIRED + self.OPTIONAL)} ('label' optional)"
                )
            header = [h.strip() for h in header]
            self._check_fields(header, f"{self.file} (header row)")
            for row_no, values in enumerate((v for v in reader if v), start=1):
                # Fully blank lines come back as [] and are skipped above; anything else is a row.
                if len(values) != len(header):
                    raise DataError(
                        f"{self._where(row_no, reader.line_num)}: {len(values)} values for "
                        f"{len(header)} columns {header}: {values}"
                    )
                row = dict(zip(header, values))
                label = row.get("label", "")
                rows.append((row_no, reader.line_num, row["image"], row["caption"], label))
        return rows

    def _read_jsonl(self):
        rows = []
        row_no = 0
        with open(self.file, encoding="utf-8-sig") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                row_no += 1
                where = self._where(row_no, line_no)
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: not valid JSON ({e}): {line.strip()[:200]!r}") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}: {obj!r}")
                self._check_fields(list(obj), where)
                for key in self.REQUIRED:
                    if not isinstance(obj[key], str):
                        raise DataError(
                            f"{where}: {key!r} must be a string, got {type(obj[key]).__name__} {obj[key]!r}"
                        )
                rows.append((row_no, line_no, obj["image"], obj["caption"], obj.get("label")))
        return rows

    # -- validation

    def _resolve(self, image: str, row_no: int, line_no: int) -> str:
        image = image.strip()
        if not image:
            raise DataError(f"{self._where(row_no, line_no)}: empty image path")
        return image if os.path.isabs(image) else os.path.join(self.root, image)

    def _check_caption(self, caption: str, row_no: int, line_no: int) -> str:
        text = caption.strip()
        if not text:
            raise DataError(f"{self._where(row_no, line_no)}: empty caption {caption!r}")
        return text

    def _check_label(self, label, row_no: int, line_no: int) -> int:
        if label is None or (isinstance(label, str) and not label.strip()):
            return -1  # unknown
        value = None
        if isinstance(label, str) and _INT_RE.match(label.strip()):
            value = int(label.strip())
        elif isinstance(label, int) and not isinstance(label, bool):
            value = label
        if value is not None and value >= -1:
            return value
        raise DataError(
            f"{self._where(row_no, line_no)}: bad label {label!r}; expected a non-negative integer "
            "class id (empty or -1 for unknown)"
        )

    # -- interface

    def __len__(self) -> int:
        return len(self.paths)

    def caption_options(self, index: int) -> List[str]:
        return [self.captions[self._check_index(index)]]

    def image_bytes(self, index: int) -> Tuple[bytes, str]:
        """The image file's bytes, not decoded (data.augment_on=device decodes JPEGs there), and what to call it."""
        index = self._check_index(index)
        return read_file(self.paths[index]), f"image {self.paths[index]} (row {index + 1} of {self.file})"

    def image(self, index: int) -> Image.Image:
        index = self._check_index(index)
        path = self.paths[index]
        return decode(path, f"image {path} (row {index + 1} of {self.file})")

    def label(self, index: int) -> int:
        return self.labels[self._check_index(index)]


# -------------------------------------------------------------------------- datasets


# ---------------------------------------------------------------------------- build


@register_dataset("digits", stats=DIGITS_STATS, pairs=True)
def _digits(d, split: str, seed: int, pairs: bool):
    """scikit-learn's bundled digits; as pairs, captioned from templates."""
    return DigitsPairs(split, d.image_size) if pairs else DigitsDataset(split, d.image_size)


@dataclass
class CsvConfig(DataConfig):
    file: str = MISSING  # required: the captions file (.csv or .jsonl); '{split}' in it is replaced by train / val
    root: Optional[str] = None  # what image paths are relative to; None: the captions file's folder


@register_dataset("csv", schema=CsvConfig, any_size=True, images=False, pairs=True)
def _csv_pairs(d, split: str, seed: int, pairs: bool) -> Optional[CsvPairs]:
    """:class:`CsvPairs` over `d.file` (.csv or .jsonl) with image paths relative to `d.root` (the caption
    file's folder when None). `{split}` in the file name is replaced by the split, e.g.
    `captions_{split}.csv`. For split "val" this returns None (no validation, no zero-shot) when that file
    does not exist, or when the name has no `{split}` (one file for both would evaluate on training pairs)."""
    path = d.file.replace("{split}", split)
    if split == "val" and ("{split}" not in d.file or not os.path.isfile(path)):
        return None
    return CsvPairs(path, d.root)
