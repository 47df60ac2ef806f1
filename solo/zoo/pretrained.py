"""One way to name pretrained weights anywhere in solo: a zoo name, a solo .safetensors file, a training
checkpoint (a step's directory, or a .pt file of solo 0.2) or a pretraining run directory (its checkpoints/last)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from solo.distributed.checkpoint import find_checkpoints, is_checkpoint
from solo.distributed.env import rank
from solo.errors import CheckpointError, ConfigError, NotFound, require
from solo.methods import METHODS
from solo.zoo.files import entry_file
from solo.zoo.manifest import find_entry, read_manifest
from solo.zoo.weights import Pretrained, read_training_checkpoint, read_weights

log = logging.getLogger("solo")


def resolve(
    source: str | Path,
    *,
    contents: str | None = None,
    cache: str | Path | None = None,
    offline: bool | None = None,
) -> Pretrained:
    """A run directory gives its newest intact checkpoint (a warning names the damaged ones newer than it; the files
    of a finished run do not change, so every rank that resolves it reads the same); a checkpoint named on its own must
    be intact (solo.distributed.checkpoint.damage). `contents`: what to take from a training checkpoint (see
    read_training_checkpoint); a weights file holds what it holds."""
    path = Path(source)
    if is_checkpoint(path):
        return read_training_checkpoint(path, contents)
    if path.is_dir():
        found = find_checkpoints(path / "checkpoints")
        if found.intact is None:
            if found.damaged:
                raise CheckpointError(f"pretrained={source}: {found.describe_damage()}; no older checkpoint is intact")
            raise NotFound(f"{path} is a directory without checkpoints/last: is it a pretraining run directory?")
        if found.damaged and rank() == 0:
            log.warning(
                f"warning: {found.describe_damage()}; pretrained={source} reads {found.intact}, the newest intact one"
            )
        return read_training_checkpoint(found.intact, contents)
    if path.suffix == ".safetensors":
        return read_weights(path)
    if path.suffix == ".pt":
        if not path.exists():
            raise NotFound(f"training checkpoint {path} does not exist")
        return read_training_checkpoint(path, contents)
    names = [e["name"] for e in read_manifest()]
    if str(source) in names:
        entry = find_entry(str(source))
        return read_weights(entry_file(entry, cache=cache, offline=offline))
    raise NotFound(
        f"pretrained={source!r} is neither a zoo name ({', '.join(names)}) nor an existing .safetensors file, "
        "training checkpoint (step-<N> folder or .pt) or run directory"
    )


def export_open_clip(source: str | Path, out: str | Path) -> str:
    """Write the CLIP or SigLIP model of `source`, trained with open_clip's towers (method.model), as open_clip's
    state dict (`.safetensors`, else torch.save), check that open_clip loads it, and return the Python lines that
    load it and its tokenizer.

    The logit scale goes to open_clip's `logit_scale` (log space; CLIP's clamped at method.max_logit_scale, as its
    loss used it), SigLIP's bias to `logit_bias`. The call also sets the image mean and std solo trained with."""
    open_clip = require("open_clip", "exporting to open_clip", "open_clip")

    from solo.methods.towers import open_clip_config, open_clip_kwargs, quiet_open_clip, to_open_clip

    pretrained = resolve(source)
    m = pretrained.method
    if pretrained.contents != "model" or not m.get("model"):
        raise ConfigError(
            f"{source}: a {m['name']} model without open_clip towers (method.model unset), which open_clip cannot "
            "load; `python -m solo.zoo export` writes its image backbone for timm or torchvision"
        )
    name, overrides = m["model"], m.get("model_cfg") or {}
    state = {k: v.contiguous() for k, v in to_open_clip(pretrained.state, m.get("max_logit_scale")).items()}
    kwargs = open_clip_kwargs(name, overrides)
    if "logit_bias" in state and "init_logit_bias" not in open_clip_config(name, overrides):
        kwargs["init_logit_bias"] = float(
            state["logit_bias"]
        )  # SigLIP on a CLIP config: open_clip must make room for it
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(out))
    else:
        torch.save(state, out)
    try:
        with quiet_open_clip():
            open_clip.create_model(name, pretrained=str(out), **kwargs)
    except Exception as e:
        out.unlink()
        raise ValueError(
            f"{source}: open_clip cannot load the exported weights into {name} (nothing written): {e}"
        ) from e
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    context_length = open_clip_config(name, overrides)["text_cfg"].get("context_length", 77)
    return (
        f"model, _, preprocess = open_clip.create_model_and_transforms({name!r}, pretrained={str(out)!r}{args}, "
        f"image_mean={tuple(pretrained.data['mean'])}, image_std={tuple(pretrained.data['std'])})\n"
        f"tokenizer = open_clip.get_tokenizer({name!r}, context_length={context_length})"
    )


def export_backbone(source: str | Path, out: str | Path) -> str:
    """Write the backbone of `source` as a plain timm/torchvision state dict; returns how to load it.

    `.safetensors` for timm (`pretrained_cfg_overlay=dict(file=...)`), anything else (`.pth`) for
    torchvision's load_state_dict. Only stock architectures qualify: solo's small_stem is in neither library.
    """
    pretrained = resolve(source)
    b = pretrained.backbone
    if pretrained.method.get("model"):
        raise ConfigError(
            f"{source}: its image tower is open_clip's {pretrained.method['model']}, not a timm or "
            "torchvision backbone; export_open_clip writes the whole model for open_clip"
        )
    m = pretrained.method
    if METHODS[m["name"]].target.pretrained_teacher and METHODS[m["name"]].target.builds_own_backbone(m):
        raise ConfigError(
            f"{source}: a {m['name']} model's image backbone is its locked method.teacher={m['teacher']}, saved "
            "unchanged; export or load that source instead"
        )
    if b["small_stem"]:
        raise ConfigError(
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
