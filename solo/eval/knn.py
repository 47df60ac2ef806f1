"""Weighted k-nearest-neighbour classification on cosine similarity (Wu et al., 2018; as in DINO)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo.eval.probe import topk_correct


@torch.no_grad()
def knn_logits(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    queries: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk: int = 1024,
) -> torch.Tensor:
    """Class scores for each query: the sum of exp(cos / temperature) over its k nearest train samples, per class."""
    if k < 1:
        raise ValueError(f"knn k must be >= 1, got {k}")
    if temperature <= 0:
        raise ValueError(f"knn temperature must be > 0, got {temperature}")
    if train_features.shape[1] != queries.shape[1]:
        raise ValueError(f"train features have width {train_features.shape[1]}, queries {queries.shape[1]}")
    k = min(k, len(train_features))
    keys = F.normalize(train_features.float(), dim=1)
    scores = []
    for q in F.normalize(queries.float(), dim=1).split(chunk):
        sims, idx = (q @ keys.T).topk(k, dim=1)
        votes = torch.zeros(len(q), num_classes, device=q.device)
        scores.append(votes.scatter_add_(1, train_labels[idx], (sims / temperature).exp()))
    return torch.cat(scores)


def knn_accuracy(train_features, train_labels, val_features, val_labels, num_classes, k=20, temperature=0.07) -> dict:
    logits = knn_logits(train_features, train_labels, val_features, num_classes, k, temperature)
    c1, c5 = topk_correct(logits, val_labels)
    return {"acc1": c1 / len(val_labels), "acc5": c5 / len(val_labels)}
