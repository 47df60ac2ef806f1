"""Pretraining methods, one registry: `@register_method(name, schema)` on a Method subclass in its own file.

The methods shipped with solo are imported here; your own register themselves when their module is
imported (list it in the config's `imports`).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from solo.methods import barlow_twins, byol, clip, dino, mocov3, siglip, simclr, swav, vicreg  # noqa: F401  (registers them)
from solo.methods.base import METHODS, Method, register_method


def method_config(cfg) -> object:
    """The `method` config group (a mapping with `name`) as its registered schema's dataclass, checked."""
    schema = OmegaConf.structured(METHODS[cfg["name"]].schema)
    return OmegaConf.to_object(OmegaConf.merge(schema, cfg))


def build_method(cfg, backbone, feature_dim: int) -> Method:
    """The method named by `cfg["name"]`, configured by `cfg` (the `method` group), around `backbone`."""
    return METHODS[cfg["name"]].target(backbone, feature_dim, method_config(cfg))


__all__ = ["METHODS", "Method", "build_method", "method_config", "register_method"]
