"""Linear classifier on frozen, cached features: standardised with the train split's statistics,
then a linear layer trained with SGD (momentum, cosine schedule) on mini-batches of the cached tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.eval.probe import topk_correct


@dataclass
class LinearProtocol:
    """Also the schema of main_linear's `linear` config node."""

    epochs: int = 100
    batch_size: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0

    def describe(self) -> str:
        return (
            f"frozen backbone, eval transform, features standardised on the train split, linear layer, "
            f"SGD momentum {self.momentum} lr {self.lr} (cosine to 0) weight decay {self.weight_decay}, "
            f"{self.epochs} epochs of batch {self.batch_size}, seed {self.seed}"
        )


def train_linear(
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    protocol: LinearProtocol,
    log: Callable[[dict], None] = lambda metrics: None,
) -> tuple[nn.Module, dict]:
    """Fit on `train` (features, labels); returns the classifier (standardisation included) and val top-1/top-5.

    `log` gets {"step", "epoch", "train/loss", "lr", "val/acc1", "val/acc5"} after every epoch.
    """
    (x, y), (xv, yv) = train, val
    if len(x) == 0 or len(xv) == 0:
        raise ValueError(f"linear evaluation needs train and val samples, got {len(x)} and {len(xv)}")
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    head = nn.Linear(x.shape[1], num_classes).to(x.device)
    generator = torch.Generator().manual_seed(protocol.seed)
    with torch.no_grad():  # seeded, so the result depends on the protocol alone
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator).to(x.device) * 0.01)
        head.bias.zero_()
    optimizer = torch.optim.SGD(
        head.parameters(), lr=protocol.lr, momentum=protocol.momentum, weight_decay=protocol.weight_decay
    )
    x, xv = (x - mean) / std, (xv - mean) / std
    steps_per_epoch = math.ceil(len(x) / protocol.batch_size)
    total, step = protocol.epochs * steps_per_epoch, 0
    metrics = {}
    for epoch in range(protocol.epochs):
        order = torch.randperm(len(x), generator=generator).to(x.device)
        loss_sum = 0.0
        for batch in order.split(protocol.batch_size):
            lr = 0.5 * protocol.lr * (1 + math.cos(math.pi * step / total))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(head(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(batch)
            step += 1
        with torch.no_grad():
            c1, c5 = topk_correct(head(xv), yv)
        metrics = {"val/acc1": c1 / len(yv), "val/acc5": c5 / len(yv)}
        log({"step": step, "epoch": epoch, "train/loss": loss_sum / len(x), "lr": lr, **metrics})
    return Standardised(head, mean, std), metrics


class Standardised(nn.Module):
    """The trained head with its input standardisation, to apply to raw backbone features."""

    def __init__(self, head: nn.Linear, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.head = head
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head((features - self.mean) / self.std)
