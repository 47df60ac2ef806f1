"""The known-wrong variants of global state, for tests/test_methods.py: MoCo v2+ whose queues, and NNCLR whose support
set, hold each rank's own rows only, as a queue filled per GPU does; and for tests/test_accumulate.py, DINO whose
centre moves once per micro-batch, and I-JEPA whose masks are cut to the smallest in the batch it is given. Registered by `imports=[tests.local_state_methods]`,
configured by tests/configs/method/<name>.yaml."""

import torch

from solo.losses import dino_center, dino_loss
from solo.methods.base import register_method
from solo.methods.dino import DINO, DINOConfig
from solo.methods.ijepa import IJEPA, IJEPAConfig
from solo.methods.memory_banks import GlobalQueue
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


@register_method("dino_centre_per_micro_batch", schema=DINOConfig)
class DINOCentrePerMicroBatch(DINO):
    """DINO whose centre moves with every micro-batch's teacher outputs, as a loop that accumulates gradients by
    calling the whole forward k times does: under trainer.accumulate=k the centre takes k updates per step, of
    micro-batch means."""

    def encode(self, batch: dict) -> dict:
        encoded = super().encode(batch)
        if torch.is_grad_enabled():  # once per micro-batch: GradCache's second pass, the one with a graph
            with torch.no_grad():
                teacher = [self.teacher[1](t) for t in encoded["teacher"]]
                self.center.copy_(dino_center(teacher, self.center, self.cfg.center_momentum))
        return encoded

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        student = [self.head(f) for f in encoded["features"]]
        with torch.no_grad():
            teacher = [self.teacher[1](t) for t in encoded["teacher"]]
        loss = dino_loss(student, teacher, self.center, self.cfg.student_temperature, self.teacher_temperature)
        features = torch.cat(encoded["features"][: self.num_views])
        return {"loss": loss, "features": features, "labels": batch["label"].repeat(self.num_views)}


@register_method("ijepa_cut_to_batch", schema=IJEPAConfig)
class IJEPACutToBatch(IJEPA):
    """I-JEPA whose context and target masks are each cut to the smallest of their kind in the batch it is given (a
    sample keeps its first patches), as I-JEPA's collator cuts them to the smallest in each GPU's batch: under
    trainer.accumulate=k, to each micro-batch's smallest."""

    def encode(self, batch: dict) -> dict:
        masks = batch["mask"].clone()
        for row in range(masks.shape[1]):
            smallest = masks[:, row].sum(dim=1).min()
            masks[:, row] &= masks[:, row].cumsum(dim=1) <= smallest
        return super().encode({**batch, "mask": masks})
