"""The pretrained checkpoint zoo: `solo.zoo.list()`, `solo.zoo.load(name)`.

    import solo.zoo
    solo.zoo.list()                                           # names of the published checkpoints
    backbone = solo.zoo.load("simclr-digits-resnet18half")     # an nn.Module in eval mode, sha256-verified
    transform = solo.zoo.eval_transform("simclr-digits-resnet18half")  # PIL image of any size -> its input
    backbone = solo.zoo.load("outputs/my-run")                 # a run directory, checkpoint or .safetensors too

Files live in the repository or at a URL (downloaded once into $SOLO_CACHE, default ~/.cache/solo;
SOLO_OFFLINE=1 uses the cache only). A file whose size or sha256 differs from the manifest is refused.
"""

from __future__ import annotations

import torch.nn as nn

from solo.data import DATASETS, build_eval_transform
from solo.zoo.files import ChecksumError
from solo.zoo.manifest import ManifestError, find_entry, read_manifest
from solo.zoo.pretrained import export_backbone, export_open_clip, resolve
from solo.zoo.teachers import with_teacher
from solo.zoo.weights import Pretrained, load_strict, read_training_checkpoint, read_weights

__all__ = [
    "ChecksumError",
    "ManifestError",
    "Pretrained",
    "entry",
    "eval_transform",
    "export_backbone",
    "export_open_clip",
    "list",
    "load",
    "load_strict",
    "read_training_checkpoint",
    "read_weights",
    "resolve",
    "tokenizer",
]


def list() -> list[str]:  # noqa: A001 - the zoo's public API is solo.zoo.list()
    """Names of the zoo's checkpoints, in manifest order."""
    return [e["name"] for e in read_manifest()]


def entry(name: str) -> dict:
    """The manifest entry: method, backbone, data, epochs, global batch, command, results, file."""
    return find_entry(name)


def load(source: str, *, cache: str | None = None, offline: bool | None = None) -> nn.Module:
    """The backbone (image methods) or the whole model (CLIP: both towers, `encode_image`, `encode_text`,
    `tokenizer`, `image_features`) in eval mode, from whatever main_linear.py's `pretrained=` takes: a zoo
    name, a solo .safetensors file, a training checkpoint (a step-<N> folder or .pt) or a pretraining run directory."""
    pretrained = with_teacher(resolve(source, cache=cache, offline=offline))
    module = pretrained.build_model() if pretrained.contents == "model" else pretrained.build_backbone()
    return module.eval()


def eval_transform(source: str, *, cache: str | None = None, offline: bool | None = None):
    """PIL image -> the normalised tensor `source`'s weights expect (any source `load` takes): images of any
    size are resized to the training size (shorter side, then a centre crop for any-size data sets such as
    ImageNet; the whole image for data sets stored at one size, such as the digits or CIFAR)."""
    d = resolve(source, cache=cache, offline=offline).data
    any_size = d["name"] not in DATASETS or DATASETS[d["name"]].any_size
    return build_eval_transform(d["image_size"], d["mean"], d["std"], resize=any_size, fit=not any_size)


def tokenizer(source: str, *, cache: str | None = None, offline: bool | None = None):
    """The tokenizer of an image-text model (`tokenizer(["a photo of a 7."])` -> token ids for encode_text)."""
    return load(source, cache=cache, offline=offline).tokenizer
