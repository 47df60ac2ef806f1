"""Write WebDataset tar shards from an ImageFolder split or a captions CSV/JSONL (for data=webdataset).

    python -m solo.data.make_shards imagefolder /data/imagenet/train /shards/imagenet/train --samples-per-shard 1000
    python -m solo.data.make_shards csv /data/captions_train.csv /shards/captions/train --root /data/images

Each sample keeps its image file's bytes as they are (`key.jpg`, `key.png`, ...), with `key.cls` (the label,
when known) and, from a CSV, `key.txt` (the caption). Samples are written in a seeded random order: shards
of a folder sorted by class would give batches of few classes under data=webdataset's windowed shuffle.
Class names go to `classes.txt` beside the shards. The last line printed is the data.shards value to use.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, List, Optional, Tuple

import torch

from solo.data.sources.images import ImageFolderDataset
from solo.data.sources.pairs import CsvPairs
from solo.data.sources.shards import CLASSES_FILE
from solo.errors import SoloError


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
    import webdataset as wds

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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solo.data.make_shards", description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["imagefolder", "csv"], help="what SOURCE is")
    parser.add_argument("source", help="an ImageFolder split (root/train, with class folders) or a .csv / .jsonl captions file")
    parser.add_argument("out_dir", help="where the shards go (00000.tar, 00001.tar, ...)")
    parser.add_argument("--root", default=None, help="csv: the folder image paths are relative to (default: the file's)")
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
        spec = write_shards(samples, classes, args.out_dir, args.samples_per_shard, args.seed)
    except SoloError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(samples)} samples to {args.out_dir}")
    print(f"data.shards='{spec}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
