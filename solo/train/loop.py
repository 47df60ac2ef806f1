"""The pretraining loop, written out: build, resume, train, validate, checkpoint."""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from tqdm import tqdm

from solo.backbones import create_backbone
from solo.data import (
    ANY_SIZE_DATASETS,
    EvalDataset,
    ImageTextDataset,
    MultiViewDataset,
    ZeroShotEvalDataset,
    build_eval_transform,
    build_split,
    build_view_transform,
    dataset_stats,
)
from solo.data.sampler import GlobalBatchSampler
from solo.distributed import DistEnv
from solo.distributed.env import process_group
from solo.distributed.batchnorm import convert_sync_batchnorm
from solo.eval.features import extract_features
from solo.eval.knn import knn_accuracy
from solo.eval.plots import plot_curves, plot_embedding
from solo.eval.probe import evaluate
from solo.eval.zero_shot import class_embeddings, class_prompts, evaluate_image_text
from solo.losses import NonFiniteError
from solo.losses._checks import full_precision
from solo.methods import METHODS, build_method
from solo.train.checkpoint import Checkpoints
from solo.train.metrics import MetricsLogger
from solo.text import ByteTokenizer
from solo.train.optim import build_optimizer, param_groups, warmup_cosine
from solo.train.preemption import Preemption, requeue_slurm_job


class TrainingDiverged(RuntimeError):
    pass


class PretrainModel(nn.Module):
    """The method and its online linear probe, trained together under one DDP wrapper."""

    def __init__(self, method: nn.Module, num_classes: int | None):
        super().__init__()
        self.method = method
        self.probe = None
        if num_classes:
            # Standardised features, as for MAE's linear probing: the probe's lr need not track the feature scale.
            self.probe = nn.Sequential(
                nn.BatchNorm1d(method.feature_dim, affine=False), nn.Linear(method.feature_dim, num_classes)
            )

    def forward(self, batch: dict) -> dict:
        out = self.method(batch)
        if self.probe is not None:
            logits = self.probe(out["features"].detach())  # the probe must not shape the representation
            out["probe_loss"] = F.cross_entropy(full_precision(logits), out["labels"])
        return out


def pretrain(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Run (or resume) the pretraining described by `cfg` in `run_dir`; returns the last metrics."""
    with process_group() as (env, device):
        return _pretrain(cfg, Path(run_dir), env, device)


def _pretrain(cfg: DictConfig, run_dir: Path, env: DistEnv, device: torch.device) -> dict:
    t = cfg.trainer
    say = print if env.is_main else (lambda *a, **k: None)
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    autocast, scaler = _precision(t.precision, device)

    train_loader, val_loader, train_eval_loader, num_classes = build_loaders(cfg, env, device)
    sampler: GlobalBatchSampler = train_loader.batch_sampler
    model = build_model(cfg, num_classes if t.probe else None)
    if env.world_size > 1 and t.sync_batchnorm:
        model = convert_sync_batchnorm(model)
    channels_last = t.channels_last and device.type == "cuda"
    dtype = torch.float64 if t.precision == "64" else torch.float32
    model.to(device, dtype=dtype, memory_format=torch.channels_last if channels_last else torch.preserve_format)
    ddp = model
    if env.world_size > 1:
        # Buffers need no broadcast: with SyncBatchNorm every rank computes the same running statistics.
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None, broadcast_buffers=False
        )

    global_batch = sampler.global_batch
    lr = scaled_lr(cfg.optim, global_batch)
    optimizer = build_model_optimizer(model, cfg.optim, lr)
    steps_per_epoch = len(sampler)
    total_steps = t.max_steps if t.max_steps > 0 else t.max_epochs * steps_per_epoch
    warmup_steps = min(round(cfg.optim.warmup_epochs * steps_per_epoch), total_steps)
    schedule = partial(
        warmup_cosine,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        base_lr=lr,
        warmup_start_lr=cfg.optim.warmup_start_lr,
        final_lr=cfg.optim.final_lr,
    )

    checkpoints = Checkpoints(run_dir / "checkpoints", t.keep_checkpoints)
    step, epoch, batch_in_epoch = 0, 0, 0
    state = checkpoints.load() if t.resume else None
    if state is None and not t.resume and checkpoints.last.exists():
        raise RuntimeError(
            f"{checkpoints.last} exists and trainer.resume=false: choose a new hydra.run.dir or delete {run_dir}"
        )
    if state is not None:
        step, epoch, batch_in_epoch = _restore(state, model, optimizer, scaler, global_batch, cfg.optim.name)
        say(f"resuming from {checkpoints.last} at step {step} (epoch {epoch}, batch {batch_in_epoch})")

    logger = None
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        logger = MetricsLogger(run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True), step if state else None)
    say(
        f"world size {env.world_size}, global batch {global_batch} ({cfg.data.batch_size} per process), "
        f"lr {cfg.optim.lr} x {cfg.optim.lr_scaling} scaling = {lr:.4g}, {steps_per_epoch} steps per epoch, "
        f"{total_steps} steps, run dir {run_dir}"
    )

    def save() -> None:
        if env.is_main:
            checkpoints.save(_state(model, optimizer, scaler, step, epoch, batch_in_epoch, global_batch, cfg), step)
        if env.world_size > 1:
            dist.barrier()  # nobody runs ahead (or exits) while the checkpoint is still being written

    preemption = Preemption(list(t.preempt_signals), device)
    last_metrics: dict = {}
    bar = tqdm(total=total_steps, initial=step, disable=not (env.is_main and t.progress_bar), dynamic_ncols=True)
    window_start, window_steps = time.perf_counter(), 0
    window_losses = torch.zeros(2, dtype=torch.float64, device=device)
    while step < total_steps:
        sampler.set_epoch(epoch, batch_in_epoch)
        for batch in train_loader:
            for group in optimizer.param_groups:
                group["lr"] = schedule(step) * group.get("lr_scale", 1.0)
            out = _train_step(ddp, model, _to_device(batch, device, dtype, channels_last), optimizer, scaler, autocast, cfg.optim)
            window_losses += torch.stack([out["loss"].detach(), out.get("probe_loss", out["loss"]).detach()]).double()
            step, batch_in_epoch, window_steps = step + 1, batch_in_epoch + 1, window_steps + 1
            bar.update(1)
            if step % t.log_every_steps == 0 or step == total_steps:
                losses = _mean_over_ranks(window_losses / window_steps)
                elapsed = time.perf_counter() - window_start
                last_metrics = {
                    "step": step,
                    "epoch": epoch,
                    "train/loss": losses[0],
                    "lr": schedule(step - 1),
                    "train/img_per_s": global_batch * window_steps / elapsed,
                }
                if model.probe is not None:
                    last_metrics["train/probe_loss"] = losses[1]
                if "logit_scale" in out:
                    last_metrics["train/logit_scale"] = float(out["logit_scale"])
                if logger:
                    logger.log(last_metrics)
                bar.set_postfix(loss=f"{losses[0]:.4f}", img_s=f"{last_metrics['train/img_per_s']:.0f}")
                window_start, window_steps = time.perf_counter(), 0
                window_losses.zero_()
            if preemption.requested() and step < total_steps:
                save()
                say(f"{preemption.received or 'a signal on another rank'}: checkpoint written at step {step}")
                if env.is_main and t.requeue:
                    say(requeue_slurm_job() or "not under SLURM: restart the same command to resume")
                bar.close()
                if logger:
                    logger.close()
                return last_metrics
            if t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0 and batch_in_epoch < steps_per_epoch:
                save()
            if step == total_steps:
                break
        if batch_in_epoch == steps_per_epoch or step == total_steps:
            val = None
            if val_loader is not None and model.method.inputs == "image_text":
                val = evaluate_image_text(
                    model.method, model.probe, _zero_shot_classifier(model.method, val_loader.dataset, cfg.data.name, device),
                    val_loader, device, autocast,
                )
            elif val_loader is not None and model.probe is not None:
                val = evaluate(model.method.backbone, model.probe, val_loader, device, autocast)
            if t.knn_k > 0 and train_eval_loader is not None:
                val = (val or {}) | _knn_metrics(model.method.backbone, train_eval_loader, val_loader, num_classes, t, device, autocast)
            if val:
                last_metrics = {"step": step, "epoch": epoch, **val}
                if logger:
                    logger.log(last_metrics)
                say(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in val.items()))
            if batch_in_epoch == steps_per_epoch:
                epoch, batch_in_epoch = epoch + 1, 0
            save()
    bar.close()
    if t.plots:
        _plot_run(run_dir, model.method.backbone, val_loader if num_classes else None, env, device, autocast, logger)
    if state is not None and state["step"] == total_steps:
        say(f"nothing to do: {checkpoints.last} already holds the finished run ({total_steps} steps)")
    if logger:
        logger.close()
    return last_metrics


def _train_step(ddp, model, batch, optimizer, scaler, autocast, optim_cfg) -> dict:
    try:
        with autocast():
            out = ddp(batch)
    except NonFiniteError as e:
        raise TrainingDiverged(_diverged_message(str(e))) from e
    loss = out["loss"] + out.get("probe_loss", 0.0)
    if not bool(torch.isfinite(loss)):
        raise TrainingDiverged(_diverged_message(f"the loss is {float(loss)}"))
    scaler.scale(loss).backward()
    if optim_cfg.grad_clip:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), optim_cfg.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return out


def _zero_shot_classifier(method, val_set, data_name: str, device):
    """Class embeddings from the class prompts, or None when the val pairs have no classes."""
    classes = val_set.pairs.classes
    if not classes:
        return None
    prompts = class_prompts(data_name, classes)
    return class_embeddings(method, prompts, val_set.tokenizer, device, method.log_logit_scale.dtype)


def _knn_metrics(backbone, train_loader, val_loader, num_classes, t, device, autocast) -> dict:
    train = extract_features(backbone, train_loader, device, autocast)
    val = extract_features(backbone, val_loader, device, autocast)
    knn = knn_accuracy(*train, *val, num_classes, t.knn_k, t.knn_temperature)
    return {"val/knn_acc1": knn["top1"], "val/knn_acc5": knn["top5"]}


def _plot_run(run_dir, backbone, val_loader, env, device, autocast, logger) -> None:
    """curves.png from metrics.jsonl and, with labelled val data, embedding.png of the val features."""
    if val_loader is not None:
        features, labels = extract_features(backbone, val_loader, device, autocast)  # every rank takes part
        if env.is_main:
            plot_embedding(features.numpy(), labels.numpy(), run_dir / "embedding.png", val_loader.dataset.classes, title=run_dir.name)
    if logger is not None and logger.path.exists():
        plot_curves(logger.path, run_dir / "curves.png")


def _diverged_message(what: str) -> str:
    return (
        f"training diverged: {what}. Stopped before writing any checkpoint from this step, so "
        "checkpoints/last.pt is the last good state; lower optim.lr, set optim.grad_clip, or use trainer.precision=32"
    )


def _mean_over_ranks(x: torch.Tensor) -> list[float]:
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x.tolist()


def _precision(precision: str, device: torch.device):
    if precision == "32":
        return nullcontext, torch.amp.GradScaler(device.type, enabled=False)
    if precision == "bf16":
        return partial(torch.autocast, device.type, dtype=torch.bfloat16), torch.amp.GradScaler(device.type, enabled=False)
    if precision == "64":  # for checking exactness (world-size invariance to ~1e-12), not for training speed
        return nullcontext, torch.amp.GradScaler(device.type, enabled=False)
    if precision == "16":
        if device.type != "cuda":
            raise ValueError("trainer.precision=16 needs a GPU; on the CPU use trainer.precision=bf16 or 32")
        return partial(torch.autocast, "cuda", dtype=torch.float16), torch.amp.GradScaler("cuda")
    raise ValueError(f"trainer.precision must be 32, bf16, 16 or 64, got {precision!r}")


def scaled_lr(optim_cfg, global_batch: int) -> float:
    rule = optim_cfg.lr_scaling
    if rule == "linear":
        return optim_cfg.lr * global_batch / 256
    if rule == "sqrt":
        return optim_cfg.lr * math.sqrt(global_batch / 256)
    if rule == "none":
        return optim_cfg.lr
    raise ValueError(f"optim.lr_scaling must be linear, sqrt or none, got {rule!r}")


def build_model(cfg: DictConfig, num_classes: int | None) -> PretrainModel:
    b = cfg.backbone
    backbone, width = create_backbone(b.name, small_stem=b.small_stem, pretrained=b.pretrained, **b.kwargs)
    hparams = {k: v for k, v in cfg.method.items() if k != "name"}
    return PretrainModel(build_method(cfg.method.name, backbone, width, **hparams), num_classes)


def build_model_optimizer(model: PretrainModel, optim_cfg, lr: float):
    groups = param_groups(model.method, optim_cfg.weight_decay, exclude_bias_and_norm=optim_cfg.exclude_bias_and_norm)
    if model.probe is not None:
        groups.append(
            {"params": list(model.probe.parameters()), "weight_decay": 0.0, "lars_exclude": True, "lr_scale": optim_cfg.probe_lr / optim_cfg.lr}
        )
    return build_optimizer(
        optim_cfg.name,
        groups,
        lr=lr,
        weight_decay=optim_cfg.weight_decay,
        momentum=optim_cfg.momentum,
        betas=tuple(optim_cfg.betas),
        eta=optim_cfg.eta,
    )


def build_loaders(cfg: DictConfig, env: DistEnv, device: torch.device):
    """Train loader (a GlobalBatchSampler over per-sample seeded data), val loader or None, the train split
    with the eval transform for the online k-NN (trainer.knn_k > 0) or None, class count or None."""
    d = cfg.data
    image_text = METHODS[cfg.method.name].inputs == "image_text"

    # One rank downloads; the others read what it wrote.
    if d.download and env.world_size > 1 and not env.is_main:
        dist.barrier()
    train_base, val_base = (build_split(d, split, cfg.trainer.seed, pairs=image_text) for split in ("train", "val"))
    if d.download and env.world_size > 1 and env.is_main:
        dist.barrier()

    mean, std = dataset_stats(d.name)
    views = [build_view_transform(v, d.image_size, mean, std) for v in cfg.augmentation.views]
    eval_transform = build_eval_transform(d.image_size, mean, std, resize=d.name in ANY_SIZE_DATASETS)
    if image_text:  # one view per image: the first of the augmentation's views
        tokenizer = ByteTokenizer(cfg.method.text.context_length)
        train_set = ImageTextDataset(train_base, views[0], tokenizer, seed=cfg.trainer.seed)
    else:
        train_set = MultiViewDataset(train_base, views, seed=cfg.trainer.seed)
    sampler = GlobalBatchSampler(len(train_set), d.batch_size, env.rank, env.world_size, cfg.trainer.seed)
    loader_args = dict(num_workers=d.num_workers, pin_memory=device.type == "cuda", persistent_workers=d.num_workers > 0)
    train_loader = DataLoader(train_set, batch_sampler=sampler, **loader_args)

    num_classes = len(train_base.classes) if train_base.classes else None
    val_loader = train_eval_loader = None
    if image_text and val_base is not None:  # retrieval needs no labels; zero-shot and the probe do
        val_set = ZeroShotEvalDataset(val_base, eval_transform, tokenizer)
    elif val_base is not None and num_classes:
        val_set = EvalDataset(val_base, eval_transform)
    if val_base is not None and (image_text or num_classes):
        shard = list(range(env.rank, len(val_set), env.world_size))
        val_loader = DataLoader(val_set, batch_size=d.batch_size, sampler=shard, **loader_args)
    if cfg.trainer.knn_k > 0 and val_loader is not None and num_classes:  # the k-NN's train features: no augmentation
        shard = list(range(env.rank, len(train_base), env.world_size))
        train_eval_loader = DataLoader(EvalDataset(train_base, eval_transform), batch_size=d.batch_size, sampler=shard, **loader_args)
    return train_loader, val_loader, train_eval_loader, num_classes


def _to_device(batch: dict, device: torch.device, dtype: torch.dtype, channels_last: bool) -> dict:
    fmt = torch.channels_last if channels_last else torch.preserve_format

    def move(x):
        if isinstance(x, list):
            return [move(v) for v in x]
        if x.is_floating_point():
            return x.to(device, dtype, non_blocking=True, memory_format=fmt if x.dim() == 4 else torch.preserve_format)
        return x.to(device, non_blocking=True)

    return {k: move(v) for k, v in batch.items()}


def _state(model, optimizer, scaler, step, epoch, batch_in_epoch, global_batch, cfg) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "step": step,
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "global_batch": global_batch,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
        },
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def _restore(state: dict, model, optimizer, scaler, global_batch: int, optimizer_name: str) -> tuple[int, int, int]:
    if state["config"]["optim"]["name"] != optimizer_name:
        raise RuntimeError(
            f"the checkpoint was trained with optim={state['config']['optim']['name']}, this run asks for "
            f"optim={optimizer_name}: resume with the same optimizer, or start a new run dir"
        )
    if state["global_batch"] != global_batch:
        raise RuntimeError(
            f"the checkpoint was trained with a global batch of {state['global_batch']}, this run has {global_batch}: "
            "keep data.batch_size x world size the same to resume (any world size works), or start a new run dir"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    if torch.cuda.is_available() and state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    random.setstate(state["rng"]["python"])
    return state["step"], state["epoch"], state["batch_in_epoch"]
