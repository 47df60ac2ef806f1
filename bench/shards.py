#!/usr/bin/env python
"""Samples/s read from WebDataset shards (data=webdataset) against the same images as files (data=imagefolder).

    python bench/shards.py                                     # 2000 JPEGs of 224 px, 1000 per shard, workers 0 and 2
    python bench/shards.py --images 10000 --size 160 --workers 0 2 4

Writes an ImageFolder of random-texture JPEGs in a temporary folder, converts it with solo.data.make_shards,
then reads one epoch of each through solo's global-batch sampler and a DataLoader (batch 128, one process):
the files in a random order, the shards in their windowed order (data.shuffle_window). Two columns each:
`bytes` only reads the encoded images, `decoded` also decodes them and resizes to 224 px (the eval transform),
which is what a training step gets before its augmentations. The files are in the page cache (just written),
so this measures solo's overhead per sample, not a disk: on a network file system shards also save one
open() per sample.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # solo, from a checkout too

from solo.data import build_eval_transform  # noqa: E402
from solo.data.sources.images import ImageFolderDataset  # noqa: E402
from solo.data.sources.registry import IMAGENET_STATS  # noqa: E402
from solo.data.make_shards import main as make_shards  # noqa: E402
from solo.data.sampling.sampler import GlobalBatchSampler  # noqa: E402
from solo.data.sources.shards import ShardDataset  # noqa: E402


def write_jpegs(root: str, count: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = os.path.join(root, f"class_{i % classes}")
        os.makedirs(folder, exist_ok=True)
        # Smooth noise compresses like a photograph more than white noise does.
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((size, size), Image.BICUBIC).save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)


class Read:
    """Sampler keys (epoch, index) -> the encoded bytes, or the decoded and resized image tensor."""

    def __init__(self, dataset, decode: bool, size: int):
        self.dataset, self.decode = dataset, decode
        self.transform = build_eval_transform(size, *IMAGENET_STATS, resize=True)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index = key[1]
        if self.decode:
            return self.transform(self.dataset[index][0])
        if isinstance(self.dataset, ShardDataset):
            return len(self.dataset.member(index, "jpg"))
        with open(self.dataset.samples[index][0], "rb") as f:
            return len(f.read())


def samples_per_second(dataset, order, decode: bool, workers: int, batch: int, size: int) -> float:
    sampler = GlobalBatchSampler(len(dataset), batch, rank=0, world_size=1, seed=0, order=order)
    loader = DataLoader(Read(dataset, decode, size), batch_sampler=sampler, num_workers=workers)
    start, count = time.perf_counter(), 0
    for b in loader:
        count += len(b)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=224, help="side of the JPEGs written")
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_jpegs(os.path.join(tmp, "folder", "train"), args.images, args.size)
        make_shards(["imagefolder", os.path.join(tmp, "folder", "train"), os.path.join(tmp, "shards"),
                     "--samples-per-shard", str(args.per_shard)])
        count = -(-args.images // args.per_shard)
        files = ImageFolderDataset(os.path.join(tmp, "folder"), "train")
        shards = ShardDataset(os.path.join(tmp, "shards", f"{{00000..{count - 1:05d}}}.tar"), os.path.join(tmp, "cache"))
        print(f"{args.images} JPEGs of {args.size} px ({sum(os.path.getsize(p) for p, _ in files.samples) / args.images / 1024:.0f} KiB "
              f"each), {count} shards, batch {args.batch}, {os.cpu_count()} CPUs")
        print("| workers | read | files (samples/s) | shards (samples/s) | shards / files |")
        print("|---|---|---|---|---|")
        for workers in args.workers:
            for decode in (False, True):
                f = samples_per_second(files, None, decode, workers, args.batch, 224)
                s = samples_per_second(shards, shards.epoch_order, decode, workers, args.batch, 224)
                print(f"| {workers} | {'decoded' if decode else 'bytes'} | {f:,.0f} | {s:,.0f} | {s / f:.2f} |", flush=True)


if __name__ == "__main__":
    main()
