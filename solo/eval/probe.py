"""Online linear probe: accuracy of a linear classifier on frozen (detached) backbone features."""

from __future__ import annotations

import torch
import torch.distributed as dist

from solo.distributed import world_size
from solo.eval.mode import eval_mode


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> list[int]:
    """How many samples have their label among the k highest logits, for each k (capped at the class count)."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top == labels[:, None]
    return [int(hits[:, :k].any(dim=1).sum()) for k in ks]


@torch.no_grad()
def evaluate(backbone, probe, loader, device, autocast) -> dict:
    """Top-1/top-5 accuracy over the whole val split: counts summed over ranks, so shards may differ in size."""
    dtype = next(probe.parameters()).dtype
    counts = torch.zeros(3, dtype=torch.float64)
    with eval_mode(backbone, probe):
        for batch in loader:
            images = batch["image"].to(device, dtype, non_blocking=True)
            with autocast():
                logits = probe(backbone(images)).float()
            c1, c5 = topk_correct(logits.cpu(), batch["label"])
            counts += torch.tensor([c1, c5, len(images)], dtype=torch.float64)
    if world_size() > 1:
        counts = counts.to(device)
        dist.all_reduce(counts)
        counts = counts.cpu()
    c1, c5, n = counts.tolist()
    return {"val/acc1": c1 / n, "val/acc5": c5 / n}
