"""Pretraining methods, one registry: build_method(name, backbone, feature_dim, **hyperparameters)."""

from solo.methods import barlow_twins, clip, simclr  # noqa: F401  (registers the methods)
from solo.methods.base import METHODS, Method


def build_method(name: str, backbone, feature_dim: int, **hparams) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name](backbone, feature_dim, **hparams)


__all__ = ["METHODS", "Method", "build_method"]
