"""Weights files and how a model is rebuilt from them, strictly.

A solo weights file is a safetensors file (tensors only, no pickle) whose metadata holds, under
"solo", the JSON description needed to rebuild the module: what it contains ("backbone", or "model"
for the whole method, e.g. CLIP's two towers), the backbone and method configs, and the data
preprocessing (dataset, image size, mean, std).

Training checkpoints (checkpoints/step-<N>) hold the whole PretrainModel: the encoder is under the
explicit key prefix `method.backbone.` (BACKBONE_PREFIX), the method's heads under `method.`, the
online probe under `probe.`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file

from solo.backbones import build_backbone
from solo.data import dataset_stats
from solo.distributed.checkpoint import read_checkpoint
from solo.methods import METHODS, create_method

METHOD_PREFIX = "method."
BACKBONE_PREFIX = "method.backbone."
CONTENTS = ("backbone", "model")


@dataclass
class Pretrained:
    """Weights and the description needed to rebuild their module."""

    state: dict[str, torch.Tensor]
    contents: str  # "backbone" | "model"
    backbone: dict  # the backbone config (solo.backbones)
    method: dict  # MethodConfig fields (name + hyper-parameters)
    data: dict  # name, image_size, mean, std: the preprocessing the weights expect
    source: str  # where they came from, for error messages
    # The frozen pretrained module a method is built around (LiT's locked tower), loaded from its own source by
    # solo.zoo.teachers.with_teacher: the saved weights then replace its own
    teacher: nn.Module | None = None

    def describe(self) -> dict:
        return {"contents": self.contents, "backbone": self.backbone, "method": self.method, "data": self.data}

    def backbone_state(self) -> dict[str, torch.Tensor]:
        if self.contents == "backbone":
            return dict(self.state)
        return {k.removeprefix("backbone."): v for k, v in self.state.items() if k.startswith("backbone.")}

    def build_backbone(self, random_init: bool = False) -> nn.Module:
        """The backbone, weights loaded strictly (or left at their initialisation with random_init=True)."""
        if self.contents == "model" and METHODS[self.method["name"]].target.builds_own_backbone(self.method):
            backbone = self._new_model().backbone  # the method's own image tower (open_clip's)
        else:
            backbone, _ = build_backbone({**self.backbone, "pretrained": False})
        if not random_init:
            load_strict(backbone, self.backbone_state(), f"the backbone in {self.source}")
        return backbone

    def build_model(self) -> nn.Module:
        """The whole method module (only for contents == "model")."""
        if self.contents != "model":
            raise ValueError(f"{self.source} holds only a backbone ({self.method['name']}); use build_backbone()")
        model = self._new_model()
        load_strict(model, self.state, f"the {self.method['name']} model in {self.source}")
        return model

    def _new_model(self) -> nn.Module:
        # The weights come from this file: initial weights the method was trained from (method.pretrained) are not read.
        return create_method(
            {**self.method, "pretrained": None} if "pretrained" in self.method else self.method,
            self.backbone,
            self.teacher,
        )


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """load_state_dict(strict=True), with an error that lists every missing, unexpected or mis-shaped key."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        problems = []
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
            if keys:
                shown = ", ".join(keys[:12]) + (f", ... ({len(keys) - 12} more)" if len(keys) > 12 else "")
                problems.append(f"{len(keys)} {title} key(s): {shown}")
        raise KeyError(
            f"cannot load {what} into {type(module).__name__}: "
            + "; ".join(problems)
            + ". The weights were saved for another architecture or config (backbone name, small_stem, kwargs)"
        )
    module.load_state_dict(state, strict=True)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_weights(pretrained: Pretrained, path: str | Path) -> Path:
    """Write `pretrained` as a solo safetensors file (contiguous tensor copies, description in the metadata)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in pretrained.state.items()}
    save_file(tensors, str(path), metadata={"solo": json.dumps(pretrained.describe(), sort_keys=True)})
    return path


def read_weights(path: str | Path) -> Pretrained:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from e
    if "solo" not in meta:
        raise ValueError(
            f"{path} has no solo metadata: it is a plain state dict (e.g. an export for timm/torchvision), "
            "not a solo weights file; pass a zoo name, a solo .safetensors file or a training checkpoint"
        )
    info = json.loads(meta["solo"])
    if info.get("contents") not in CONTENTS:
        raise ValueError(f"{path}: metadata 'contents' must be one of {CONTENTS}, got {info.get('contents')!r}")
    return Pretrained(state, info["contents"], info["backbone"], info["method"], info["data"], str(path))


def read_training_checkpoint(path: str | Path, contents: str | None = None) -> Pretrained:
    """The backbone (contents="backbone") or the whole method ("model") of a solo training checkpoint (a step's
    directory, `last`, or a .pt file of solo 0.2), by explicit keys. By default "model" for image-text methods (zero-shot needs the text tower), else "backbone"."""
    path = Path(path)
    if contents not in (None, *CONTENTS):
        raise ValueError(f"contents must be one of {CONTENTS}, got {contents!r}")
    ckpt = read_checkpoint(path)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(
            f"{path} is not a solo training checkpoint (expected the keys 'model' and 'config', found {found})"
        )
    cfg = ckpt["config"]
    if contents is None:
        name = cfg["method"]["name"]
        contents = "model" if name in METHODS and METHODS[name].target.inputs == "image_text" else "backbone"
    prefix = BACKBONE_PREFIX if contents == "backbone" else METHOD_PREFIX
    state = {k.removeprefix(prefix): v for k, v in ckpt["model"].items() if k.startswith(prefix)}
    if not state:
        raise KeyError(f"{path} has no keys under '{prefix}'; its model keys start with: {sorted(ckpt['model'])[:5]}")
    d = cfg["data"]
    mean, std = dataset_stats(d["name"])
    data = {"name": d["name"], "image_size": d["image_size"], "mean": list(mean), "std": list(std)}
    return Pretrained(state, contents, dict(cfg["backbone"]), dict(cfg["method"]), data, str(path))
