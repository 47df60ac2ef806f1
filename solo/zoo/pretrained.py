"""One way to name pretrained weights anywhere in solo: a zoo name, a solo .safetensors file, a training
checkpoint (.pt) or a pretraining run directory (its checkpoints/last.pt)."""

from __future__ import annotations

from pathlib import Path

import torch

from solo.errors import NotFound
from solo.zoo.files import entry_file
from solo.zoo.manifest import find_entry, read_manifest
from solo.zoo.weights import Pretrained, read_training_checkpoint, read_weights


def resolve(source: str | Path, *, cache: str | Path | None = None, offline: bool | None = None) -> Pretrained:
    path = Path(source)
    if path.is_dir():
        last = path / "checkpoints" / "last.pt"
        if not last.exists():
            raise NotFound(f"{path} is a directory without checkpoints/last.pt: is it a pretraining run directory?")
        path = last
    if path.suffix == ".safetensors":
        return read_weights(path)
    if path.suffix == ".pt":
        if not path.exists():
            raise NotFound(f"training checkpoint {path} does not exist")
        return read_training_checkpoint(path)
    names = [e["name"] for e in read_manifest()]
    if str(source) in names:
        entry = find_entry(str(source))
        return read_weights(entry_file(entry, cache=cache, offline=offline))
    raise NotFound(
        f"pretrained={source!r} is neither a zoo name ({', '.join(names)}) nor an existing .safetensors file, "
        ".pt training checkpoint or run directory"
    )


def export_backbone(source: str | Path, out: str | Path) -> str:
    """Write the backbone of `source` as a plain timm/torchvision state dict; returns how to load it.

    `.safetensors` for timm (`pretrained_cfg_overlay=dict(file=...)`), anything else (`.pth`) for
    torchvision's load_state_dict. Only stock architectures qualify: solo's small_stem is in neither library.
    """
    pretrained = resolve(source)
    b = pretrained.backbone
    if b["small_stem"]:
        raise ValueError(
            f"{source}: backbone {b['name']} was trained with small_stem=true (3x3 stride-1 conv1, no max-pool), "
            "which no stock timm or torchvision model has; load it with solo.zoo.load / main_linear.py, or "
            "pretrain with backbone.small_stem=false to get an exportable backbone"
        )
    out = Path(out)
    state = {k: v.contiguous() for k, v in pretrained.backbone_state().items()}
    kwargs = "".join(f", {k}={v!r}" for k, v in b["kwargs"].items())
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        out.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(out))
    else:
        torch.save(state, out)
    if b["name"].startswith("torchvision."):
        arch = b["name"].removeprefix("torchvision.")
        return (
            f"model = torchvision.models.{arch}({kwargs.lstrip(', ')}); model.fc = torch.nn.Identity(); "
            f"model.load_state_dict(torch.load({str(out)!r}))"
        )
    return (
        f"timm.create_model({b['name']!r}, pretrained=True, num_classes=0, "
        f"pretrained_cfg_overlay=dict(file={str(out)!r}, num_classes=0){kwargs})"
    )
