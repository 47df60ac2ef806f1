#!/usr/bin/env python
"""Start-up time and samples/s of the same images as files (data=imagefolder), WebDataset shards (data=webdataset)
and a Parquet dataset read through Hugging Face `datasets` (data=huggingface).

    python bench/sources.py                                    # 2000 JPEGs of 224 px, 1000 per shard, workers 0 and 2
    python bench/sources.py --images 10000 --size 160 --workers 0 2 4

Writes an ImageFolder of random-texture JPEGs in a temporary folder, converts it with solo.data.make_shards (to tar
shards, and with --format parquet to Parquet files), then opens each as training does (`build_dataset`: the start-up,
timed: listing the files, indexing the shards once and reading the index back, converting the Parquet files to
Arrow once and opening the Arrow cache) and reads one epoch of each through solo's global-batch sampler and a
DataLoader (batch 128, one process): the files and the Parquet rows in a random order, the shards in their windowed
order (data.shuffle_window). Two columns each:
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

from solo.data import HuggingFaceImages, ShardDataset, build_dataset, build_eval_transform  # noqa: E402
from solo.data.make_shards import main as make_shards  # noqa: E402
from solo.data.sampling.sampler import GlobalBatchSampler  # noqa: E402
from solo.data.sources.registry import IMAGENET_STATS  # noqa: E402


def write_jpegs(root: str, count: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = os.path.join(root, f"class_{i % classes}")
        os.makedirs(folder, exist_ok=True)
        # Smooth noise compresses like a photograph more than white noise does.
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((size, size), Image.BICUBIC).save(
            os.path.join(folder, f"{i:06d}.jpg"), quality=90
        )


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
        if isinstance(self.dataset, HuggingFaceImages):
            return len(self.dataset.image_bytes(index)[0])
        with open(self.dataset.samples[index][0], "rb") as f:
            return len(f.read())


def samples_per_second(dataset, order, decode: bool, workers: int, batch: int, size: int) -> float:
    sampler = GlobalBatchSampler(len(dataset), batch, rank=0, world_size=1, seed=0, order=order)
    loader = DataLoader(Read(dataset, decode, size), batch_sampler=sampler, num_workers=workers)
    start, count = time.perf_counter(), 0
    for b in loader:
        count += len(b)
    return count / (time.perf_counter() - start)


def timed(build):
    start = time.perf_counter()
    return build(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=224, help="side of the JPEGs written")
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-cache")  # a first start: Parquet not yet converted
        folder = os.path.join(tmp, "folder")
        write_jpegs(os.path.join(folder, "train"), args.images, args.size)
        count = -(-args.images // args.per_shard)
        for kind, out in (("webdataset", "shards"), ("parquet", "parquet")):
            make_shards(
                [
                    "imagefolder",
                    os.path.join(folder, "train"),
                    os.path.join(tmp, out),
                    "--format",
                    kind,
                    "--samples-per-shard",
                    str(args.per_shard),
                ]
            )
        spec = os.path.join(tmp, "shards", f"{{00000..{count - 1:05d}}}.tar")
        builders = {
            "files": lambda: build_dataset("imagefolder", "train", root=folder),
            "shards": lambda: build_dataset("webdataset", "train", shards=spec, cache_dir=os.path.join(tmp, "cache")),
            "huggingface": lambda: build_dataset(
                "huggingface", "train", path=os.path.join(tmp, "parquet"), val_split=None
            ),
        }
        sources, starts = {}, {}
        for name, build in builders.items():
            _, first = timed(build)  # the first start writes the shard index / the Arrow cache
            sources[name], again = timed(build)
            starts[name] = (first, again)
        files = sources["files"]
        print(
            f"{args.images} JPEGs of {args.size} px ({sum(os.path.getsize(p) for p, _ in files.samples) / args.images / 1024:.0f} KiB "
            f"each), {count} shards or Parquet files, batch {args.batch}, {os.cpu_count()} CPUs"
        )
        print("| source | start-up, first (s) | start-up, again (s) |")
        print("|---|---|---|")
        for name, (first, again) in starts.items():
            print(f"| {name} | {first:.2f} | {again:.2f} |")
        print("\n| workers | read | files (samples/s) | shards (samples/s) | huggingface (samples/s) |")
        print("|---|---|---|---|---|")
        for workers in args.workers:
            for decode in (False, True):
                speeds = [
                    samples_per_second(d, getattr(d, "epoch_order", None), decode, workers, args.batch, 224)
                    for d in sources.values()
                ]
                print(
                    f"| {workers} | {'decoded' if decode else 'bytes'} | "
                    + " | ".join(f"{v:,.0f}" for v in speeds)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
