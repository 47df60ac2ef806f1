"""Image retrieval by class on cosine similarity: each query (a val image) ranks the gallery (the train split) and is
scored by how many of the top ones share its label (Musgrave, Belongie and Lim, 2020, "A Metric Learning Reality
Check"). Features come gathered in dataset order (solo.eval.features.extract_features), so the numbers are the same
at any world size.

- Recall@k: the fraction of queries with at least one same-class image among their k nearest.
- MAP@R: with R the number of gallery images of the query's class, the mean over queries of
  (1/R) * sum over i <= R of precision@i * [the i-th nearest is of the query's class]: 1 when the R nearest are
  exactly the class, and unlike recall@k it reads the whole ranking of the class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RECALL_AT = (1, 5)


@torch.no_grad()
def retrieval_metrics(
    gallery: torch.Tensor,
    gallery_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    recall_at: tuple[int, ...] = RECALL_AT,
    chunk: int = 1024,
) -> dict[str, float]:
    """{"map_at_r": ..., "recall_at_<k>": ...} of `queries` against `gallery`; queries whose class the gallery lacks
    are left out (R = 0)."""
    if gallery.shape[1] != queries.shape[1]:
        raise ValueError(f"gallery features have width {gallery.shape[1]}, queries {queries.shape[1]}")
    keys = F.normalize(gallery.double(), dim=1)
    per_class = torch.bincount(gallery_labels, minlength=int(max(gallery_labels.max(), query_labels.max())) + 1)
    depth = min(len(keys), max(int(per_class.max()), *recall_at))
    ap_sum, hits, counted = 0.0, dict.fromkeys(recall_at, 0), 0
    for q, labels in zip(F.normalize(queries.double(), dim=1).split(chunk), query_labels.split(chunk)):
        ranked = (q @ keys.T).topk(depth, dim=1).indices
        relevant = (gallery_labels[ranked] == labels[:, None]).double()  # (queries, depth)
        r = per_class[labels]
        present = r > 0
        within_r = torch.arange(1, depth + 1, device=q.device) <= r[:, None]
        precision = relevant.cumsum(dim=1) / torch.arange(1, depth + 1, device=q.device)
        ap = (precision * relevant * within_r).sum(dim=1) / r.clamp_min(1)
        ap_sum += float(ap[present].sum())
        counted += int(present.sum())
        for k in recall_at:
            hits[k] += int((relevant[present, :k].sum(dim=1) > 0).sum())
    if counted == 0:
        raise ValueError("retrieval_metrics: no query's class is in the gallery")
    return {"map_at_r": ap_sum / counted} | {f"recall_at_{k}": hits[k] / counted for k in recall_at}
