"""Full fine-tuning (main_linear.py finetune.enabled=true): the backbone and a linear head trained end to end on the
labelled train split by the pretraining trainer itself, as `method=supervised`. So fine-tuning has what pretraining
has: world-size invariance, checkpoints, bit-exact resume, preemption, any registered optimizer, any precision,
the metrics logger. Its run directory is `<evaluation run dir>/finetune`."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from solo.config import plain, validate_pretrain
from solo.distributed import DistEnv
from solo.train.trainer import Trainer

log = logging.getLogger("solo")


def finetune_config(cfg: DictConfig, backbone_cfg: dict, num_classes: int) -> DictConfig:
    """The pretraining config of the fine-tuning run: main_linear's `finetune` keys on its data and logger."""
    f = cfg.finetune
    crops = {"crop_scale": list(f.crop_scale), "hflip_prob": f.hflip_prob, "jitter_prob": 0.0, "grayscale_prob": 0.0}
    trainer = {
        "max_epochs": f.epochs,
        "precision": str(f.precision),
        "accumulate": f.accumulate,
        "seed": cfg.seed,
        "probe": False,
        "plots": False,
        "progress_bar": False,
        "resume": f.resume,
        "checkpoint_every_steps": f.checkpoint_every_steps,
        "log_every_steps": f.log_every_steps,
    }
    return validate_pretrain(
        OmegaConf.create(
            {
                "backbone": backbone_cfg,
                "method": {"name": "supervised", "num_classes": num_classes},
                "data": plain(cfg.data),
                "augmentation": {"views": [crops]},
                "optim": plain(f.optim),
                "logger": plain(cfg.logger),
                "trainer": trainer,
            }
        )
    )


def finetune(
    cfg: DictConfig,
    backbone: torch.nn.Module,
    backbone_cfg: dict,
    num_classes: int,
    run_dir: Path,
    env: DistEnv,
    device: torch.device,
) -> dict | None:
    """Fine-tune `backbone` (its weights the start) on cfg.data; {"acc1", "acc5", "protocol"} on the val split, or None when a
    preemption signal stopped it (a checkpoint is written: the same command resumes it)."""
    ft = finetune_config(cfg, backbone_cfg, num_classes)
    trainer = Trainer(ft, run_dir / "finetune", env, device, backbone=backbone)
    metrics = trainer.fit()
    if not trainer.finished:
        log.info("fine-tuning stopped before its end: run the same command to resume it")
        return None
    o = ft.optim
    return {
        "acc1": metrics["val/acc1"],
        "acc5": metrics["val/acc5"],
        "protocol": (
            f"full fine-tuning, {ft.trainer.max_epochs} epochs, {o.name} lr {trainer.lr:.4g} (cosine)"
            + (f" with layer decay {o.layer_decay}" if o.layer_decay is not None else "")
            + f", weight decay {o.weight_decay}, crops {list(cfg.finetune.crop_scale)} flip {cfg.finetune.hflip_prob}, global batch "
            f"{trainer.source.global_batch}, precision {ft.trainer.precision}"
        ),
    }
