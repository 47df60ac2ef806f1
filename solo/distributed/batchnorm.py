"""BatchNorm over views that share one call, and with statistics over the global batch.

Most methods' views each keep their batch statistics (solo.methods.base.encode_views), yet the views of one size go
through the backbone in one call: inside `row_groups(module, G)` the call's rows are G equal groups, each normalised with its
own statistics, as G calls would normalise them (an attribute of each BatchNorm, set and put back around the call:
state a compiled step can carry, where a ContextVar's setting cannot be traced). `group_batchnorms` makes a model's BatchNorms do so: each group through
the layer's own kernel in turn (the same kernel, the same rows, so the same numbers and running statistics as a call
per view), while the convolutions, activations and their gradients run once for all the views.

Global statistics: torch.nn.SyncBatchNorm runs on GPUs only (fused kernels: one all-gather of every rank's mean,
inverse standard deviation and count in the forward, one all-reduce in the backward). For CPU processes (gloo)
solo has its own, with the same collectives and the same gradient convention as the losses (see
collectives.py): on any device a W-process step equals a one-process step on the whole batch; its row groups share
one collective each way. `convert_sync_batchnorm` picks by where the module's tensors are.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from solo.distributed.collectives import gather, sum_over_ranks
from solo.distributed.env import world_size
from solo.dtypes import full_precision


def grouping(module: nn.Module) -> list[nn.Module]:
    """The BatchNorms of `module` that take row groups (PerGroup's, solo's SyncBatchNorm)."""
    return [m for m in module.modules() if isinstance(m, (PerGroup, SyncBatchNorm))]


@contextmanager
def row_groups(module: nn.Module, count: int):
    """Inside it, the BatchNorms of `module` that take row groups (`grouping`) take their input's rows as `count` equal
    groups, each normalised with its own statistics: `count` views concatenated in one call are normalised as `count`
    calls would normalise them (solo.methods.base.encode_views); solo's SyncBatchNorm takes every group's global
    statistics in one collective each way."""
    norms = grouping(module)
    outer = [m.__dict__.get("row_groups") for m in norms]  # None: the class's 1
    for m in norms:
        m.row_groups = count
    try:
        yield
    finally:
        for m, groups in zip(norms, outer):
            _put_back(m, groups)


@contextmanager
def running_stats_kept(module: nn.Module):
    """Inside it, the BatchNorms of `module` normalise with their input's statistics as in any training call, and
    leave their running statistics and counts as they were: for inputs that must not shape the statistics the module
    evaluates with (PIRL's jigsaw tiles, besides its images). An attribute of each, set and put back, as row_groups'."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    for m in norms:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in norms:
            m.track_running_stats = True


def row_groups_replayed(block: nn.Module) -> tuple:
    """Two context managers for activation checkpointing (torch.utils.checkpoint's `context_fn`): the first records
    the row groups of `block`'s BatchNorms as its forward runs, the second sets them again for the forward run again
    in the backward, outside the call that set them."""
    state = {}

    @contextmanager
    def record():
        state["groups"] = [(m, m.row_groups) for m in grouping(block)]
        yield

    @contextmanager
    def replay():
        outer = [(m, m.__dict__.get("row_groups")) for m, _ in state["groups"]]
        for m, groups in state["groups"]:
            m.row_groups = groups
        try:
            yield
        finally:
            for m, groups in outer:
                _put_back(m, groups)

    return record(), replay()


def _put_back(module: nn.Module, groups: int | None) -> None:
    """`module`'s row groups as they were: its own number, or none (its class's), so that a module looks the same
    before and after a call (what a compiled step's guards check)."""
    if groups is None:
        module.__dict__.pop("row_groups", None)
    else:
        module.row_groups = groups


def normalises_row_groups(module: nn.Module) -> bool:
    """Whether `module` has BatchNorm and every one takes `row_groups`: then views concatenated in one call keep their
    own batch statistics. Those of `group_batchnorms` do; so does solo's SyncBatchNorm in a run of W > 1 processes.
    Elsewhere (plain BatchNorms, in your own loop) each view needs its own call."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return bool(norms) and all(
        isinstance(m, PerGroup) or (isinstance(m, SyncBatchNorm) and world_size() > 1) for m in norms
    )


class PerGroup:
    """A BatchNorm class's forward, per row group: in training inside `row_groups(module, G)`, each of the G groups of
    rows through the class's own forward in turn (its statistics, its running statistics' update), else in one call."""

    row_groups = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = self.row_groups
        if groups == 1 or not self.training:
            return super().forward(x)
        if x.shape[0] % groups:
            raise ValueError(f"{type(self).__name__}: {x.shape[0]} rows cannot be {groups} equal groups (row_groups)")
        normalise = super().forward
        return torch.cat([normalise(part) for part in x.chunk(groups)])


_PER_GROUP: dict[type, type] = {}


def per_group(cls: type) -> type:
    """`cls` (a BatchNorm class) with PerGroup's forward, made once per class."""
    if cls not in _PER_GROUP:
        _PER_GROUP[cls] = type(cls.__name__, (PerGroup, cls), {"__module__": __name__, "__doc__": cls.__doc__})
    return _PER_GROUP[cls]


def group_batchnorms(module: nn.Module) -> nn.Module:
    """`module` with each of its BatchNorms taking row groups (PerGroup), in place: the same parameters, buffers and
    state dict, another class (solo's SyncBatchNorm takes them already)."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, (PerGroup, SyncBatchNorm)):
            m.__class__ = per_group(type(m))
    return module


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    row_groups = 1  # see row_groups

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (batch, channels, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or world_size() == 1:
            return super().forward(x)
        groups = self.row_groups
        if x.shape[0] % groups:
            raise ValueError(f"SyncBatchNorm: {x.shape[0]} rows cannot be {groups} equal groups (row_groups)")
        with torch.no_grad():  # the gradient through the statistics is _GlobalNorm's backward
            mean, var, count = global_moments(x, groups)
        if self.track_running_stats:  # group by group, as separate calls would update them
            for g in range(groups):
                self._update_running_stats(mean[g], var[g], count[g])
        return _GlobalNorm.apply(x, self.weight, self.bias, mean, var, count, self.eps)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        # On the device throughout: no host read of the count, so no synchronisation.
        self.num_batches_tracked += 1
        factor = self.momentum if self.momentum is not None else (1.0 / self.num_batches_tracked).to(mean.dtype)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        unbiased = var * (count / (count - 1).clamp(min=1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def _grouped(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(G * n, C, ...) as (G, n, C, ...)."""
    return t.view(groups, t.shape[0] // groups, *t.shape[1:])


class _GlobalNorm(torch.autograd.Function):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, each group of rows with its own global `mean` and `var`
    (G, C) over `count` (G,) samples. Backward: this rank's per-channel sums of dy and dy * x_hat (aten's fused
    kernel), summed over the ranks in one collective for all groups, give the input's gradient through the
    statistics exactly as a BatchNorm's on the whole batch; the weight's and bias's gradients are this rank's sums
    (the data-parallel wrapper adds the ranks', as for every parameter)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, var, count, eps):
        groups = mean.shape[0]
        coefficient = [groups, 1, -1] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var + eps)
        scale = invstd if weight is None else invstd * weight
        shift = -mean * scale if bias is None else bias - mean * scale
        x32 = full_precision(x)
        y = torch.empty_like(x32, memory_format=torch.contiguous_format)  # not a view: ReLU(inplace) may change it
        with torch.autocast(x.device.type, enabled=False):
            torch.addcmul(
                shift.view(coefficient), _grouped(x32, groups), scale.view(coefficient), out=_grouped(y, groups)
            )
        ctx.save_for_backward(x, weight, mean, invstd, count)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, count = ctx.saved_tensors
        groups, channels = mean.shape
        coefficient = [groups, 1, -1] + [1] * (x.dim() - 2)
        with torch.autocast(x.device.type, enabled=False):
            xg, dyg = _grouped(full_precision(x), groups), _grouped(full_precision(dy).contiguous(), groups)
            sums = []  # per group: this rank's sums of dy and of dy * x_hat
            for g in range(groups):
                if xg.shape[1]:
                    _, dy_xhat, dy_sum = torch.ops.aten.native_batch_norm_backward(
                        dyg[g], xg[g], weight, None, None, mean[g], invstd[g], True, 0.0, [False, True, True]
                    )
                else:  # aten's kernel divides by the sample count: a rank with none adds nothing
                    dy_xhat = dy_sum = xg.new_zeros(channels)
                sums.append(torch.stack([dy_sum, dy_xhat]))
            local = torch.stack(sums)  # (G, 2, C)
            every = sum_over_ranks(local) / count.view(groups, 1, 1)
            scale = invstd if weight is None else invstd * weight
            dx = None
            if ctx.needs_input_grad[0]:
                # dx = scale * (dy - mean(dy) - x_hat * mean(dy * x_hat)), the means over the group's global batch
                centred = xg - mean.view(coefficient)
                dx = torch.addcmul(
                    (-scale * every[:, 0]).view(coefficient), centred, (-scale * invstd * every[:, 1]).view(coefficient)
                )
                dx = dx.addcmul_(dyg, scale.view(coefficient)).view(x.shape).to(x.dtype)
        has_weight = weight is not None
        grad_weight = local[:, 1].sum(0).to(weight.dtype) if has_weight and ctx.needs_input_grad[1] else None
        grad_bias = local[:, 0].sum(0).to(weight.dtype) if has_weight and ctx.needs_input_grad[2] else None
        return dx, grad_weight, grad_bias, None, None, None, None


def global_moments(x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance of each of `groups` equal groups of `x`'s rows (batch, channels, ...)
    over every rank's batch, (G, C) each, and the global count per group (G,), in at least float32 (as cuDNN's batch
    norm computes them).

    Each rank takes its own groups' sums and centred sums of squares (two passes), then one all-gather brings every
    rank's (sum, centred sum of squares, count), combined as Chan et al.'s parallel variance: as exact as a two-pass
    variance over the whole batch, in one collective. A rank with no samples contributes nothing."""
    xg = _grouped(full_precision(x), groups)
    dims = [1, *range(3, xg.dim())]
    channels = xg.shape[2]
    n = xg[0].numel() // channels
    if n:  # two passes, sum then centred squares: torch.var_mean is slower on the CPU (docs/performance.md)
        local_sum = xg.sum(dims)
        local_m2 = (xg - (local_sum / n).view(groups, 1, channels, *[1] * (xg.dim() - 3))).square_().sum(dims)
    else:
        local_sum = local_m2 = xg.new_zeros(groups, channels)
    stats = torch.cat([local_sum, local_m2, local_sum.new_full((groups, 1), float(n))], dim=1)
    every = gather(stats.view(1, -1), [1] * world_size()).view(-1, groups, 2 * channels + 1)  # (W, G, 2C + 1)
    sums, m2s, counts = every[..., :channels], every[..., channels:-1], every[..., -1:]
    count = counts.sum(0)  # (G, 1)
    mean = sums.sum(0) / count
    rank_means = sums / counts.clamp(min=1)
    m2 = m2s.sum(0) + (counts * (rank_means - mean) ** 2).sum(0)
    return mean, m2 / count, count.view(groups)


def convert_sync_batchnorm(module: nn.Module, skip: tuple[nn.Module, ...] = ()) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d in `module` by a synchronised one (torch's for CUDA tensors, taking row groups
    one call each; solo's otherwise), keeping parameters and statistics; submodules in `skip` (e.g. a teacher that keeps
    per-rank statistics) are left as they are."""
    if any(module is s for s in skip):
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, (SyncBatchNorm, nn.SyncBatchNorm)
    ):
        like = next(module.parameters(), None) if module.affine else module.running_mean
        factory = {"device": like.device, "dtype": like.dtype} if like is not None else {}
        kind = per_group(nn.SyncBatchNorm) if like is not None and like.device.type == "cuda" else SyncBatchNorm
        sync = kind(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats, **factory
        )
        sync.load_state_dict(module.state_dict())
        sync.train(module.training)
        if module.affine:  # a teacher's stay untrained
            sync.requires_grad_(module.weight.requires_grad)
        return sync
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, skip))
    return module
