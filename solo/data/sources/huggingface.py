"""Hugging Face datasets (`data=huggingface`): a folder written by `save_to_disk`, Parquet or Arrow files, or (with
the network) a dataset on the hub, read through the `datasets` library.

`datasets` keeps a split as memory-mapped Arrow: opening one reads no rows, so start-up does not grow with its size
(Parquet files are converted to Arrow once, into the library's cache, by rank 0 before the others read it). Images
stay encoded in the table (`datasets.Image(decode=False)`) and are decoded in the DataLoader workers, where one that
does not decode is an ImageReadError: named, or skipped and counted with `data.on_bad_image=skip`, as with every
source. Labels come from a ClassLabel column (its names are the classes) or an integer one.
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
from omegaconf import MISSING
from PIL import Image

from solo.data.decode import ImageReadError, decode, read_file
from solo.data.sources.pairs import ImageTextPairs
from solo.data.sources.registry import DataConfig, register_dataset
from solo.errors import ConfigError, DataError, NotFound, require

FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}


@dataclass
class HuggingFaceConfig(DataConfig):
    # A save_to_disk folder, a folder of Parquet/Arrow files (split from file names: train-*.parquet, ...), one such
    # file or a glob of them (split "train"), or a hub name such as "uoft-cs/cifar10" (needs the network).
    path: str = MISSING
    train_split: str = "train"
    val_split: Optional[str] = "validation"  # None: no validation
    image_column: str = "image"  # an Image feature, or strings that are image paths
    label_column: Optional[str] = "label"  # a ClassLabel or integer column; None: unlabelled
    caption_column: Optional[str] = None  # image-text methods: a string per row, or a list (one drawn per epoch)


@functools.lru_cache(maxsize=4)  # the train and the val split are built one after the other: resolve the files once
def load_splits(path: str):
    """The splits at `path` as a {name: datasets.Dataset} mapping; NotFound naming data.path when nothing is there."""
    datasets = require("datasets", "data=huggingface", "huggingface")
    datasets.disable_progress_bars()
    try:
        if os.path.isdir(path) and any(
            os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")
        ):
            loaded = datasets.load_from_disk(path)
        elif os.path.splitext(path)[1] in FILE_BUILDERS and glob.glob(path):
            loaded = datasets.load_dataset(FILE_BUILDERS[os.path.splitext(path)[1]], data_files={"train": path})
        else:
            loaded = datasets.load_dataset(path)
    except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
        raise NotFound(
            f"data.path={path!r}: no dataset there ({type(e).__name__}: {e}); give a save_to_disk folder, "
            "Parquet/Arrow files or a hub name"
        ) from None
    return loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}


class HuggingFaceImages:
    """(image, label) samples of one split of a Hugging Face dataset; images decoded when read."""

    def __init__(self, table, image_column: str, label_column: Optional[str], where: str):
        import datasets

        self.where = where
        _check_column(table, image_column, "data.image_column", where)
        if isinstance(table.features[image_column], datasets.Image):
            table = table.cast_column(image_column, datasets.Image(decode=False))
        elif getattr(table.features[image_column], "dtype", None) != "string":
            raise DataError(
                f"{where}: data.image_column={image_column!r} holds {table.features[image_column]}; "
                "expected images (datasets.Image) or image paths (strings)"
            )
        self.image_column, self.images = image_column, table.select_columns([image_column])
        self.labels, self.classes = _labels(table, label_column, where)

    def __len__(self) -> int:
        return len(self.images)

    def image_bytes(self, index: int) -> Tuple[bytes, str]:
        """The image's encoded bytes (data.augment_on=device decodes JPEGs there) and what to call it."""
        value = self.images[int(index)][self.image_column]
        name = f"image of row {index} of {self.where}"
        if isinstance(value, str):
            return read_file(value), f"{name} ({value})"
        if value is None or (value.get("bytes") is None and not value.get("path")):
            raise ImageReadError(f"{name}: empty")
        if value.get("bytes") is None:
            return read_file(value["path"]), f"{name} ({value['path']})"
        return value["bytes"], name

    def image(self, index: int) -> Image.Image:
        return decode(*self.image_bytes(index))

    def label(self, index: int) -> int:
        return -1 if self.labels is None else int(self.labels[index])

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        return self.image(index), self.label(index)


class HuggingFacePairs(HuggingFaceImages, ImageTextPairs):
    """Image-caption pairs of one split: the caption column holds a string, or a list of strings per row."""

    def __init__(
        self, table, image_column: str, label_column: Optional[str], caption_column: Optional[str], where: str
    ):
        if caption_column is None:
            raise ConfigError(
                f"data.caption_column is not set: image-text methods read the captions of {where} "
                f"from it; its columns: {table.column_names}"
            )
        _check_column(table, caption_column, "data.caption_column", where)
        super().__init__(table, image_column, label_column, where)
        self.caption_column, self.captions = caption_column, table.select_columns([caption_column])

    def caption_options(self, index: int) -> List[str]:
        value = self.captions[int(index)][self.caption_column]
        options = [value] if isinstance(value, str) else list(value or [])
        options = [c.strip() for c in options if isinstance(c, str) and c.strip()]
        if not options:
            raise DataError(f"{self.where}, row {index}: no caption in data.caption_column={self.caption_column!r}")
        return options


def _check_column(table, column: str, key: str, where: str) -> None:
    if column not in table.column_names:
        raise ConfigError(f"{key}={column!r}: {where} has no such column; its columns: {table.column_names}")


def _labels(table, label_column: Optional[str], where: str) -> tuple[np.ndarray | None, list[str] | None]:
    """The label of every row (read once: one column of a memory-mapped table) and the class names."""
    import datasets

    if label_column is None:
        return None, None
    _check_column(table, label_column, "data.label_column", where)
    feature = table.features[label_column]
    if not isinstance(feature, datasets.ClassLabel) and not str(getattr(feature, "dtype", "")).startswith(
        ("int", "uint")
    ):
        raise DataError(
            f"{where}: data.label_column={label_column!r} holds {feature}; expected class ids "
            "(a ClassLabel or integer column), or set data.label_column=null"
        )
    # The whole column at once, not row by row (docs/performance.md).
    labels = table.with_format("arrow")[label_column].to_numpy().astype(np.int64)
    if isinstance(feature, datasets.ClassLabel):
        return labels, list(feature.names)
    return labels, [str(c) for c in range(int(labels.max(initial=-1)) + 1)] or None


@register_dataset("huggingface", schema=HuggingFaceConfig, any_size=True, pairs=True, writes_cache=True)
def _huggingface(d, split: str, seed: int, pairs: bool) -> Optional[HuggingFaceImages]:
    """`data.train_split` for train, `data.val_split` for val (None: no validation) of the dataset at `data.path`."""
    name = d.train_split if split == "train" else d.val_split
    if name is None:
        return None
    splits = load_splits(d.path)
    if name not in splits:
        key = "data.train_split" if split == "train" else "data.val_split"
        raise ConfigError(
            f"{key}={name!r}: {d.path} has no such split; its splits: {sorted(splits)}"
            + ("; or data.val_split=null for no validation" if split == "val" else "")
        )
    where = f"split {name!r} of {d.path}"
    if pairs:
        return HuggingFacePairs(splits[name], d.image_column, d.label_column, d.caption_column, where)
    return HuggingFaceImages(splits[name], d.image_column, d.label_column, where)
