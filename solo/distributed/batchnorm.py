"""BatchNorm with statistics over the global batch, on CPU (gloo) and GPU (NCCL) alike.

torch.nn.SyncBatchNorm runs on GPUs only; this one is built from solo's differentiable all-reduce, so
its gradient follows the same convention as the losses (see collectives.py) and a W-process step
equals a one-process step on the whole batch, in tests on the CPU as in training on GPUs.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from solo.distributed.collectives import all_reduce
from solo.distributed.env import world_size
from solo.losses._checks import full_precision


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (batch, channels, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or world_size() == 1:
            return super().forward(x)
        # Statistics in (at least) float32 whatever the autocast dtype, as cuDNN's batch norm does.
        x32 = full_precision(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        local_count = x32.new_tensor([x32.numel() / x32.shape[1]])
        sums = all_reduce(torch.cat([x32.sum(dims), local_count]))
        count = sums[-1].detach()
        mean = sums[:-1] / count
        centred = x32 - mean.view(shape)
        var = all_reduce((centred * centred).sum(dims)) / count
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(count))
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        self.num_batches_tracked += 1
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        unbiased = var * (count / max(count - 1.0, 1.0))
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def convert_sync_batchnorm(module: nn.Module, skip: tuple[nn.Module, ...] = ()) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d in `module` by SyncBatchNorm, keeping parameters and statistics;
    submodules in `skip` (e.g. a teacher that keeps per-rank statistics) are left as they are."""
    if any(module is s for s in skip):
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        like = next(module.parameters(), None) if module.affine else module.running_mean
        factory = {"device": like.device, "dtype": like.dtype} if like is not None else {}
        sync = SyncBatchNorm(
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
