"""The known-wrong variants of global state, for tests/test_methods.py: MoCo v2+ whose queues, and NNCLR whose support
set, hold each rank's own rows only, as a queue filled per GPU does. Registered by `imports=[tests.local_state_methods]`,
configured by tests/configs/method/<name>.yaml."""

import torch

from solo.methods.base import register_method
from solo.methods.memory import GlobalQueue
from solo.methods.mocov2plus import MoCoV2Plus, MoCoV2PlusConfig
from solo.methods.nnclr import NNCLR, NNCLRConfig


class RankLocalQueue(GlobalQueue):
    @torch.no_grad()
    def push(self, rows: torch.Tensor) -> None:
        index = (self.count + torch.arange(len(rows), device=rows.device)) % self.size
        self.rows.index_copy_(0, index, rows.detach().to(self.rows.dtype))
        self.count += len(rows)


@register_method("mocov2plus_local_queue", schema=MoCoV2PlusConfig)
class MoCoV2PlusLocalQueue(MoCoV2Plus):
    def __init__(self, backbone, feature_dim: int, cfg: MoCoV2PlusConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.queues = torch.nn.ModuleList([RankLocalQueue(cfg.queue_size, cfg.proj_output_dim) for _ in range(2)])


@register_method("nnclr_local_support", schema=NNCLRConfig)
class NNCLRLocalSupport(NNCLR):
    def __init__(self, backbone, feature_dim: int, cfg: NNCLRConfig):
        super().__init__(backbone, feature_dim, cfg)
        self.support = RankLocalQueue(cfg.queue_size, cfg.proj_output_dim)
