"""Write WebDataset tar shards (data=webdataset) or a Parquet dataset (data=huggingface) from an ImageFolder split or
a captions CSV/JSONL.

    python -m solo.data.make_shards imagefolder /data/imagenet/train /shards/imagenet/train --samples-per-shard 1000
    python -m solo.data.make_shards csv /data/captions_train.csv /shards/captions/train --root /data/images
    python -m solo.data.make_shards imagefolder /data/imagenet/val /data/imagenet-parquet --format parquet

Each sample keeps its image file's bytes as they are (`key.jpg`, `key.png`, ...), with `key.cls` (the label,
when known) and, from a CSV, `key.txt` (the caption). Samples are written in a seeded random order: shards
of a folder sorted by class would give batches of few classes under data=webdataset's windowed shuffle.
Class names go to `classes.txt` beside the shards. The last line printed is the data.shards setting to paste on the
command line, quoted for the shell and for Hydra: 'data.shards="/shards/imagenet/train/{00000..01281}.tar"'.

Parquet: `<out_dir>/<split>-00000-of-0000N.parquet` with the columns `image` (datasets.Image, the file's bytes),
`label` (a ClassLabel of the folder names, or integers) and, from a CSV, `caption`, in the `datasets` library's
schema; the split is `--split`, by default the source folder's name (val is read as "validation"). Write each
split into the same out_dir, and `data.path=<out_dir>` reads them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Iterator, List, Optional, Tuple

import torch

from solo.data.sources.images import ImageFolderDataset
from solo.data.sources.pairs import CsvPairs
from solo.data.sources.shards import CLASSES_FILE
from solo.errors import SoloError, require


def folder_samples(split_dir: str) -> Tuple[List[Tuple[str, int, Optional[str]]], Optional[List[str]]]:
    """(image path, label, caption None) of an ImageFolder split (`root/<split>` with class folders), and the classes."""
    root, split = os.path.split(os.path.normpath(split_dir))
    dataset = ImageFolderDataset(root, split)
    return [(path, label, None) for path, label in dataset.samples], dataset.classes


def csv_samples(file: str, root: Optional[str]) -> Tuple[List[Tuple[str, int, Optional[str]]], Optional[List[str]]]:
    """(image path, label, caption) of a captions file (the columns of data=csv), and its classes."""
    pairs = CsvPairs(file, root)
    return [(pairs.paths[i], pairs.labels[i], pairs.captions[i]) for i in range(len(pairs))], pairs.classes


def shuffled(samples: list, seed: int) -> Iterator:
    g = torch.Generator().manual_seed(seed)
    return (samples[i] for i in torch.randperm(len(samples), generator=g).tolist())


def write_shards(samples: list, classes: Optional[List[str]], out_dir: str, samples_per_shard: int, seed: int) -> str:
    """Write `samples` in a seeded random order to out_dir/00000.tar, ...; returns the brace pattern of the shards."""
    wds = require("webdataset", "writing shards", "webdataset")

    os.makedirs(out_dir, exist_ok=True)
    pattern = os.path.join(out_dir, "%05d.tar")
    with wds.ShardWriter(pattern, maxcount=samples_per_shard, verbose=0) as sink:
        for key, (path, label, caption) in enumerate(shuffled(samples, seed)):
            ext = os.path.splitext(path)[1].lower().lstrip(".")
            with open(path, "rb") as f:
                sample = {"__key__": f"{key:09d}", "jpg" if ext == "jpeg" else ext: f.read()}
            if label >= 0:
                sample["cls"] = str(label).encode()
            if caption is not None:
                sample["txt"] = caption.encode("utf-8")
            sink.write(sample)
        count = sink.shard
    if classes:
        with open(os.path.join(out_dir, CLASSES_FILE), "w") as f:
            f.writelines(f"{name}\n" for name in classes)
    last = count - 1
    return os.path.join(out_dir, f"{{00000..{last:05d}}}.tar" if last > 0 else "00000.tar")


def write_parquet(
    samples: list, classes: Optional[List[str]], out_dir: str, split: str, samples_per_file: int, seed: int
) -> str:
    """Write `samples` in a seeded random order to out_dir/<split>-00000-of-0000N.parquet; returns data.path."""
    datasets = require("datasets", "writing Parquet (--format parquet)", "huggingface")
    import pyarrow as pa
    import pyarrow.parquet as pq

    labelled = bool(samples) and all(label >= 0 for _, label, _ in samples)
    columns = {
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=classes) if classes else datasets.Value("int64"),
    }
    if any(caption is not None for _, _, caption in samples):
        columns["caption"] = datasets.Value("string")
    if not labelled:
        columns.pop("label")
    schema = datasets.Features(columns).arrow_schema  # with the features' metadata, so datasets reads back the types
    os.makedirs(out_dir, exist_ok=True)
    order, files = list(shuffled(samples, seed)), -(-len(samples) // samples_per_file)
    for k in range(files):
        rows = []
        for path, label, caption in order[k * samples_per_file : (k + 1) * samples_per_file]:
            with open(path, "rb") as f:
                row = {"image": {"bytes": f.read(), "path": os.path.basename(path)}, "label": label, "caption": caption}
            rows.append({name: row[name] for name in columns})
        pq.write_table(
            pa.Table.from_pylist(rows, schema=schema), os.path.join(out_dir, f"{split}-{k:05d}-of-{files:05d}.parquet")
        )
    return out_dir


def pasteable(key: str, value: str) -> str:
    """`key=value` as one shell word that Hydra reads back as `value`: Hydra's double quotes (a brace pattern is not a
    plain value to Hydra) inside the shell's single quotes, `'data.shards="/shards/{00000..00009}.tar"'`."""
    escaped = re.sub(r'\\+(?="|$)', lambda m: m.group(0) * 2, value).replace('"', '\\"')
    return shlex.quote(f'{key}="{escaped}"')


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solo.data.make_shards", description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["imagefolder", "csv"], help="what SOURCE is")
    parser.add_argument(
        "source", help="an ImageFolder split (root/train, with class folders) or a .csv / .jsonl captions file"
    )
    parser.add_argument("out_dir", help="where the shards go (00000.tar, 00001.tar, ...; or <split>-*.parquet)")
    parser.add_argument("--format", choices=["webdataset", "parquet"], default="webdataset")
    parser.add_argument(
        "--split", default=None, help="parquet: the split's name (default: the source folder's, else train)"
    )
    parser.add_argument(
        "--root", default=None, help="csv: the folder image paths are relative to (default: the file's)"
    )
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="of the order the samples are written in")
    args = parser.parse_args(argv)
    if args.samples_per_shard < 1:
        parser.error(f"--samples-per-shard={args.samples_per_shard}: must be >= 1")
    try:
        if args.kind == "imagefolder":
            samples, classes = folder_samples(args.source)
        else:
            samples, classes = csv_samples(args.source, args.root)
        if args.format == "parquet":
            split = args.split or (
                os.path.basename(os.path.normpath(args.source)) if args.kind == "imagefolder" else "train"
            )
            path = write_parquet(samples, classes, args.out_dir, split, args.samples_per_shard, args.seed)
            setting = pasteable("data.path", path)
        else:
            pattern = write_shards(samples, classes, args.out_dir, args.samples_per_shard, args.seed)
            setting = pasteable("data.shards", pattern)
    except SoloError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(samples)} samples to {args.out_dir}")
    print(setting)
    return 0


if __name__ == "__main__":
    sys.exit(main())
