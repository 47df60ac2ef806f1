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


class TopkAccuracy:
    """Top-1/top-5 hits summed over batches, then over ranks (so shards may differ in size)."""

    def __init__(self):
        self.counts = torch.zeros(3, dtype=torch.float64)  # top-1 hits, top-5 hits, samples

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        c1, c5 = topk_correct(logits.float().cpu(), labels.cpu())
        self.counts += torch.tensor([c1, c5, len(labels)], dtype=torch.float64)

    def result(self, device) -> dict:
        """{"acc1", "acc5"} over every rank's samples (one all-reduce on `device`)."""
        counts = self.counts
        if world_size() > 1:
            counts = counts.to(device)
            dist.all_reduce(counts)
        c1, c5, n = counts.cpu().tolist()
        return {"acc1": c1 / n, "acc5": c5 / n}


@torch.no_grad()
def accuracy(classifier, features: torch.Tensor, labels: torch.Tensor, device, chunk: int = 4096) -> dict:
    """Top-1/top-5 accuracy of `classifier` on val features that every rank holds whole, in dataset order
    (solo.eval.features.extract_features): every rank computes the same, in the same calls (FSDP's all-gathers of a
    sharded classifier pair up), with no collective of its own."""
    dtype = next(classifier.parameters()).dtype
    hits = torch.zeros(2, dtype=torch.float64)
    with eval_mode(classifier):
        for start in range(0, len(labels), chunk):
            logits = classifier(features[start : start + chunk].to(device, dtype))
            hits += torch.tensor(topk_correct(logits.float().cpu(), labels[start : start + chunk]), dtype=hits.dtype)
    acc1, acc5 = (hits / len(labels)).tolist()
    return {"acc1": acc1, "acc5": acc5}
