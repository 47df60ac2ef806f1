"""Frozen-backbone features of a whole split, extracted in shards across ranks and gathered on every rank."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from pathlib import Path

import torch

from solo.data import real_rows
from solo.data.decode import SkippedImages
from solo.distributed import gather
from solo.eval.mode import eval_mode


@torch.no_grad()
def extract_features(
    backbone, loader, device, autocast=nullcontext, head=None, skipped: SkippedImages | None = None
) -> tuple[torch.Tensor, ...]:
    """(features, labels) of every sample the loader's ranks see together, in dataset order, float32 on CPU; with
    `head`, also head(features) of the same pass (a method's projector: solo.eval.health), third.

    Each rank reads its own shard (solo.data.eval_loader: the same number of batches on every rank, whose padding
    rows and unreadable images are dropped here); the shards are gathered and put back in dataset order by the
    samples' indices, so the result is the same on every rank and world size. `skipped` names the unreadable images
    (data.on_bad_image=skip); every rank passes it, or none.
    """
    dtype = next(backbone.parameters()).dtype
    feats, heads, labels, index, unreadable = [], [], [], [], []
    with eval_mode(backbone, head):
        for batch in loader:
            real = real_rows(batch)
            unreadable.append(batch["index"][~real & ~batch["padding"]])
            real = real.to(device)
            with autocast():
                f = backbone(batch["image"].to(device, dtype, non_blocking=True))
                if head is not None:
                    heads.append(head(f)[real].float())
            feats.append(f[real].float())
            labels.append(batch["label"].to(device)[real])
            index.append(batch["index"].to(device)[real])
    if skipped is not None:
        skipped.find(loader.dataset.read, gather(torch.cat(unreadable).to(device)).tolist())
    order = gather(torch.cat(index)).argsort()
    kept = [feats, labels] + ([heads] if head is not None else [])
    return tuple(gather(torch.cat(part))[order].cpu() for part in kept)


def state_fingerprint(module: torch.nn.Module) -> str:
    """sha256 over a module's parameters and buffers (names, shapes, dtypes, values)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class FeatureCache:
    """Features on disk, keyed by everything that determines them: weights, data and preprocessing."""

    def __init__(self, directory: str | Path | None):
        self.dir = Path(directory) if directory else None

    def path(self, key: str) -> Path | None:
        return self.dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt" if self.dir else None

    def get(self, key: str):
        path = self.path(key)
        if path is None or not path.exists():
            return None
        stored = torch.load(path, map_location="cpu", weights_only=True)
        return (stored["features"], stored["labels"]) if stored["key"] == key else None

    def put(self, key: str, features: torch.Tensor, labels: torch.Tensor) -> None:
        path = self.path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"key": key, "features": features, "labels": labels}, tmp)
        tmp.replace(path)
