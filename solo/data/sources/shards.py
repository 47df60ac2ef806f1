"""WebDataset tar shards as a random-access dataset, so the global-batch sampler keeps working on them.

A shard is a tar file whose members are grouped into samples by key, as img2dataset and webdataset write
them: `000123.jpg`, `000123.txt`, `000123.cls`, `000123.json`. solo scans each shard's tar headers once
and caches where every member's bytes lie (`data.cache_dir`); a sample is then two `pread`s away, from
any worker of any rank, so each global batch holds the same samples whatever the world size and the
number of workers. Shards given by URL (anything `webdataset.gopen` opens: http(s), gs://, pipe:...) are
copied to the cache once, then read the same way.

The epoch order shuffles the shards, then the samples within each window of `shuffle_window` consecutive
shards of that order: a global batch draws from one or two windows, so reads stay within a few files.
Damage is found without crashing: a shard whose tar breaks off keeps the samples before the break (the
index says where), and a sample without an image, or whose image does not decode, raises ImageReadError,
which `data.on_bad_image=skip` replaces by the next readable sample (solo.data.decode.read_or_skip).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from omegaconf import MISSING
from PIL import Image

from solo.data.decode import ImageReadError, decode
from solo.data.sources.images import IMG_EXTENSIONS
from solo.data.sources.pairs import ImageTextPairs
from solo.data.sources.registry import DataConfig, register_dataset
from solo.errors import ConfigError, DataError, NotFound, require
from solo.schema import AT_LEAST_ONE, ruled

INDEX_VERSION = 1
IMAGE_EXTENSIONS = tuple(e.lstrip(".") for e in IMG_EXTENSIONS)
CLASSES_FILE = "classes.txt"  # one class name per line, beside the shards: label i is line i


def expand_shards(spec: str) -> List[str]:
    """The shard list of a brace pattern ('/data/{00000..00331}.tar'); several patterns joined by '::'."""
    import braceexpand

    shards = [s for part in str(spec).split("::") for s in braceexpand.braceexpand(part.strip())]
    if not shards:
        raise ConfigError(f"data.shards={spec!r} names no shard")
    return shards


def default_cache_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "solo", "shards")


def _is_local(shard: str) -> bool:
    return shard.startswith("file://") or ("://" not in shard and not shard.startswith("pipe:"))


def _local_path(shard: str, cache_dir: str) -> str:
    """The shard on this machine: its own path, or its copy in the cache (fetched once with webdataset.gopen)."""
    if _is_local(shard):
        path = shard[len("file://") :] if shard.startswith("file://") else shard
        if not os.path.isfile(path):
            raise NotFound(f"shard {path} does not exist; check data.shards")
        return path
    path = os.path.join(cache_dir, hashlib.sha1(shard.encode()).hexdigest() + ".tar")
    if not os.path.isfile(path):
        gopen = require("webdataset.gopen", "data.shards given by URL", "webdataset").gopen

        try:
            with gopen(shard, "rb") as stream:
                _write_atomic(path, stream.read())
        except Exception as e:
            raise NotFound(f"cannot fetch shard {shard}: {type(e).__name__}: {e}") from e
    return path


def _write_atomic(path: str, data: bytes) -> None:
    # Ranks and nodes may build the same cache entry at once: each writes a private file and renames it.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def split_name(member: str) -> Tuple[str, str]:
    """webdataset's convention: the key is the path up to the first dot of the file name, the rest its extension."""
    folder, base = os.path.split(member)
    stem, _, ext = base.partition(".")
    return os.path.join(folder, stem), ext.lower()


def scan_shard(path: str) -> dict:
    """Where each sample's members lie in tar `path`, and its label:
    {"samples": [[key, {ext: [offset, size]}, label], ...], "error": ...}; label is the integer in the `.cls`
    member, -1 without one. Reading stops at a damaged header; the samples before it are kept and `error`
    says where it broke."""
    samples: List[list] = []
    error = None
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, ext = split_name(member.name)
                if not samples or samples[-1][0] != key:
                    samples.append([key, {}, -1])
                samples[-1][1][ext] = [member.offset_data, member.size]
                if ext == "cls":
                    samples[-1][2] = _parse_label(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, EOFError) as e:
        error = f"the tar breaks off after {len(samples)} samples ({type(e).__name__}: {e})"
    size = os.path.getsize(path)
    if error is None and samples:  # a member cut short by truncation lies past the end of the file
        key, members, _ = samples[-1]
        if any(offset + length > size for offset, length in members.values()):
            samples.pop()
            error = f"the tar is truncated in sample {key!r}"
    return {"samples": samples, "error": error}


def _parse_label(raw: bytes) -> int:
    try:
        return int(raw.decode().strip())
    except ValueError:
        return -1  # an unreadable label leaves the sample unlabeled rather than stopping the run


def shard_index(path: str, cache_dir: str) -> dict:
    """scan_shard(path), cached under `cache_dir` by (path, size, mtime): built once, then read."""
    stat = os.stat(path)
    ident = f"{INDEX_VERSION}:{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    cached = os.path.join(cache_dir, hashlib.sha1(ident.encode()).hexdigest() + ".json")
    if os.path.isfile(cached):
        with open(cached) as f:
            return json.load(f)
    index = scan_shard(path)
    _write_atomic(cached, json.dumps(index).encode())
    return index


def _read_classes(shards: List[str]) -> Optional[List[str]]:
    folder = os.path.dirname(shards[0]) if _is_local(shards[0]) else None
    path = os.path.join(folder, CLASSES_FILE) if folder is not None else None
    if path is None or not os.path.isfile(path):
        return None
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


class ShardDataset:
    """Samples of WebDataset shards by global index (shard order, then tar order), read on demand.

    `label(i)` is the integer in the sample's `.cls` member (-1 without one); `classes` come from a
    `classes.txt` beside local shards (written by solo.data.make_shards), else are the label numbers.
    """

    def __init__(self, spec: str, cache_dir: Optional[str] = None, shuffle_window: int = 4):
        if shuffle_window < 1:
            raise ConfigError(f"data.shuffle_window={shuffle_window}: must be >= 1 (shards whose samples are mixed)")
        self.shards = expand_shards(spec)
        self.shuffle_window = shuffle_window
        cache_dir = cache_dir or default_cache_dir()
        self.paths = [_local_path(s, cache_dir) for s in self.shards]
        self.samples: List[Tuple[int, str, Dict[str, list]]] = []  # (shard id, key, {ext: [offset, size]})
        self.labels: List[int] = []
        self.shard_starts = [0]
        self.problems: List[str] = []  # damaged shards, reported at the start of training
        for shard_id, path in enumerate(self.paths):
            index = shard_index(path, cache_dir)
            if index["error"]:
                self.problems.append(f"{self.shards[shard_id]}: {index['error']}")
            self.samples += [(shard_id, key, members) for key, members, _ in index["samples"]]
            self.labels += [label for _, _, label in index["samples"]]
            self.shard_starts.append(len(self.samples))
        if not self.samples:
            raise DataError(f"data.shards={spec!r}: the {len(self.shards)} shards hold no samples")
        names = _read_classes(self.shards)
        if names is None and max(self.labels) >= 0:
            names = [str(c) for c in range(max(self.labels) + 1)]
        self.classes = names
        self._files: Dict[int, int] = {}  # shard id -> file descriptor of this process (pread needs no seek)

    def __len__(self) -> int:
        return len(self.samples)

    def _read(self, shard_id: int, offset: int, size: int) -> bytes:
        fd = self._files.get(shard_id)
        if fd is None:
            fd = self._files[shard_id] = os.open(self.paths[shard_id], os.O_RDONLY)
        return os.pread(fd, size, offset)

    def member(self, index: int, ext: str) -> Optional[bytes]:
        shard_id, _, members = self.samples[index]
        where = members.get(ext)
        return None if where is None else self._read(shard_id, *where)

    def describe(self, index: int) -> str:
        shard_id, key, _ = self.samples[index]
        return f"sample {key!r} of shard {self.shards[shard_id]}"

    def image_bytes(self, index: int) -> Tuple[bytes, str]:
        """The image member's bytes, not decoded (data.augment_on=device decodes JPEGs there), and what to call it."""
        _, _, members = self.samples[index]
        ext = next((e for e in IMAGE_EXTENSIONS if e in members), None)
        if ext is None:
            raise ImageReadError(f"{self.describe(index)} has no image (members: {sorted(members)})")
        return self.member(index, ext), self.describe(index)

    def image(self, index: int) -> Image.Image:
        return decode(*self.image_bytes(index))

    def label(self, index: int) -> int:
        return self.labels[index]

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        return self.image(index), self.label(index)

    def epoch_order(self, seed: int, epoch: int) -> List[int]:
        """The global sample order of `epoch`: shards shuffled, then samples within windows of shuffle_window shards."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        shard_order = torch.randperm(len(self.shards), generator=g).tolist()
        order: List[int] = []
        for w in range(0, len(shard_order), self.shuffle_window):
            window = [
                i
                for s in shard_order[w : w + self.shuffle_window]
                for i in range(self.shard_starts[s], self.shard_starts[s + 1])
            ]
            order += [window[j] for j in torch.randperm(len(window), generator=g).tolist()]
        return order

    def __getstate__(self) -> dict:
        # DataLoader workers started by spawn get no descriptors; each opens its own.
        return {**self.__dict__, "_files": {}}

    def __del__(self):
        for fd in getattr(self, "_files", {}).values():
            os.close(fd)


class ShardPairs(ShardDataset, ImageTextPairs):
    """Image-text pairs of WebDataset shards: the image and the caption in its `.txt` member."""

    def image_bytes(self, index: int) -> Tuple[bytes, str]:
        if "txt" not in self.samples[index][2]:  # a pair without its caption is as unusable as a broken image
            raise ImageReadError(f"{self.describe(index)} has no caption (.txt)")
        return super().image_bytes(index)

    def caption_options(self, index: int) -> List[str]:
        raw = self.member(index, "txt")
        return [raw.decode("utf-8", errors="replace").strip() if raw is not None else ""]


@dataclass
class ShardsConfig(DataConfig):
    shards: str = (
        MISSING  # required: the train shards, a brace pattern ('/data/{00000..00331}.tar'); several joined by '::'
    )
    val_shards: Optional[str] = None  # the val shards; None: no validation
    shuffle_window: int = ruled(4, AT_LEAST_ONE)  # shards whose samples are shuffled together
    cache_dir: Optional[str] = None  # shard indexes and fetched shards; None: ~/.cache/solo/shards


@register_dataset("webdataset", schema=ShardsConfig, any_size=True, pairs=True, writes_cache=True)
def _webdataset(d, split: str, seed: int, pairs: bool) -> Optional[ShardDataset]:
    """`data.shards` for train, `data.val_shards` for val (None: no validation); image-text pairs when the method
    reads them (`.txt` captions), else images with the `.cls` labels."""
    spec = d.shards if split == "train" else d.val_shards
    if not spec:
        return None
    return (ShardPairs if pairs else ShardDataset)(spec, d.cache_dir, d.shuffle_window)
