"""Pretraining methods, one registry: `@register_method(name, schema)` on a Method subclass in its own file.

The methods shipped with solo are imported here; your own register themselves when their module is
imported (list it in the config's `imports`).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from solo.backbones import build_backbone
from solo.methods import (  # noqa: F401  (registers them)
    all4one,
    barlow_twins,
    byol,
    clip,
    dcl,
    deepclusterv2,
    dino,
    dinov2,
    ijepa,
    lejepa,
    mae,
    mmcr,
    mocov2plus,
    mocov3,
    nnbyol,
    nnclr,
    nnsiam,
    ressl,
    siglip,
    simclr,
    simsiam,
    supcon,
    supervised,
    swav,
    vibcreg,
    vicreg,
    wmse,
)
from solo.methods.base import METHODS, Method, register_method


def method_config(cfg) -> object:
    """The `method` config group (a mapping with `name`) as its registered schema's dataclass, checked."""
    schema = OmegaConf.structured(METHODS[cfg["name"]].schema)
    return OmegaConf.to_object(OmegaConf.merge(schema, cfg))


def build_method(cfg, backbone, feature_dim: int) -> Method:
    """The method named by `cfg["name"]`, configured by `cfg` (the `method` group), around `backbone`."""
    return METHODS[cfg["name"]].target(backbone, feature_dim, method_config(cfg))


def create_method(cfg, backbone_cfg) -> Method:
    """The method of `cfg` (the `method` group) around a new backbone of `backbone_cfg` (the `backbone` group), unless
    the method builds its own image encoder (CLIP and SigLIP with method.model: open_clip's)."""
    if METHODS[cfg["name"]].target.builds_own_backbone(cfg):
        return build_method(cfg, None, 0)
    return build_method(cfg, *build_backbone(backbone_cfg))


__all__ = ["METHODS", "Method", "build_method", "create_method", "method_config", "register_method"]
