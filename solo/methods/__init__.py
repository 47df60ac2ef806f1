"""Pretraining methods, one registry: `@register_method(name, schema)` on a Method subclass in its own file.

Every module of this package is imported here, which registers the methods shipped with solo: a new method is
one new file. Your own register themselves when their module is imported (list it in the config's `imports`).
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from solo.backbones import build_backbone
from solo.methods.base import METHODS, Method, register_method
from solo.registry import import_modules

import_modules(__name__, __path__)


def method_config(cfg) -> object:
    """The `method` config group (a mapping with `name`) as its registered schema's dataclass, checked."""
    schema = OmegaConf.structured(METHODS[cfg["name"]].schema)
    return OmegaConf.to_object(OmegaConf.merge(schema, cfg))


def build_method(cfg, backbone, feature_dim: int, teacher: torch.nn.Module | None = None) -> Method:
    """The method named by `cfg["name"]`, configured by `cfg` (the `method` group), around `backbone`; `teacher`: the
    frozen pretrained teacher of a method that learns from one (`Method.pretrained_teacher`: solo.zoo.teachers)."""
    target = METHODS[cfg["name"]].target
    if not target.pretrained_teacher:
        return target(backbone, feature_dim, method_config(cfg))
    if teacher is None:
        raise ValueError(
            f"method={cfg['name']} learns from a frozen teacher: give one (solo.zoo.teachers.load_teacher)"
        )
    return target(backbone, feature_dim, method_config(cfg), teacher)


def create_method(cfg, backbone_cfg, teacher: torch.nn.Module | None = None) -> Method:
    """The method of `cfg` (the `method` group) around a new backbone of `backbone_cfg` (the `backbone` group), unless
    the method builds its own image encoder (CLIP and SigLIP with method.model: open_clip's; LiT: `teacher`, its locked
    tower); `teacher` as for build_method."""
    if METHODS[cfg["name"]].target.builds_own_backbone(cfg):
        return build_method(cfg, None, 0, teacher)
    return build_method(cfg, *build_backbone(backbone_cfg), teacher)


__all__ = ["METHODS", "Method", "build_method", "create_method", "method_config", "register_method"]
