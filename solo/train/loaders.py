"""The pretraining data: a train source of per-sample seeded views (or pairs), and the evaluation loaders."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from solo.data import (
    DATASETS,
    EvalDataset,
    ImageFolderDataset,
    ImageTextDataset,
    MultiViewDataset,
    ZeroShotEvalDataset,
    build_eval_transform,
    build_split,
    build_view_transforms,
)
from solo.data.decode import unreadable
from solo.data.sampling.source import DataSource, MapDataSource, eval_loader, loader_workers
from solo.data.views.augment import DeviceViews
from solo.data.views.batch_spec import BatchSpec
from solo.data.views.multiview import collate_raw
from solo.distributed import DistEnv
from solo.errors import ConfigError, DataError
from solo.eval.zero_shot import class_prompts


@dataclass
class Splits:
    train: object  # base dataset (image, label) or image-text pairs
    val: object | None
    pairs: bool

    @property
    def num_classes(self) -> int | None:
        return len(self.train.classes) if self.train.classes else None


@dataclass
class ImageCheck:
    count: int  # images decoded, over the splits
    total: int  # the splits' images
    seconds: float
    # What was wrong with each image found unreadable (data.on_bad_image=skip), and with damaged shards
    unreadable: list[str]


def check_images(splits: Splits, d, env: DistEnv) -> ImageCheck:
    """Decode data.check_images images of each split read from encoded files (every one with `all`), shared among
    the ranks; an unreadable one stops the run with a DataError naming it, or with data.on_bad_image=skip is listed.
    Images held decoded in memory (the digits, CIFAR) cannot be unreadable and are not checked."""
    started, count, total, found = time.perf_counter(), 0, 0, []
    for split in (splits.train, splits.val):
        if split is None or not hasattr(split, "image_bytes"):
            continue
        checked = len(split) if d.check_images == "all" else min(int(d.check_images), len(split))
        read = split.image if splits.pairs else split.__getitem__
        found += [
            m for _, m in unreadable(read, range(env.rank, checked, env.world_size), loader_workers(d.num_workers))
        ]
        count, total = count + checked, total + len(split)
    if env.world_size > 1 and count:  # count is the same on every rank
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, found)
        found = sorted(m for ours in everyone for m in ours)
    if found and d.on_bad_image != "skip":
        raise DataError(
            f"{len(found)} of the {count} images checked cannot be read: {'; '.join(found[:3])}"
            f"{'; ...' if len(found) > 3 else ''}. Fix or remove them, or set data.on_bad_image=skip to leave "
            "unreadable images out"
        )
    damaged = getattr(splits.train, "problems", [])
    return ImageCheck(count, total, time.perf_counter() - started, damaged + found)


@dataclass
class Loaders:
    train: DataSource
    val: DataLoader | None  # the val split with the eval transform, sharded over ranks
    train_eval: DataLoader | None  # the train split with the eval transform (the online k-NN's memory bank)
    checked: ImageCheck  # the images decoded at the start (data.check_images)
    read_train: Callable  # index -> the train split's image (an ImageReadError when unreadable)
    device_views: DeviceViews | None  # data.augment_on=device: makes the train batch's views on the device
    zero_shot: DataLoader | None = None  # trainer.zero_shot_folder's images, sharded over ranks
    zero_shot_prompts: list[list[str]] | None = None  # ... and its classes' prompts

    def close(self) -> None:
        """Stop the loaders' workers now. Left to the garbage collector (the loaders sit in reference cycles), a
        persistent loader's queues can be finalised before its iterator, and each worker then waits out torch's
        5 s shutdown timeout: 12 s after `done:` on a folder with 2 workers."""
        for loader in (self.train.loader, self.val, self.train_eval, self.zero_shot):
            iterator = getattr(loader, "_iterator", None)  # where torch keeps a persistent loader's iterator
            if iterator is not None:
                iterator._shutdown_workers()
                loader._iterator = None


def build_splits(d, env: DistEnv, seed: int, pairs: bool) -> Splits:
    """The train and val base datasets of data config `d`; rank 0 downloads (or builds the shard index) first,
    the others read what it wrote."""
    first = (d.get("download", False) or DATASETS[d.name].writes_cache) and env.world_size > 1
    if first and not env.is_main:
        dist.barrier()
    train, val = (build_split(d, split, seed, pairs=pairs) for split in ("train", "val"))
    if first and env.is_main:
        dist.barrier()
    return Splits(train, val, pairs)


def build_loaders(
    splits: Splits,
    d,
    views,
    env: DistEnv,
    *,
    seed: int,
    spec: BatchSpec,
    knn: bool,
    device: torch.device,
    zero_shot_folder: str | None = None,
) -> Loaders:
    """`views`: the augmentation's view recipes; `spec`: what the method's batches carry besides them (its
    Method.batch_spec); `knn`: build the train_eval loader; `device`: the training device (pinned memory on CUDA;
    data.augment_on=auto makes the views there on CUDA); `zero_shot_folder`: an ImageFolder split to classify
    zero-shot (image-text methods)."""
    entry = DATASETS[d.name]
    transforms = build_view_transforms(views, d.image_size, *entry.stats)
    eval_transform = build_eval_transform(d.image_size, *entry.stats, resize=entry.any_size)
    checked = check_images(splits, d, env)
    on_device = d.augment_on == "device" or (d.augment_on == "auto" and device.type == "cuda")
    probe = eval_transform if spec.probe_image else None
    workers = loader_workers(d.num_workers)
    loader_args = dict(num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0)
    train_set = _train_set(splits, d, seed, transforms, probe, spec, raw=on_device)
    order = getattr(splits.train, "epoch_order", None)  # the dataset's own order (shards: with locality), else random
    source = MapDataSource(
        train_set,
        d.batch_size,
        env.rank,
        env.world_size,
        seed,
        order,
        **loader_args,
        **({"collate_fn": collate_raw} if on_device else {}),
    )
    sharded = partial(eval_loader, batch_size=d.batch_size, rank=env.rank, world_size=env.world_size, **loader_args)
    loaders = Loaders(
        source,
        *_eval_loaders(splits, d, eval_transform, spec.tokenizer, knn, sharded),
        checked,
        splits.train.image if splits.pairs else splits.train.__getitem__,
        DeviceViews(transforms, splits.pairs, probe) if on_device else None,
    )
    if zero_shot_folder:
        loaders.zero_shot, loaders.zero_shot_prompts = _zero_shot(zero_shot_folder, splits, d, sharded)
    return loaders


def _train_set(splits: Splits, d, seed: int, transforms: list, probe, spec: BatchSpec, raw: bool):
    """The train split as per-sample seeded views (or pairs), with what `spec` adds; `raw`: images and view
    parameters, for the views to be made on the device."""
    skip = d.on_bad_image == "skip"
    if splits.pairs:
        return ImageTextDataset(splits.train, transforms[0], spec.tokenizer, seed=seed, skip_bad=skip, raw=raw)
    return MultiViewDataset(
        splits.train, transforms, seed=seed, skip_bad=skip, raw=raw, fields=spec.fields, probe_transform=probe
    )


def _eval_loaders(splits: Splits, d, transform, tokenizer, knn: bool, sharded: Callable) -> tuple:
    """(val, train_eval): the val split through the eval transform (zero-shot prompts and tokens for image-text
    pairs), and for the k-NN the train split through it too (its memory bank); None where there is nothing to score."""
    skip = d.on_bad_image == "skip"
    val = train_eval = None
    if splits.val is not None and splits.pairs:  # retrieval needs no labels; zero-shot and the probe do
        classes = splits.val.classes
        prompts = class_prompts(d.name, classes) if classes else None
        val = sharded(ZeroShotEvalDataset(splits.val, transform, tokenizer, prompts, skip_bad=skip))
    elif splits.val is not None and splits.num_classes:
        val = sharded(EvalDataset(splits.val, transform, skip_bad=skip))
    if knn and val is not None and splits.num_classes:  # the k-NN's train features: no augmentation
        train_eval = sharded(EvalDataset(splits.train, transform, skip_bad=skip))
    return val, train_eval


def _zero_shot(folder: str, splits: Splits, d, sharded: Callable) -> tuple[DataLoader, list[list[str]]]:
    """trainer.zero_shot_folder's images, sharded over ranks, and its classes' prompts."""
    if not splits.pairs:
        raise ConfigError(
            f"trainer.zero_shot_folder={folder}: zero-shot classification needs an image-text method (clip, siglip); "
            "unset it"
        )
    # Normalised as main_linear.py normalises data=imagefolder, so both report the same accuracy.
    root, split = os.path.split(os.path.normpath(folder))
    images = ImageFolderDataset(root, split)
    if images.classes is None:
        raise ConfigError(f"trainer.zero_shot_folder={folder} has no class folders to classify into")
    transform = build_eval_transform(d.image_size, *DATASETS["imagefolder"].stats, resize=True)
    loader = sharded(EvalDataset(images, transform, skip_bad=d.on_bad_image == "skip"))
    return loader, class_prompts("imagefolder", images.classes)
