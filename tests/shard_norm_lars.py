"""The known-wrong LARS under FSDP, for tests/test_strategies.py: its trust ratio takes the norms of this rank's
shard of each weight and gradient (what a LARS that unwraps FSDP's DTensors to their local tensors computes), not
of the whole tensors. Registered as optim.name=lars_shard_norms by `imports=[tests.shard_norm_lars]`."""

import torch

from solo.optim import LARS, OPTIMIZERS, LARSConfig, local


class ShardNormLARS(LARS):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                w, g = local(p), local(p.grad).add(local(p), alpha=group["weight_decay"])
                if not group["lars_exclude"]:
                    w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
                    g = g * torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm, 1.0)
                state = self.state[p]
                buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                local(buf).mul_(group["momentum"]).add_(g)
                w.add_(local(buf), alpha=-group["lr"])


@OPTIMIZERS.register("lars_shard_norms", schema=LARSConfig)
def _lars_shard_norms(groups, cfg: LARSConfig, lr: float):
    return ShardNormLARS(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, eta=cfg.eta)
