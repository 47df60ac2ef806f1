"""Full fine-tuning: backbone and a linear head trained end to end on the labelled train split
(random-resized crops and flips, per-sample seeded), world-size invariant like pretraining, with the
pretraining's own step, data source and distribution wrapper."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from solo.data import EvalDataset, MultiViewDataset, ViewAugmentation, build_view_transform, dataset_stats
from solo.data.sampling.source import MapDataSource, loader_workers
from solo.eval.probe import evaluate
from solo.train.distribute import distribute
from solo.optim import warmup_cosine
from solo.train.step import TrainStep


class Classifier(nn.Module):
    """Backbone + linear head; `forward(batch)` gives the cross-entropy of the first view, as a method does."""

    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, batch: dict) -> dict:
        return {"loss": F.cross_entropy(self.head(self.backbone(batch["views"][0])), batch["label"])}

    def clipped_parameters(self):
        return self.parameters()

    def after_optimizer_step(self, step: int, total_steps: int) -> None:
        pass


def finetune(backbone, train_base, val_base, classes, eval_transform, cfg, env, device, logger) -> dict:
    f, d = cfg.finetune, cfg.data
    mean, std = dataset_stats(d.name)
    crops = ViewAugmentation(crop_scale=list(f.crop_scale), hflip_prob=f.hflip_prob, jitter_prob=0.0, grayscale_prob=0.0)
    train_set = MultiViewDataset(train_base, [build_view_transform(crops, d.image_size, mean, std)], seed=cfg.seed)
    source = MapDataSource(train_set, d.batch_size, env.rank, env.world_size, cfg.seed, num_workers=loader_workers(d.num_workers))
    shard = list(range(env.rank, len(val_base), env.world_size))
    val_loader = DataLoader(EvalDataset(val_base, eval_transform), batch_size=d.batch_size, sampler=shard)

    with torch.no_grad():
        width = backbone.eval()(next(iter(val_loader))["image"][:1].to(device)).shape[1]
    model = Classifier(backbone, nn.Linear(width, len(classes)).to(device)).train()
    forward = distribute(model, device, sync_batchnorm=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=f.lr, momentum=0.9, weight_decay=f.weight_decay)
    total = f.epochs * source.steps_per_epoch
    schedule = partial(warmup_cosine, total_steps=total, warmup_steps=0, base_lr=f.lr, warmup_start_lr=0.0, final_lr=0.0)
    step = TrainStep(forward, model, optimizer, precision="32", device=device, schedule=schedule, total_steps=total)
    index, metrics = 0, {}
    for epoch in range(f.epochs):
        for batch in source:
            out = step({"views": [batch["views"][0].to(device)], "label": batch["label"].to(device)}, index)
            index += 1
        source.next_epoch()
        val = evaluate(model.backbone, model.head, val_loader, device, nullcontext)
        metrics = {"top1": val["val/acc1"], "top5": val["val/acc5"]}
        if logger:
            logger.log({"step": index, "epoch": epoch, "finetune/loss": out["loss"].item(), "finetune/acc1": metrics["top1"], "finetune/acc5": metrics["top5"]})
    return metrics | {
        "protocol": f"full fine-tuning, {f.epochs} epochs, SGD momentum 0.9 lr {f.lr} (cosine) weight decay "
        f"{f.weight_decay}, crops {list(f.crop_scale)} flip {f.hflip_prob}, global batch {source.global_batch}"
    }
