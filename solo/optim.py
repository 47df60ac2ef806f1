"""Optimizers (one registry, each with its typed config: the `optim` group), parameter groups and the
learning-rate schedule.

Each optimizer has two ways to step: `step()`, torch's (fused kernels where they exist), and `update()`, the same
update as foreach operations that torch.compile traces whole with the rest of the training step
(trainer.compile=step): a group's learning rate and weight decay numbers or 0-dim device tensors (the trainer's,
set in place before each step), the state made beforehand (`make_state`), no fused kernel (torch keeps those out of
graphs) and no graph break (torch's `step()` has two by design). The two agree to float rounding
(tests/test_optim.py).

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
* ``static_lr`` (bool, default False): the training loop leaves the group's learning rate at the optimizer's
  (the scaled ``optim.lr``), with no warm-up, decay or ``lr_scale``: SimSiam's predictor.
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.sgd import sgd as sgd_update

from solo.registry import Registry
from solo.schema import DECAY, MOMENTUM, NON_NEGATIVE, POSITIVE, choices, ruled

# Each entry: `(param groups, optim config, lr) -> torch.optim.Optimizer`, with its config schema.
OPTIMIZERS = Registry("optimizer", "optim.name", group="optim")

# linear: lr x global_batch / 256; sqrt: lr x sqrt(global_batch / 256).
LRScaling = choices("LRScaling", "linear", "sqrt", "none")


@dataclass
class OptimConfig:
    """What every optimizer takes: the learning rate and its schedule, weight decay, clipping, the probe's lr."""

    name: str = "lars"  # a registered optimizer: lars | sgd | adamw
    lr: float = ruled(0.3, POSITIVE)  # for a global batch of 256 under lr_scaling=linear
    lr_scaling: LRScaling = LRScaling("linear")
    weight_decay: float = ruled(1e-6, NON_NEGATIVE)
    # The weight decay's end value, reached on a half cosine over the run (DINO, DINOv2); unset: constant.
    weight_decay_end: Optional[float] = ruled(None, NON_NEGATIVE)
    exclude_bias_and_norm: bool = True
    # Layer-wise learning-rate decay (BEiT; MAE's fine-tuning): each block below the top one learns this times slower.
    layer_decay: Optional[float] = ruled(None, DECAY)
    warmup_epochs: float = ruled(1.0, NON_NEGATIVE)
    warmup_start_lr: float = ruled(0.0, NON_NEGATIVE)
    final_lr: float = ruled(0.0, NON_NEGATIVE)
    grad_clip: Optional[float] = ruled(None, POSITIVE)  # max global gradient norm
    probe_lr: float = ruled(0.1, POSITIVE)  # online linear probe (no weight decay, not LARS-adapted)


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = ruled(0.9, MOMENTUM)


@dataclass
class LARSConfig(SGDConfig):
    eta: float = ruled(0.02, POSITIVE)  # LARS trust coefficient


@dataclass
class AdamWConfig(OptimConfig):
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])

    def validate(self) -> None:
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas={list(self.betas)}: must be two numbers in [0, 1)")


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


def layer_decay(groups: list[dict], backbone: nn.Module, blocks: list[nn.Module], decay: float) -> list[dict]:
    """`groups` split by depth for layer-wise learning-rate decay. Of a backbone with L `blocks`: its parameters before
    the first block (patch and position embeddings, class token, stem) are layer 0, block i's are layer i + 1; every
    other parameter (the backbone's last norm, heads, decoders) is layer L + 1. A layer-l parameter's group gets its
    lr_scale times decay ** (L + 1 - l)."""
    depth = len(blocks)
    layer = {p: i + 1 for i, block in enumerate(blocks) for p in block.parameters()}
    for p in backbone.parameters():  # in registration order: what comes before the first block is the embedding
        if p in layer:
            break
        layer[p] = 0
    out = []
    for group in groups:
        by_layer: dict[int, list] = {}
        for p in group["params"]:
            by_layer.setdefault(layer.get(p, depth + 1), []).append(p)
        for depth_of, params in sorted(by_layer.items()):
            scale = group.get("lr_scale", 1.0) * decay ** (depth + 1 - depth_of)
            out.append({**group, "params": params, "lr_scale": scale})
    return out


def whole_squared_norms(parts: list[torch.Tensor], of: list[torch.Tensor]) -> list[torch.Tensor]:
    """The squared norm of each whole tensor of `of`, from `parts`: each one's local tensor, or a tensor computed from
    it element by element. A plain tensor is whole on every rank: its part's own. FSDP's shards (DTensors placed
    Shard) split the whole: their parts' squares summed over the ranks, in one all-reduce for all of them.
    No host read. On an accelerator one launch for the norms of each dtype (torch._foreach_norm); on the CPU, float32
    and float64 parts one vector_norm each: the foreach norm loops generic reductions there, several times slower, and
    a BLAS dot product sums in an order that depends on its threads, so that a resumed process stepped differently
    (docs/performance.md)."""
    if not parts:
        return []
    if all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in parts):
        squares = [torch.linalg.vector_norm(t).square() for t in parts]
    else:
        squares = list(torch.stack(torch._foreach_norm(parts)).square().unbind())
    groups: dict = {}  # process group -> positions of the shards reduced over it (FSDP's: one)
    for i, t in enumerate(of):
        if isinstance(t, DTensor):
            if not all(placement.is_shard() for placement in t.placements):
                raise ValueError(f"a DTensor placed {t.placements}: its local parts are not shards of the whole")
            groups.setdefault(t.device_mesh.get_group(), []).append(i)
    for group, positions in groups.items():
        summed = torch.stack([squares[i] for i in positions])
        dist.all_reduce(summed, group=group)
        for i, value in zip(positions, summed.unbind()):
            squares[i] = value
    return squares


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: a DTensor's local tensor (sharing its storage), a plain tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Scale the gradients of `params` so their global norm is at most `max_norm`; returns the norm before.
    Parameters may be FSDP shards (DTensors: their norms are the whole tensors') and whole tensors together,
    which torch's clip_grad_norm_ cannot mix. One all-reduce for all the shards (none without), the scale applied
    by one foreach multiply per dtype, on the device (no host read)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    parts = [local(g) for g in grads]
    total = torch.stack(whole_squared_norms(parts, grads)).sum().sqrt()
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's rule, on the device: no host read
    for same_dtype in by_dtype(parts):
        torch._foreach_mul_(same_dtype, scale.to(same_dtype[0].dtype))
    return total


def by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    found: dict = {}
    for t in tensors:
        found.setdefault(t.dtype, []).append(t)
    return list(found.values())


class LARS(torch.optim.Optimizer):
    """SGD with momentum + layer-wise adaptive rate scaling (You et al. 2017, as used by SimCLR/Barlow Twins):
    for each parameter not excluded: g <- g + wd * w;  trust = eta * ||w|| / ||g||  (1.0 when either norm is 0);
    g <- trust * g;  then heavy-ball momentum buf = momentum * buf + g;  w <- w - lr * buf.
    Groups with lars_exclude=True: plain SGD with momentum and their own weight_decay (normally 0).

    The norms are the whole tensors' under FSDP too: every norm of a step from one all-reduce of the shards'
    squares (whole_squared_norms). The arithmetic runs in place over the local tensors, **the gradients included**:
    weight decay and the trust ratio scale them (the training step drops them after it; read them before), then
    torch's fused SGD kernel does the momentum and the update in one pass. No new tensors, half the passes over the
    parameters' memory, so a faster step (docs/performance.md)."""

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
        groups = self.param_groups
        self._step([g["lr"] for g in groups], [g["weight_decay"] for g in groups], fused=True)
        return loss

    @torch.no_grad()
    def update(self) -> None:
        """`step` as foreach operations (see the module's docstring)."""
        groups = self.param_groups
        self._step([g["lr"] for g in groups], [g["weight_decay"] for g in groups], fused=False)

    def make_state(self) -> None:
        """Each parameter's momentum buffer, zeros where it has none yet (the first update then sets it to the
        gradient, as torch's SGD does)."""
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].setdefault("momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format))

    def _step(self, lrs: list, weight_decays: list, fused: bool) -> None:
        stepped = []  # (group, its lr and weight decay, parameters, their local weights, their local gradients)
        for group, lr, decay in zip(self.param_groups, lrs, weight_decays):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("LARS does not support sparse gradients")
            weights, grads = [local(p) for p in params], [local(p.grad) for p in params]
            if not group["lars_exclude"] and not _is_zero(decay):  # the gradient the trust ratio scales
                _add_scaled_(grads, weights, decay)
            stepped.append((group, lr, decay, params, weights, grads))

        adapted = [s for s in stepped if not s[0]["lars_exclude"]]
        params = [p for *_, ps, _, _ in adapted for p in ps]
        norms = whole_squared_norms(
            [w for *_, ws, _ in adapted for w in ws] + [g for *_, gs in adapted for g in gs], params + params
        )
        w_norms, g_norms = iter(norms[: len(params)]), iter(norms[len(params) :])
        for group, lr, decay, params, weights, grads in stepped:
            if not group["lars_exclude"]:
                w_norm = torch.stack([next(w_norms) for _ in params]).sqrt()
                g_norm = torch.stack([next(g_norms) for _ in params]).sqrt()
                # torch.where keeps this on-device (no host read); a zero norm means a fresh zero-initialised
                # layer or no signal, where the ratio is meaningless.
                trust = torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm, 1.0)
                torch._foreach_mul_(grads, list(trust.unbind()))
            buffers = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    # buf starts at zero so the first update is exactly lr * g (matches torch SGD).
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buffers.append(local(state["momentum_buffer"]))
            own_decay = decay if group["lars_exclude"] else 0.0
            if fused:  # buf = momentum * buf + g (+ the excluded groups' own weight decay), w -= lr * buf: one kernel.
                sgd_update(
                    weights,
                    grads,
                    buffers,
                    fused=True,
                    weight_decay=own_decay,
                    momentum=group["momentum"],
                    lr=lr,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                )
            else:
                momentum_update(weights, grads, buffers, lr, own_decay, group["momentum"])


def _is_zero(value) -> bool:
    """Whether a weight decay is a number 0 (a tensor is a schedule's: applied whatever its value)."""
    return not isinstance(value, torch.Tensor) and value == 0


def _add_scaled_(tensors: list[torch.Tensor], others: list[torch.Tensor], scale) -> None:
    """tensors += scale x others, `scale` a number or a 0-dim tensor."""
    if isinstance(scale, torch.Tensor):
        torch._foreach_add_(tensors, torch._foreach_mul(others, scale))
    else:
        torch._foreach_add_(tensors, others, alpha=scale)


def momentum_update(weights, grads, buffers, lr, weight_decay, momentum: float) -> None:
    """SGD with momentum in foreach operations: buf = momentum x buf + grad + weight_decay x w, w -= lr x buf (torch's
    SGD without dampening or Nesterov; `lr`, `weight_decay` numbers or 0-dim tensors)."""
    if not _is_zero(weight_decay):
        grads = torch._foreach_add(grads, torch._foreach_mul(weights, weight_decay))
    if momentum != 0:
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)
        grads = buffers
    _add_scaled_(weights, grads, -lr)


class ShardsApart:
    """A torch optimizer whose step runs FSDP's shards (DTensors) and the parameters FSDP leaves whole (a ViT's
    tokens, solo.train.distribute) of each group as two groups: a foreach or fused kernel takes a list of one kind."""

    @torch.no_grad()
    def step(self, closure=None):
        groups = self.param_groups
        self.param_groups = [
            {**group, "params": kind}
            for group in groups
            for kind in ([p for p in group["params"] if isinstance(p, DTensor) is sharded] for sharded in (True, False))
            if kind
        ]
        try:
            return super().step(closure)
        finally:
            self.param_groups = groups


class SGD(ShardsApart, torch.optim.SGD):
    """torch's SGD, with FSDP's shards and whole parameters apart in its step."""

    @torch.no_grad()
    def update(self) -> None:
        """`step` as foreach operations (see the module's docstring)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                buffers = [self.state[p].get("momentum_buffer") for p in params]
                grads = [p.grad for p in params]
                momentum_update(params, grads, buffers, group["lr"], group["weight_decay"], group["momentum"])

    def make_state(self) -> None:
        """Each parameter's momentum buffer, zeros where it has none yet (the first update then sets it to the
        gradient, as torch's SGD does without dampening)."""
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    self.state[p].setdefault(
                        "momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format)
                    )


class AdamW(ShardsApart, torch.optim.AdamW):
    """torch's AdamW, with FSDP's shards and whole parameters apart in its step."""

    @torch.no_grad()
    def update(self) -> None:
        """`step` as foreach operations (see the module's docstring): torch's AdamW in its capturable form (the step
        counts and bias corrections on the device)."""
        for group in self.param_groups:
            lr, decay = group["lr"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads, states = [p.grad for p in params], [self.state[p] for p in params]
            averages, squares = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
            steps = [s["step"] for s in states]
            beta1, beta2 = group["betas"]
            if not _is_zero(decay):  # decoupled: w *= 1 - lr x weight_decay
                torch._foreach_mul_(params, 1 - lr * decay)
            torch._foreach_add_(steps, 1)
            torch._foreach_lerp_(averages, grads, 1 - beta1)
            torch._foreach_mul_(squares, beta2)
            torch._foreach_addcmul_(squares, grads, grads, 1 - beta2)
            # w -= lr / (1 - beta1^t) x m / (sqrt(v) / sqrt(1 - beta2^t) + eps), t in the weights' precision (as torch's
            # fused kernel computes it; the counts are float32)
            steps = [t.to(p.dtype) for t, p in zip(steps, params)]
            scaled = torch._foreach_pow(beta1, steps)
            torch._foreach_sub_(scaled, 1)
            torch._foreach_div_(scaled, lr)
            torch._foreach_reciprocal_(scaled)  # -lr / (1 - beta1^t)
            corrections = torch._foreach_pow(beta2, steps)
            torch._foreach_sub_(corrections, 1)
            torch._foreach_neg_(corrections)
            torch._foreach_sqrt_(corrections)
            denominators = torch._foreach_sqrt(squares)
            torch._foreach_div_(denominators, corrections)
            torch._foreach_add_(denominators, group["eps"])
            torch._foreach_div_(denominators, scaled)
            torch._foreach_addcdiv_(params, averages, denominators)

    def make_state(self) -> None:
        """Each parameter's step count (on its device) and moments, zeros where it has none yet, as torch's AdamW
        makes them at its first step."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def kernel_kwargs(groups: list[dict], *, fused_shards: bool) -> dict:
    """torch's quickest step for the parameters of `groups`: {"fused": True} where a fused kernel takes every one (its
    device type and a floating dtype; FSDP's shards only where DTensor shards the kernel, `fused_shards`), else
    {"foreach": True}. A fused AdamW keeps its step counts on the device: its step reads nothing on the host."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices  # what torch's own check uses

    devices = _get_fused_kernels_supported_devices()
    fused = all(
        p.device.type in devices and p.is_floating_point() and (fused_shards or not isinstance(p, DTensor))
        for group in groups
        for p in group["params"]
    )
    return {"fused": True} if fused else {"foreach": True}


@OPTIMIZERS.register("sgd", schema=SGDConfig)
def _sgd(groups, cfg: SGDConfig, lr: float):
    # DTensor has no sharding rule for the fused SGD kernel (docs/performance.md lists the torch versions checked):
    # shards take the foreach one.
    fast = kernel_kwargs(groups, fused_shards=False)
    return SGD(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **fast)


@OPTIMIZERS.register("lars", schema=LARSConfig)
def _lars(groups, cfg: LARSConfig, lr: float):
    return LARS(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, eta=cfg.eta)


@OPTIMIZERS.register("adamw", schema=AdamWConfig)
def _adamw(groups, cfg: AdamWConfig, lr: float):
    fast = kernel_kwargs(groups, fused_shards=True)
    return AdamW(groups, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **fast)


def build_optimizer(cfg, groups: list[dict], lr: float) -> torch.optim.Optimizer:
    """The optimizer `cfg.name` (an `optim` config) over `groups` at `lr`; group-level weight_decay/lars_exclude keys
    from param_groups win over the config's. SGD and AdamW ignore lars_exclude (torch keeps unknown group keys)."""
    # Shallow copies: torch fills defaults into the group dicts in place, which would leak one
    # optimizer's lr/momentum into another built from the same groups.
    return OPTIMIZERS[cfg.name].target([dict(g) for g in groups], cfg, lr)


def scaled_lr(optim_cfg, global_batch: int) -> float:
    """optim.lr scaled to the global batch by optim.lr_scaling (the papers' lr are for a batch of 256)."""
    if optim_cfg.lr_scaling == "linear":
        return optim_cfg.lr * global_batch / 256
    if optim_cfg.lr_scaling == "sqrt":
        return optim_cfg.lr * math.sqrt(global_batch / 256)
    return optim_cfg.lr


def warmup_cosine(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int,
    base_lr: float,
    warmup_start_lr: float = 0.0,
    final_lr: float = 0.0,
) -> float:
    """Learning rate at `step` (0-based, per optimizer step): linear from warmup_start_lr to base_lr over
    warmup_steps, then cosine from base_lr to final_lr at total_steps. A pure function (resume needs only the step).

    lr(0) == warmup_start_lr, lr(warmup_steps) == base_lr, lr(total_steps) == final_lr; steps past
    total_steps stay at final_lr."""
    if step < 0 or warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError(
            f"need 0 <= step and 0 <= warmup_steps <= total_steps, got "
            f"step={step}, warmup_steps={warmup_steps}, total_steps={total_steps}"
        )
    if step < warmup_steps:
        return warmup_start_lr + (base_lr - warmup_start_lr) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return final_lr + 0.5 * (base_lr - final_lr) * (1.0 + math.cos(math.pi * progress))
