"""Full fine-tuning: backbone and a linear head trained end to end on the labelled train split
(random-resized crops and flips, per-sample seeded), world-size invariant like pretraining."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from solo.data import EvalDataset, MultiViewDataset, ViewAugmentation, build_view_transform, dataset_stats
from solo.data.sampler import GlobalBatchSampler
from solo.distributed.batchnorm import convert_sync_batchnorm
from solo.eval.probe import evaluate
from solo.train.optim import warmup_cosine


def finetune(backbone, train_base, val_base, classes, eval_transform, cfg, env, device, logger) -> dict:
    f, d = cfg.finetune, cfg.data
    mean, std = dataset_stats(d.name)
    crops = ViewAugmentation(crop_scale=list(f.crop_scale), hflip_prob=f.hflip_prob, jitter_prob=0.0, grayscale_prob=0.0)
    train_set = MultiViewDataset(train_base, [build_view_transform(crops, d.image_size, mean, std)], seed=cfg.seed)
    sampler = GlobalBatchSampler(len(train_set), d.batch_size, env.rank, env.world_size, cfg.seed)
    loader = DataLoader(train_set, batch_sampler=sampler, num_workers=d.num_workers)
    shard = list(range(env.rank, len(val_base), env.world_size))
    val_loader = DataLoader(EvalDataset(val_base, eval_transform), batch_size=d.batch_size, sampler=shard)

    with torch.no_grad():
        width = backbone.eval()(next(iter(val_loader))["image"][:1].to(device)).shape[1]
    head = nn.Linear(width, len(classes)).to(device)
    model = nn.Sequential(backbone, head)
    if env.world_size > 1:
        model = convert_sync_batchnorm(model).to(device)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    else:
        ddp = model
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=f.lr, momentum=0.9, weight_decay=f.weight_decay)
    total = f.epochs * len(sampler)
    step, metrics = 0, {}
    for epoch in range(f.epochs):
        sampler.set_epoch(epoch, 0)
        for batch in loader:
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine(step, total_steps=total, warmup_steps=0, base_lr=f.lr, warmup_start_lr=0.0, final_lr=0.0)
            loss = F.cross_entropy(ddp(batch["views"][0].to(device)), batch["label"].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        val = evaluate(model[0], model[1], val_loader, device, nullcontext)
        metrics = {"top1": val["val/acc1"], "top5": val["val/acc5"]}
        if logger:
            logger.log({"step": step, "epoch": epoch, "finetune/loss": loss.item(), "finetune/acc1": metrics["top1"], "finetune/acc5": metrics["top5"]})
    return metrics | {
        "protocol": f"full fine-tuning, {f.epochs} epochs, SGD momentum 0.9 lr {f.lr} (cosine) weight decay "
        f"{f.weight_decay}, crops {list(f.crop_scale)} flip {f.hflip_prob}, global batch {sampler.global_batch}"
    }
