"""The datasets' registry and their typed configs (the `data` config group): every dataset's config holds the keys
all datasets share (`DataConfig`) and its own, so a key that does not apply (`data.root` with `data=digits`) is an
error that names it.

A dataset registers a builder `(data config, split, seed, pairs) -> base dataset, or None for a missing val split`,
with its config schema, its normalisation statistics, whether images come at any size (the eval transform then
resizes), whether it has images (`images`) and image-text pairs (`pairs`), and whether building it writes a
cache (`writes_cache`: rank 0 builds first, the other ranks then read the cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from solo.errors import ConfigError, DataError
from solo.registry import Registry
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, Rule, choices, ruled

DATASETS = Registry("dataset", "data.name", group="data")

# (mean, std) per RGB channel, in [0, 1] units, used by the Normalize transform.
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
SPLITS = ("train", "val")

# error: an unreadable image stops the run, naming it; skip: the next readable sample takes its place, counted.
OnBadImage = choices("OnBadImage", "error", "skip")
# Where the training views' pixels are computed: cpu (per sample, in the DataLoader workers), device (the
# whole batch on the training device; parameters still drawn per sample in the workers), auto: device on CUDA.
AugmentOn = choices("AugmentOn", "auto", "cpu", "device")
IMAGES_TO_CHECK = Rule("must be a number of images or all", lambda v: v == "all" or v.isdigit())


@dataclass
class DataConfig:
    """The keys every dataset takes; a dataset with keys of its own registers a subclass."""

    name: str = "digits"  # a registered dataset: see solo.data.DATASETS
    image_size: int = ruled(
        16, AT_LEAST_ONE
    )  # the size of every view that sets no size of its own, and of evaluation images
    batch_size: int = ruled(128, AT_LEAST_ONE)  # per process; the global batch is batch_size x world size
    num_workers: Optional[int] = ruled(None, NON_NEGATIVE)  # DataLoader workers per process; None: what the machine has
    on_bad_image: OnBadImage = OnBadImage("error")
    # How many images of each split are decoded at the start, to find unreadable files before training: a count,
    # or all (the time it took is printed)
    check_images: str = ruled("100", IMAGES_TO_CHECK)
    augment_on: AugmentOn = AugmentOn("auto")
    # The data's identity, in the run directory's name and in its checkpoints: None derives it from where the data
    # are (data_id). A resume on data of another identity is refused; set it to the checkpoint's to resume a run
    # whose files were moved.
    id: Optional[str] = None


@dataclass
class FolderConfig(DataConfig):
    """A dataset read from files under `root`."""

    root: str = MISSING  # required


@dataclass
class DownloadConfig(FolderConfig):
    download: bool = False  # fetch it into root when missing (needs the network)


def register_dataset(
    name: str,
    *,
    schema: type = DataConfig,
    stats=IMAGENET_STATS,
    any_size: bool = False,
    images: bool = True,
    pairs: bool = False,
    writes_cache: bool = False,
):
    return DATASETS.register(
        name, schema=schema, stats=stats, any_size=any_size, images=images, pairs=pairs, writes_cache=writes_cache
    )


# The keys that say where a dataset's files are: a folder, a captions file, a Hugging Face dataset, shards.
LOCATION_KEYS = ("root", "file", "path", "shards", "val_shards")


def data_id(d) -> str:
    """data.id, or the identity of the data config `d` derived from where its files are: the dataset's name, then,
    for data in files, the folder's name and 6 hex digits of a hash of the absolute locations
    (`imagefolder-photos-3fa2b1`). Two folders give two identities, wherever they are named from."""
    if d.get("id"):
        return str(d.id)
    locations = data_locations(d)
    if not locations:
        return str(d.name)
    first = next(iter(locations.values()))
    folder = os.path.basename(first) if d.get("root") or d.get("path") else os.path.basename(os.path.dirname(first))
    digest = hashlib.sha256(json.dumps(locations, sort_keys=True).encode()).hexdigest()[:6]
    return "-".join(part for part in (str(d.name), re.sub(r"[^A-Za-z0-9_.]+", "_", folder).strip("_"), digest) if part)


def data_locations(d) -> dict[str, str]:
    """Where the files of data config `d` are: {key: its local paths made absolute, a URL or hub name as it is}."""
    return {key: _absolute(key, str(d[key])) for key in LOCATION_KEYS if d.get(key) is not None}


def _absolute(key: str, location: str) -> str:
    """A local path made absolute and normal; a URL, or a Hugging Face hub name (data.path that is no local
    folder), as it is."""
    hub_name = key == "path" and not os.path.exists(location)
    return location if "://" in location or hub_name else os.path.abspath(location)


def dataset_stats(name: str):
    """(mean, std) to normalise dataset `name` with."""
    return DATASETS[name].stats


def check_split(split: str, dataset: str) -> None:
    if split not in SPLITS:
        raise DataError(f"{dataset}: unknown split {split!r}; expected one of {list(SPLITS)}")


def build_split(d, split: str, seed: int, *, pairs: bool = False):
    """The base dataset of data config `d` (the `data` group) for `split` ("train" or "val"): image-text
    pairs when `pairs`, else (image, label) images; None for a val split that does not exist."""
    entry = DATASETS[d.name]
    check_split(split, d.name)
    if pairs and not entry.pairs:
        with_pairs = ", ".join(e.name for e in DATASETS if e.pairs)
        raise ConfigError(f"data={d.name} has no image-text pairs; datasets with pairs: {with_pairs}")
    if not pairs and not entry.images:
        raise ConfigError(f"data={d.name} holds image-text pairs only")
    return entry.target(d, split, seed=seed, pairs=pairs)


def build_dataset(name: str, split: str, *, seed: int = 0, pairs: bool = False, **keys):
    """The base dataset `name` for `split`, configured by keyword arguments (its config keys) instead of a data config."""
    return build_split(DATASETS.config(name, **keys), split, seed, pairs=pairs)
