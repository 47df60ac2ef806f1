"""The pretrained checkpoint zoo: `solo.zoo.list()`, `solo.zoo.load(name)`.

    import solo.zoo
    solo.zoo.list()                                   # names of the published checkpoints
    backbone = solo.zoo.load("simclr-digits-resnet18")  # an nn.Module in eval mode, sha256-verified
    transform = solo.zoo.eval_transform("simclr-digits-resnet18")  # the preprocessing it expects

Files live in the repository or at a URL (downloaded once into $SOLO_CACHE, default ~/.cache/solo;
SOLO_OFFLINE=1 uses the cache only). A file whose size or sha256 differs from the manifest is refused.
"""

from __future__ import annotations

import torch.nn as nn

from solo.data import DATASETS, build_eval_transform
from solo.zoo.files import ChecksumError, entry_file
from solo.zoo.manifest import ManifestError, find_entry, read_manifest
from solo.zoo.pretrained import export_backbone, resolve
from solo.zoo.weights import Pretrained, load_strict, read_training_checkpoint, read_weights

__all__ = [
    "ChecksumError",
    "ManifestError",
    "Pretrained",
    "entry",
    "eval_transform",
    "export_backbone",
    "list",
    "load",
    "load_strict",
    "read_training_checkpoint",
    "read_weights",
    "resolve",
]


def list() -> list[str]:  # noqa: A001 - the zoo's public API is solo.zoo.list()
    """Names of the zoo's checkpoints, in manifest order."""
    return [e["name"] for e in read_manifest()]


def entry(name: str) -> dict:
    """The manifest entry: method, backbone, data, epochs, global batch, command, results, file."""
    return find_entry(name)


def load(name: str, *, cache: str | None = None, offline: bool | None = None) -> nn.Module:
    """The backbone (image methods) or the whole model (CLIP: both towers) of a zoo entry, in eval mode."""
    pretrained = read_weights(entry_file(find_entry(name), cache=cache, offline=offline))
    module = pretrained.build_model() if pretrained.contents == "model" else pretrained.build_backbone()
    return module.eval()


def eval_transform(name: str):
    """The deterministic preprocessing the entry's weights were evaluated with (PIL image -> normalised tensor)."""
    d = find_entry(name)["data"]
    return build_eval_transform(d["image_size"], d["mean"], d["std"], resize=d["name"] in DATASETS and DATASETS[d["name"]].any_size)
