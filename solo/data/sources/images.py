"""Base datasets: each returns ``(PIL.Image in RGB, label: int)``.

``label == -1`` marks unlabeled data; ``.classes`` is then ``None``. Base
datasets are deterministic and never touch a global RNG; all augmentation
randomness lives in :mod:`solo.data.views.multiview`.
"""

import colorsys
import math
import os
import pickle
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from solo.data.decode import decode, read_file
from solo.data.sources.registry import DataConfig, DownloadConfig, FolderConfig, check_split, register_dataset
from solo.errors import DataError, NotFound
from solo.schema import AT_LEAST_ONE, ruled

# Computed once from the digits train split at image_size=16 (the size the digits configs use; the mean is
# size-independent, the std is 0.32-0.33 for sizes >= 16). Grey images, so all three channels are equal.
DIGITS_STATS = ((0.3054, 0.3054, 0.3054), (0.3187, 0.3187, 0.3187))
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp")


def _check_index(index: int, length: int, dataset: str) -> int:
    if not 0 <= index < length:
        raise IndexError(f"{dataset}: index {index} out of range for {length} samples")
    return index


# --------------------------------------------------------------------------- digits


class DigitsDataset:
    """scikit-learn's bundled 8x8 digits (1797 images), upscaled to ``image_size``.

    The split is fixed (stratified 80/20 with ``random_state=0``): 1437 train,
    360 val. Images are resized once here, so transforms see ready-sized images.
    """

    classes = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

    def __init__(self, split: str, image_size: int):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        check_split(split, "digits")
        digits = load_digits()
        all_idx = np.arange(len(digits.target))
        train_idx, val_idx = train_test_split(all_idx, test_size=0.2, stratify=digits.target, random_state=0)
        idx = np.sort(train_idx if split == "train" else val_idx)
        # Values are 0..16; scale to the full uint8 range.
        pixels = np.round(digits.images[idx] * (255.0 / 16.0)).astype(np.uint8)
        self.images = np.stack([_resize_grey(p, image_size) for p in pixels])  # (N, S, S, 3)
        self.targets = [int(t) for t in digits.target[idx]]
        self.source_indices = idx  # position in load_digits(), e.g. to check splits are disjoint

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        index = _check_index(index, len(self), "digits")
        return Image.fromarray(self.images[index], mode="RGB"), self.targets[index]


def _resize_grey(pixels: np.ndarray, image_size: int) -> np.ndarray:
    img = Image.fromarray(pixels, mode="L").resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(img.convert("RGB"))


# ------------------------------------------------------------------------ synthetic


class SyntheticDataset:
    """Deterministic noise images for smoke tests and benchmarks, generated on the fly.

    Image ``i`` depends only on ``(seed, split, i)``. Each class has its own
    mean colour and stripe orientation, so a linear probe can learn something
    (and stripes survive colour jitter / grayscale augmentations).
    """

    def __init__(
        self,
        num_samples: int,
        image_size: int,
        num_classes: int = 10,
        seed: int = 0,
        split: str = "train",
    ):
        if num_samples < 1 or image_size < 1 or num_classes < 1:
            raise DataError(
                "SyntheticDataset needs positive sizes, got "
                f"num_samples={num_samples}, image_size={image_size}, num_classes={num_classes}"
            )
        check_split(split, "synthetic")
        self.num_samples = num_samples
        self.image_size = image_size
        self.seed = seed
        self._split_id = ("train", "val").index(split)  # train and val images differ for the same seed
        self.classes = [f"class_{c}" for c in range(num_classes)]
        hues = [colorsys.hsv_to_rgb(c / num_classes, 0.7, 0.8) for c in range(num_classes)]
        self._colours = torch.tensor(hues) * 255.0  # each class's mean colour, (num_classes, 3)
        self._stripes: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        index = _check_index(index, len(self), "synthetic")
        num_classes = len(self.classes)
        label = index % num_classes
        # A private generator: the global numpy/torch RNGs are never touched. torch's, not numpy's: its normal
        # noise is faster, and the images are a benchmark's data (docs/performance.md).
        seed = np.random.SeedSequence([self.seed, self._split_id, index]).generate_state(1, dtype=np.uint64)[0]
        rng = torch.Generator().manual_seed(int(seed))
        phase = float(torch.rand((), generator=rng, dtype=torch.float64)) * 2 * math.pi
        pixels = torch.randn(self.image_size, self.image_size, 3, generator=rng).mul_(30.0)
        pixels += self._colours[label]
        pixels += torch.sin(self._waves(label) + phase).mul_(40.0)[..., None]
        return Image.fromarray(pixels.clamp_(0, 255).to(torch.uint8).numpy(), mode="RGB"), label

    def _waves(self, label: int) -> torch.Tensor:
        """Class `label`'s stripes before their phase: 3 across the image, at the class's own angle."""
        if label not in self._stripes:
            angle = math.pi * label / len(self.classes)
            y, x = torch.meshgrid(*[torch.arange(self.image_size, dtype=torch.float64)] * 2, indexing="ij")
            along = (math.cos(angle) * x + math.sin(angle) * y) * (2 * math.pi * 3 / self.image_size)
            self._stripes[label] = along.float()
        return self._stripes[label]


# ---------------------------------------------------------------------------- CIFAR


class _CIFARBase:
    """Reads the standard python-pickle CIFAR layout under ``root``.

    We read the pickles ourselves rather than through torchvision because
    torchvision checks md5 sums, which a small local stand-in cannot pass;
    torchvision is used only to download (when ``download=True``).
    """

    name = ""
    folder = ""
    train_files: List[str] = []
    val_files: List[str] = []
    meta_file = ""
    label_key = ""
    names_key = ""

    def __init__(self, root: str, split: str, download: bool = False):
        check_split(split, self.name)
        self.root = root
        base = os.path.join(root, self.folder)
        files = self.train_files + self.val_files + [self.meta_file]
        missing = [os.path.join(base, f) for f in files if not os.path.isfile(os.path.join(base, f))]
        if missing and download:
            self._download(root)
            missing = [p for p in missing if not os.path.isfile(p)]
        if missing:
            raise NotFound(
                f"{self.name}: expected the python-pickle layout at {base}, missing {missing}. "
                "Set data.download=true to download it, or point data.root at the folder "
                f"that contains {self.folder}/."
            )

        images, labels = [], []
        for fname in self.train_files if split == "train" else self.val_files:
            path = os.path.join(base, fname)
            entry = _load_pickle(path)
            data = np.asarray(_get(entry, "data", path), dtype=np.uint8)
            if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                raise DataError(f"{path}: 'data' should have shape (N, 3072), got {data.shape}")
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))  # to (N, H, W, C)
            labels.extend(int(t) for t in _get(entry, self.label_key, path))
        self.images = np.ascontiguousarray(np.concatenate(images))
        self.targets = labels
        meta_path = os.path.join(base, self.meta_file)
        self.classes = [_to_str(n) for n in _get(_load_pickle(meta_path), self.names_key, meta_path)]

    def _download(self, root: str) -> None:
        import torchvision

        tv_cls = getattr(torchvision.datasets, type(self).__name__.replace("Dataset", ""))
        try:
            tv_cls(root, train=True, download=True)
        except Exception as e:  # most often: no network on this machine
            raise RuntimeError(
                f"{self.name}: download into {root} failed ({e}). Download and extract the "
                f"python version manually so that {os.path.join(root, self.folder)} exists."
            ) from e

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        index = _check_index(index, len(self), self.name)
        return Image.fromarray(self.images[index], mode="RGB"), self.targets[index]


class CIFAR10Dataset(_CIFARBase):
    """CIFAR-10 from ``root/cifar-10-batches-py``; split "val" is the official test batch."""

    name = "cifar10"
    folder = "cifar-10-batches-py"
    train_files = [f"data_batch_{i}" for i in range(1, 6)]
    val_files = ["test_batch"]
    meta_file = "batches.meta"
    label_key = "labels"
    names_key = "label_names"


class CIFAR100Dataset(_CIFARBase):
    """CIFAR-100 (fine labels) from ``root/cifar-100-python``; split "val" is the test set."""

    name = "cifar100"
    folder = "cifar-100-python"
    train_files = ["train"]
    val_files = ["test"]
    meta_file = "meta"
    label_key = "fine_labels"
    names_key = "fine_label_names"


def _load_pickle(path: str) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")  # the originals were pickled by Python 2


def _get(entry: dict, key: str, path: str):
    # Python-2 pickles have bytes keys; files re-pickled by Python 3 may have str keys.
    for k in (key.encode(), key):
        if k in entry:
            return entry[k]
    raise KeyError(f"{path}: no {key!r} entry (found keys {sorted(map(_to_str, entry))})")


def _to_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------- image folder


class ImageFolderDataset:
    """Images under ``root/<split>/``, ImageNet style.

    Labeled: ``root/<split>/<class>/**/*.jpg``; classes are the sorted folder
    names (or ``classes`` if given, e.g. the train classes for the val split,
    so labels agree even when val lacks some classes). Unlabeled: images
    directly in ``root/<split>/`` with no class folders; label -1, classes None.
    Files are listed once, sorted, and decoded lazily in ``__getitem__``.
    """

    def __init__(self, root: str, split: str, classes: Optional[List[str]] = None):
        check_split(split, "imagefolder")
        self.split_dir = os.path.join(root, split)
        if not os.path.isdir(self.split_dir):
            raise NotFound(
                f"imagefolder: no folder {self.split_dir}; expected {root}/{split}/<class>/<image> "
                f"or unlabeled images directly in {root}/{split}/. Check data.root."
            )
        class_dirs = _list_class_dirs(self.split_dir)
        loose = sorted(f for f in os.listdir(self.split_dir) if _is_image(f))
        if class_dirs and loose:
            raise DataError(
                f"imagefolder: {self.split_dir} has both class folders and loose images "
                f"(e.g. {loose[0]}); use one layout: all images in class folders, or none"
            )

        self.samples: List[Tuple[str, int]] = []
        if class_dirs:
            self.classes = list(classes) if classes is not None else class_dirs
            class_to_idx = {c: i for i, c in enumerate(self.classes)}
            unknown = [c for c in class_dirs if c not in class_to_idx]
            if unknown:
                raise DataError(
                    f"imagefolder: class folders {unknown} in {self.split_dir} are not among "
                    f"the {len(self.classes)} known classes (e.g. those of the train split)"
                )
            for c in class_dirs:
                for path in _walk_images(os.path.join(self.split_dir, c)):
                    self.samples.append((path, class_to_idx[c]))
        else:
            self.classes = None
            self.samples = [(os.path.join(self.split_dir, f), -1) for f in loose]
        if not self.samples:
            raise NotFound(f"imagefolder: no images ({', '.join(IMG_EXTENSIONS)}) found under {self.split_dir}")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        path, label = self.samples[_check_index(index, len(self), "imagefolder")]
        return decode(path, f"image {path}"), label

    def label(self, index: int) -> int:
        return self.samples[_check_index(index, len(self), "imagefolder")][1]

    def image_bytes(self, index: int) -> Tuple[bytes, str]:
        """The file's bytes, not decoded (data.augment_on=device decodes JPEGs there), and what to call it."""
        path = self.samples[_check_index(index, len(self), "imagefolder")][0]
        return read_file(path), f"image {path}"


def _is_image(filename: str) -> bool:
    return filename.lower().endswith(IMG_EXTENSIONS)


def _list_class_dirs(folder: str) -> List[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _walk_images(folder: str) -> List[str]:
    paths = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames.sort()  # os.walk order is filesystem-dependent; sort for determinism
        paths.extend(os.path.join(dirpath, f) for f in sorted(filenames) if _is_image(f))
    return paths


# ---------------------------------------------------------------------------- build
# (digits is registered with its image-text pairs, in solo.data.sources.pairs)


@dataclass
class SyntheticConfig(DataConfig):
    num_samples: int = ruled(1000, AT_LEAST_ONE)  # per split
    num_classes: int = ruled(10, AT_LEAST_ONE)


@register_dataset("synthetic", schema=SyntheticConfig, stats=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))
def _synthetic(d, split: str, seed: int, pairs: bool):
    """`num_samples` images of `num_classes` classes for *each* split (train and val images differ)."""
    return SyntheticDataset(d.num_samples, d.image_size, num_classes=d.num_classes, seed=seed, split=split)


@register_dataset("cifar10", schema=DownloadConfig, stats=((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)))
def _cifar10(d, split: str, seed: int, pairs: bool):
    return CIFAR10Dataset(d.root, split, download=d.download)


@register_dataset("cifar100", schema=DownloadConfig, stats=((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)))
def _cifar100(d, split: str, seed: int, pairs: bool):
    return CIFAR100Dataset(d.root, split, download=d.download)


@register_dataset("imagefolder", schema=FolderConfig, any_size=True)
def _imagefolder(d, split: str, seed: int, pairs: bool):
    """`root/train` and `root/val`; no `root/val`: None (validation and the online probe are skipped)."""
    if split == "train":
        return ImageFolderDataset(d.root, split)
    if not os.path.isdir(os.path.join(d.root, "val")):
        return None
    train_dir = os.path.join(d.root, "train")
    # Reuse the train class list so label i means the same class in both splits.
    train_classes = _list_class_dirs(train_dir) if os.path.isdir(train_dir) else []
    return ImageFolderDataset(d.root, split, classes=train_classes or None)
