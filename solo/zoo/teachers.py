"""The frozen teacher of method=distill, from whatever method.teacher names:

- a solo zoo name, pretraining run directory, training checkpoint or weights file: its backbone, read as
  main_linear.py's `pretrained=` reads it (solo.zoo.pretrained.resolve), pooled as its method's probe read it;
- a timm model name: timm's model without its classifier, with the weights of the file method.teacher_weights
  (timm's `pretrained_cfg_overlay=dict(file=...)`), else timm's own pretrained weights (its cache, or a download);
- `open_clip:<model>`: open_clip's image tower, with the weights of method.teacher_weights (a state dict file, or one
  of open_clip's pretrained tags for the model).

Built here, above solo.methods (which may not read the zoo), by the trainer, and passed to the method's constructor.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from solo.backbones import feature_width
from solo.backbones.vit import is_vit, pool_patch_tokens, take_empty_batches
from solo.data import dataset_stats
from solo.errors import ConfigError, SoloError, require
from solo.methods import METHODS
from solo.methods.distill import FrozenTeacher
from solo.methods.towers import open_clip_kwargs, quiet_open_clip
from solo.zoo.manifest import read_manifest
from solo.zoo.pretrained import resolve
from solo.zoo.weights import Pretrained

OPEN_CLIP = "open_clip:"


def load_teacher(method, data) -> FrozenTeacher:
    """The teacher of `method` (the `method` group: teacher, teacher_weights, teacher_kwargs), for views of `data`
    (the `data` group: its statistics and image size). Building a model draws its initial weights before they are
    replaced: that happens on a forked generator, so the student's initialisation is the same whatever the teacher."""
    source, weights = str(method.teacher), method.teacher_weights
    kwargs = method.teacher_kwargs
    kwargs = OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else dict(kwargs)
    with torch.random.fork_rng(devices=[]):
        if source.startswith(OPEN_CLIP):
            encoder, stats = _open_clip(source.removeprefix(OPEN_CLIP), weights, kwargs)
        elif Path(source).exists() or source in [e["name"] for e in read_manifest()]:
            if weights is not None or kwargs:
                key, value = ("teacher_weights", weights) if weights is not None else ("teacher_kwargs", kwargs)
                raise ConfigError(
                    f"method.{key}={value}: method.teacher={source} is solo's, with its own weights and architecture; "
                    f"unset method.{key} (it is for timm and open_clip teachers)"
                )
            encoder, stats = _solo(source)
        else:
            encoder, stats = _timm(source, weights, kwargs)
    try:
        width = feature_width(encoder, data.image_size)
    except Exception as e:  # the model's own error: a ViT built for another image size, too small an image
        raise ConfigError(
            f"method.teacher={source} cannot encode the views of data.image_size={data.image_size} px "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); a timm ViT takes other sizes with "
            "+method.teacher_kwargs.dynamic_img_size=true (or img_size=<the data's>)"
        ) from None
    return FrozenTeacher(encoder, width, source, dataset_stats(data.name), stats)


def with_teacher(pretrained: Pretrained) -> Pretrained:
    """`pretrained` with the frozen module its method is built around (LiT's locked tower) loaded from the source its
    config names, for building its model (its saved weights replace that module's); as it is for other methods."""
    method = pretrained.method
    builds = pretrained.contents == "model" or METHODS[method["name"]].target.builds_own_backbone(method)
    if not (builds and METHODS[method["name"]].target.pretrained_teacher):
        return pretrained
    return dataclasses.replace(
        pretrained, teacher=load_teacher(OmegaConf.create(method), OmegaConf.create(pretrained.data))
    )


def _solo(source: str) -> tuple[nn.Module, tuple]:
    try:
        pretrained = with_teacher(resolve(source))
    except (SoloError, ValueError, KeyError) as e:
        raise ConfigError(f"method.teacher={source}: {e}") from None
    encoder = pretrained.build_backbone()
    name = pretrained.method["name"]
    if name in METHODS and METHODS[name].target.pool == "mean":  # the features its probe read (MAE's, I-JEPA's)
        pool_patch_tokens(encoder)
    return encoder, (pretrained.data["mean"], pretrained.data["std"])


def _timm(name: str, weights: str | None, kwargs: dict) -> tuple[nn.Module, tuple]:
    import timm  # here: timm's import slows every process's start

    if not timm.is_model(name):
        zoo = ", ".join(e["name"] for e in read_manifest())
        raise ConfigError(
            f"method.teacher={name} is neither a solo zoo name ({zoo}), an existing run directory, checkpoint or "
            "weights file, a timm model name (timm.list_models()), nor open_clip:<model>"
        )
    if weights is not None and not Path(weights).is_file():
        raise ConfigError(f"method.teacher_weights={weights}: no such file (the weights of timm's {name})")
    overlay = {"pretrained_cfg_overlay": {"file": str(weights)}} if weights is not None else {}
    try:
        encoder = timm.create_model(name, pretrained=True, num_classes=0, **overlay, **kwargs)
    except Exception as e:  # timm's and the hub's errors: no network, no cache, a file for another model
        where = f"from method.teacher_weights={weights}" if weights is not None else "from timm's cache or the network"
        raise ConfigError(
            f"method.teacher={name}: timm cannot load its weights {where} ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); give a weights file for this model "
            "with method.teacher_weights=<file>"
        ) from None
    if is_vit(encoder):
        take_empty_batches(encoder)
    return encoder, (encoder.pretrained_cfg["mean"], encoder.pretrained_cfg["std"])


def _open_clip(name: str, weights: str | None, kwargs: dict) -> tuple[nn.Module, tuple]:
    open_clip = require("open_clip", f"method.teacher={OPEN_CLIP}{name}", "open_clip")

    if open_clip.get_model_config(name) is None:
        raise ConfigError(
            f"method.teacher={OPEN_CLIP}{name}: {name} is not an open_clip model (open_clip.list_models() lists them)"
        )
    tags = open_clip.list_pretrained_tags_by_model(name)
    if weights is None or not (Path(weights).is_file() or weights in tags):
        raise ConfigError(
            f"method.teacher_weights={weights}: the teacher {OPEN_CLIP}{name} needs its weights, a state dict file "
            f"(as open_clip.create_model({name!r}, pretrained=file) loads it)"
            + (f" or one of open_clip's tags for it ({', '.join(tags[:5])})" if tags else "")
        )
    try:
        with quiet_open_clip():
            model = open_clip.create_model(name, pretrained=weights, **open_clip_kwargs(name, kwargs))
    except Exception as e:
        raise ConfigError(
            f"method.teacher={OPEN_CLIP}{name}: open_clip cannot load method.teacher_weights={weights} into it: {e}"
        ) from None
    visual = model.visual
    return visual, (visual.preprocess_cfg["mean"], visual.preprocess_cfg["std"])
