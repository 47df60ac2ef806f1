"""What a pretraining method is: an nn.Module from a batch to its loss and the features a probe needs."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

METHODS: dict[str, Callable[..., "Method"]] = {}


def register(name: str):
    def add(cls):
        METHODS[name] = cls
        return cls

    return add


class Method(nn.Module):
    """Subclasses implement `forward(batch) -> {"loss": scalar, "features": (n, width), "labels": (n,)}`.

    `batch` is a dict from the data pipeline: {"views": [tensor, ...], "label": tensor} for image
    methods, {"image": ..., "text": ..., "label": ...} for image-text ones. "features" are backbone
    features (not yet detached) and "labels" their classes, for the online probe; the loss follows
    solo's distributed convention (the mean over ranks is the global-batch loss).
    """

    inputs = "views"  # what the data pipeline must give: "views" (augmented views) or "image_text" (pairs)

    def __init__(self, backbone: nn.Module, feature_dim: int):
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim


def mlp(dims: list[int], *, last_bn: bool = False) -> nn.Sequential:
    """Linear -> BatchNorm -> ReLU blocks, then a final Linear (optionally followed by a plain BatchNorm)."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-2], dims[1:-1]):
        layers += [nn.Linear(d_in, d_out, bias=False), nn.BatchNorm1d(d_out), nn.ReLU(inplace=True)]
    layers.append(nn.Linear(dims[-2], dims[-1], bias=not last_bn))
    if last_bn:
        layers.append(nn.BatchNorm1d(dims[-1], affine=False))
    return nn.Sequential(*layers)


def two_view_features(backbone: nn.Module, views: list[torch.Tensor]) -> list[torch.Tensor]:
    # One backbone call per view: BatchNorm statistics stay per view, as in the SimCLR/Barlow Twins papers.
    return [backbone(v) for v in views]
