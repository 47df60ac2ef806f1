"""Optimizers, parameter groups and the learning-rate schedule for pretraining.

Param-group keys understood here (besides torch's own ``params``/``lr``/``weight_decay``):

* ``lars_exclude`` (bool, default False): LARS skips the trust-ratio scaling for the group and runs
  plain SGD with momentum (and the group's own weight_decay) on it. Set by :func:`param_groups`
  for biases and normalisation params.
  SGD and AdamW ignore it (torch keeps unknown group keys, so it is harmless there).
* ``lr_scale`` (float, default 1.0 when absent): the training loop sets, every step,
  ``group["lr"] = warmup_cosine(step, ...) * group.get("lr_scale", 1.0)``; e.g. the linear-probe
  head gets its own scale. Optimizers here never read it.
* ``frozen_steps`` (int, default 0): the training step drops the group's gradients for its first
  ``frozen_steps`` steps, so the optimizer leaves it (and its state) untouched: DINO's last layer, SwAV's
  prototypes in the first epoch.
"""

import math

import torch
from torch import nn

from solo.registry import Registry

# Each entry: `(param groups, lr, weight_decay, momentum, betas, eta) -> torch.optim.Optimizer`.
OPTIMIZERS = Registry("optimizer", "optim.name")


def param_groups(model: nn.Module, weight_decay: float, *, exclude_bias_and_norm: bool = True) -> list[dict]:
    """Two groups: regular weights, and biases + normalisation parameters (every parameter with ndim <= 1)
    which get weight_decay 0 and are excluded from LARS adaptation (key "lars_exclude": True).
    With exclude_bias_and_norm=False, one group with weight_decay for all. Skip params with requires_grad False.
    Empty groups are omitted."""
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() already deduplicates shared tensors
        if not p.requires_grad:
            continue
        # ndim <= 1 covers biases, BN/LN affine params and scalar temperatures.
        (no_decay if exclude_bias_and_norm and p.ndim <= 1 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lars_exclude": False},
        {"params": no_decay, "weight_decay": 0.0, "lars_exclude": True},
    ]
    return [g for g in groups if g["params"]]


class LARS(torch.optim.Optimizer):
    """SGD with momentum + layer-wise adaptive rate scaling (You et al. 2017, as used by SimCLR/Barlow Twins):
    for each parameter not excluded: g <- g + wd * w;  trust = eta * ||w|| / ||g||  (1.0 when either norm is 0);
    g <- trust * g;  then heavy-ball momentum buf = momentum * buf + g;  w <- w - lr * buf.
    Groups with lars_exclude=True: plain SGD with momentum and their own weight_decay (normally 0)."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.02):
        if lr < 0.0:
            raise ValueError(f"invalid lr {lr}")
        if momentum < 0.0:
            raise ValueError(f"invalid momentum {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay {weight_decay}")
        if eta <= 0.0:
            raise ValueError(f"invalid eta {eta}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars_exclude=False)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            lr, momentum, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("LARS does not support sparse gradients")
                g = p.grad
                if wd != 0:
                    g = g.add(p, alpha=wd)
                if not group["lars_exclude"]:
                    w_norm = torch.linalg.vector_norm(p)
                    g_norm = torch.linalg.vector_norm(g)
                    # torch.where keeps this on-device (no .item() sync); a zero norm means a fresh
                    # zero-initialised layer or no signal, where the ratio is meaningless.
                    one = torch.ones_like(w_norm)
                    trust = torch.where((w_norm > 0) & (g_norm > 0), eta * w_norm / g_norm, one)
                    g = g.mul(trust)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    # buf starts at zero so the first update is exactly lr * g (matches torch SGD).
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g)
                p.add_(buf, alpha=-lr)
        return loss


@OPTIMIZERS.register("sgd")
def _sgd(groups, lr, weight_decay, momentum, betas, eta):
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)


@OPTIMIZERS.register("lars")
def _lars(groups, lr, weight_decay, momentum, betas, eta):
    return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta)


@OPTIMIZERS.register("adamw")
def _adamw(groups, lr, weight_decay, momentum, betas, eta):
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay)


def build_optimizer(name: str, groups: list[dict], *, lr: float, weight_decay: float, momentum: float = 0.9,
                    betas: tuple[float, float] = (0.9, 0.999), eta: float = 0.02) -> torch.optim.Optimizer:
    """The registered optimizer `name`; group-level weight_decay/lars_exclude keys from param_groups win over
    the defaults. SGD and AdamW ignore lars_exclude (torch keeps unknown group keys, so it just rides along)."""
    # Shallow copies: torch fills defaults into the group dicts in place, which would leak one
    # optimizer's lr/momentum into another built from the same groups.
    groups = [dict(g) for g in groups]
    return OPTIMIZERS[name].target(groups, lr, weight_decay, momentum, betas, eta)


def scaled_lr(optim_cfg, global_batch: int) -> float:
    """optim.lr scaled to the global batch by optim.lr_scaling (the papers' lr are for a batch of 256)."""
    rule = str(optim_cfg.lr_scaling)
    if rule == "linear":
        return optim_cfg.lr * global_batch / 256
    if rule == "sqrt":
        return optim_cfg.lr * math.sqrt(global_batch / 256)
    return optim_cfg.lr


def warmup_cosine(step: int, *, total_steps: int, warmup_steps: int, base_lr: float,
                  warmup_start_lr: float = 0.0, final_lr: float = 0.0) -> float:
    """Learning rate at `step` (0-based, per optimizer step): linear from warmup_start_lr to base_lr over
    warmup_steps, then cosine from base_lr to final_lr at total_steps. A pure function (resume needs only the step).

    lr(0) == warmup_start_lr, lr(warmup_steps) == base_lr, lr(total_steps) == final_lr; steps past
    total_steps stay at final_lr."""
    if step < 0 or warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError(f"need 0 <= step and 0 <= warmup_steps <= total_steps, got "
                         f"step={step}, warmup_steps={warmup_steps}, total_steps={total_steps}")
    if step < warmup_steps:
        return warmup_start_lr + (base_lr - warmup_start_lr) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return final_lr + 0.5 * (base_lr - final_lr) * (1.0 + math.cos(math.pi * progress))
