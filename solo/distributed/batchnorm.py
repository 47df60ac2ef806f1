"""BatchNorm with statistics over the global batch: torch's SyncBatchNorm on GPUs, solo's own on the CPU.

torch.nn.SyncBatchNorm runs on GPUs only (fused kernels: one all-gather of every rank's mean, inverse
standard deviation and count in the forward, one all-reduce in the backward). For CPU processes (gloo)
solo has its own, built from the differentiable `gather`, with the same gradient convention as the losses
(see collectives.py); on any device a W-process step equals a one-process step on the whole batch.
`convert_sync_batchnorm` picks by where the module's tensors are.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from solo.distributed.collectives import gather
from solo.distributed.env import world_size
from solo.dtypes import full_precision


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (batch, channels, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or world_size() == 1:
            return super().forward(x)
        mean, var, count = global_moments(x)
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = (full_precision(x) - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count)
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        # On the device throughout: no host read of the count, so no synchronisation.
        self.num_batches_tracked += 1
        factor = self.momentum if self.momentum is not None else (1.0 / self.num_batches_tracked).to(mean.dtype)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        unbiased = var * (count / (count - 1).clamp(min=1))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def global_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance of `x` (batch, channels, ...) over every rank's batch, and the
    global count, in at least float32 (as cuDNN's batch norm computes them), differentiable.

    Each rank centres its own batch about its own mean, then one all-gather brings every rank's (sum,
    centred sum of squares, count), combined as Chan et al.'s parallel variance: as exact as a two-pass
    variance over the whole batch, in one collective. A rank with no samples contributes nothing."""
    x32 = full_precision(x)
    dims = [0, *range(2, x.dim())]
    channels = x32.shape[1]
    n = x32.numel() // channels
    local_sum = x32.sum(dims)
    local_m2 = ((x32 - (local_sum / max(n, 1)).view([1, -1] + [1] * (x.dim() - 2))) ** 2).sum(dims)
    stats = torch.cat([local_sum, local_m2, local_sum.new_full((1,), float(n))])
    every = gather(stats.unsqueeze(0), [1] * world_size())  # (W, 2C + 1)
    sums, m2s, counts = every[:, :channels], every[:, channels:-1], every[:, -1:].detach()
    count = counts.sum()
    mean = sums.sum(0) / count
    rank_means = sums / counts.clamp(min=1)
    m2 = m2s.sum(0) + (counts * (rank_means - mean) ** 2).sum(0)
    return mean, m2 / count, count


def convert_sync_batchnorm(module: nn.Module, skip: tuple[nn.Module, ...] = ()) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d in `module` by a synchronised one (torch's for CUDA tensors, solo's
    otherwise), keeping parameters and statistics; submodules in `skip` (e.g. a teacher that keeps per-rank
    statistics) are left as they are."""
    if any(module is s for s in skip):
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, (SyncBatchNorm, nn.SyncBatchNorm)
    ):
        like = next(module.parameters(), None) if module.affine else module.running_mean
        factory = {"device": like.device, "dtype": like.dtype} if like is not None else {}
        kind = nn.SyncBatchNorm if like is not None and like.device.type == "cuda" else SyncBatchNorm
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
