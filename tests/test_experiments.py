"""Recipe presets in solo/configs/experiment/: each composes under the typed schema, picks the intended groups and carries
the cited numbers. Composition only (and one `--cfg job` subprocess), no training."""

from __future__ import annotations

import copy
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf
from torch import nn

import solo.config
from solo.config import PretrainConfig, validate_pretrain
from solo.data.views.transforms import ViewAugmentation, view_sizes
from solo.methods import METHODS
from solo.optim import LARS, param_groups

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "solo" / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))

# View tuples: (brightness, contrast, saturation, hue, jitter_prob, grayscale_prob, blur_prob, solarize_prob, crop min).
SIMCLR_CIFAR_VIEW = (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.0, 0.0, 0.08)  # strength 0.5, no blur (SimCLR B.9)
SIMCLR_IMAGENET_VIEW = (0.8, 0.8, 0.8, 0.2, 0.8, 0.2, 0.5, 0.0, 0.08)  # strength 1.0 + blur (SimCLR appendix A)
BT_CIFAR_VIEWS = [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.0, 0.08), (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.2, 0.08)]
BYOL_VIEWS = [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.08), (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.08)]
MOCOV3_VIEWS = [
    (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.2),
    (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.2),
]  # --crop-min=.2
VICREG_CIFAR_VIEWS = [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.1, 0.2)]  # solo-learn cifar/vicreg.yaml, count 2
SWAV_CIFAR_VIEWS = [(0.8, 0.8, 0.8, 0.2, 0.8, 0.2, 0.5, 0.0, 0.08)]  # solo-learn augmentations/symmetric.yaml, count 2
# Multi-crop: SwAV 2 x 224 (area 0.14-1) + 6 x 96 (0.05-0.14), strength-1 colour + blur 0.5 on every crop;
# DINO (README's ResNet-50 scales) 2 global BYOL-style crops + 8 x 96 local crops with blur 0.5.
SWAV_IMAGENET_VIEWS = [(0.8, 0.8, 0.8, 0.2, 0.8, 0.2, 0.5, 0.0, 0.14), (0.8, 0.8, 0.8, 0.2, 0.8, 0.2, 0.5, 0.0, 0.05)]
DINO_IMAGENET_VIEWS = [
    (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.14),
    (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.14),
    (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
]
# Per views entry: (size, count, crop max, hflip); recipes without "geometry" have 2 entries of one view each at
# data.image_size, crop area up to 1.0 and flip 0.5.
TWO_VIEWS = [(None, 1, 1.0, 0.5)] * 2
ONE_ENTRY_TWO_VIEWS = [(None, 2, 1.0, 0.5)]

_SIMCLR_CIFAR = {
    "method.name": "simclr",
    "backbone.name": "resnet18",
    "backbone.small_stem": True,
    "method.temperature": 0.2,
    "method.proj_hidden_dim": 2048,
    "method.proj_output_dim": 256,
    "data.batch_size": 256,
    "optim.name": "lars",
    "optim.lr": 0.4,
    "optim.lr_scaling": "linear",
    "optim.eta": 0.02,
    "optim.weight_decay": 1e-4,
    "optim.warmup_epochs": 10,
    "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000,
    "views": [SIMCLR_CIFAR_VIEW] * 2,
}
_BT_CIFAR = {
    "method.name": "barlow_twins",
    "backbone.name": "resnet18",
    "backbone.small_stem": True,
    "method.proj_hidden_dim": 2048,
    "method.proj_output_dim": 2048,
    "method.lambd": 0.0051,
    "method.scale_loss": 0.1,
    "data.batch_size": 256,
    "optim.name": "lars",
    "optim.lr": 0.3,
    "optim.lr_scaling": "linear",
    "optim.eta": 0.02,
    "optim.weight_decay": 1e-4,
    "optim.warmup_epochs": 10,
    "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000,
    "views": BT_CIFAR_VIEWS,
}
_SIMCLR_IMAGENET = {
    "method.name": "simclr",
    "backbone.name": "resnet50",
    "backbone.small_stem": False,
    "data.name": "imagefolder",
    "data.image_size": 224,
    "data.batch_size": 128,
    "method.temperature": 0.1,
    "method.proj_hidden_dim": 2048,
    "method.proj_output_dim": 128,
    "optim.name": "lars",
    "optim.lr": 0.3,
    "optim.lr_scaling": "linear",
    "optim.eta": 0.001,
    "optim.weight_decay": 1e-6,
    "optim.warmup_epochs": 10,
    "optim.final_lr": 0.0,
    "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 100,
    "views": [SIMCLR_IMAGENET_VIEW] * 2,
}
_BT_IMAGENET = {
    "method.name": "barlow_twins",
    "backbone.name": "resnet50",
    "backbone.small_stem": False,
    "data.name": "imagefolder",
    "data.image_size": 224,
    "data.batch_size": 64,
    "method.proj_hidden_dim": 8192,
    "method.proj_output_dim": 8192,
    "method.lambd": 0.0051,
    "method.scale_loss": 1.0,
    "optim.name": "lars",
    "optim.lr": 0.2,
    "optim.lr_scaling": "linear",
    "optim.eta": 0.001,
    "optim.weight_decay": 1.5e-6,
    "optim.warmup_epochs": 10,
    "optim.final_lr": 1.6e-3,
    "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000,
    "views": BYOL_VIEWS,
}

# solo-learn's CIFAR settings shared by its recipes (scripts/pretrain/cifar/*.yaml and its scheduler defaults).
_SOLO_LEARN_CIFAR = {
    "backbone.name": "resnet18",
    "backbone.small_stem": True,
    "data.name": "cifar10",
    "data.batch_size": 256,
    "optim.name": "lars",
    "optim.lr_scaling": "linear",
    "optim.eta": 0.02,
    "optim.warmup_epochs": 10,
    "optim.warmup_start_lr": 3e-5,
    "optim.final_lr": 0.0,
    "optim.exclude_bias_and_norm": True,
    "trainer.max_epochs": 1000,
}
_IMAGENET = {
    "backbone.name": "resnet50",
    "backbone.small_stem": False,
    "data.name": "imagefolder",
    "data.image_size": 224,
}

# LeJEPA's README: 2 x 224 px (area 0.3-1) + 6 x 98 px (0.05-0.3), one recipe for every crop; AdamW lr 5e-4 at batch
# 512, cosine to lr / 1000; lambda 0.05, 1024 directions, Epps-Pulley on [-3, 3] with 17 nodes of [0, 3].
_LEJEPA_VIEW = (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.2)
_LEJEPA = {
    "data.name": "imagefolder",
    "data.image_size": 224,
    "data.batch_size": 64,
    "method.name": "lejepa",
    "method.lambd": 0.05,
    "method.num_slices": 1024,
    "method.t_max": 3.0,
    "method.num_points": 17,
    "method.proj_hidden_dim": 2048,
    "method.proj_output_dim": 512,
    "optim.name": "adamw",
    "optim.lr": 5e-4,
    "optim.lr_scaling": "none",
    "optim.final_lr": 5e-7,
    "trainer.max_epochs": 100,
    "trainer.precision": "bf16",
    "views": [(*_LEJEPA_VIEW, 0.3), (*_LEJEPA_VIEW, 0.05)],
    "geometry": [(None, 2, 1.0, 0.5), (98, 6, 0.3, 0.5)],
    "view_sizes": [224, 224] + [98] * 6,
}

# SimCLR's views at strength 0.5 (solo/configs/augmentation/simclr.yaml), which FastSiam's 4 views and MACL's recipe use.
_SIMCLR_HALF_VIEW = (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.08)

# The cited numbers, per recipe (see each file's header for the source of each).
EXPECTED = {
    # FastSiam: 25 epochs at batch 32 on one GPU, 4 views; SimSiam's heads and SGD (lr 0.05 per 256, wd 1e-4).
    "fastsiam_imagenet": {
        **_IMAGENET,
        "method.name": "fastsiam",
        "method.pred_hidden_dim": 512,
        "data.batch_size": 32,
        "optim.name": "sgd",
        "optim.lr": 0.05,
        "optim.weight_decay": 1e-4,
        "trainer.max_epochs": 25,
        "views": [_SIMCLR_HALF_VIEW],
        "geometry": [(None, 4, 1.0, 0.5)],
    },
    # MACL on SimCLR: the authors' README's batch 256 and 800 epochs; SimCLR's LARS; lightly's t0, alpha, a0.
    "macl_imagenet": {
        **_IMAGENET,
        "method.name": "macl",
        "method.temperature": 0.1,
        "method.alpha": 0.5,
        "method.a0": 0.0,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-6,
        "trainer.max_epochs": 800,
        "views": [_SIMCLR_HALF_VIEW] * 2,
    },
    # VISReg: ViT-S/16, 4 global + 6 local crops, AdamW lr 9e-4, lambda 0.9, 2048 directions, 256-d projector output.
    "visreg_imagenet": {
        "data.name": "imagefolder",
        "data.image_size": 224,
        "backbone.name": "vit_small_patch16_224",
        "method.name": "visreg",
        "method.lambd": 0.9,
        "method.num_slices": 2048,
        "method.proj_output_dim": 256,
        "optim.name": "adamw",
        "optim.lr": 9e-4,
        "optim.lr_scaling": "none",
        "optim.weight_decay": 0.05,
        "optim.final_lr": 9e-7,
        "trainer.max_epochs": 100,
        "views": [(*_LEJEPA_VIEW, 0.3), (*_LEJEPA_VIEW, 0.05)],
        "geometry": [(None, 4, 1.0, 0.5), (96, 6, 0.3, 0.5)],
        "view_sizes": [224] * 4 + [96] * 6,
    },
    "simclr_cifar10": {**_SIMCLR_CIFAR, "data.name": "cifar10"},
    "simclr_cifar100": {**_SIMCLR_CIFAR, "data.name": "cifar100"},
    "barlow_twins_cifar10": {**_BT_CIFAR, "data.name": "cifar10"},
    "barlow_twins_cifar100": {**_BT_CIFAR, "data.name": "cifar100"},
    "simclr_imagenet": _SIMCLR_IMAGENET,
    "barlow_twins_imagenet": _BT_IMAGENET,
    "simclr_imagenet_resnet18": {
        **_SIMCLR_IMAGENET,
        "backbone.name": "resnet18",
        "optim.lr": 1.2,
        "optim.lr_scaling": "sqrt",
    },
    "barlow_twins_imagenet_resnet18": {
        **_BT_IMAGENET,
        "backbone.name": "resnet18",
        "data.batch_size": 128,
        "optim.final_lr": 2e-4,
    },
    # solo-learn cifar/byol.yaml
    "byol_cifar10": {
        **_SOLO_LEARN_CIFAR,
        "method.name": "byol",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.pred_hidden_dim": 4096,
        "method.base_momentum": 0.99,
        "method.final_momentum": 1.0,
        "optim.lr": 1.0,
        "optim.weight_decay": 1e-5,
        "optim.probe_lr": 0.1,
        "views": BT_CIFAR_VIEWS,
    },
    # BYOL (Grill et al. 2020) and byol/configs/byol.py's 1000-epoch preset
    "byol_imagenet": {
        **_IMAGENET,
        "method.name": "byol",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.pred_hidden_dim": 4096,
        "method.base_momentum": 0.996,
        "method.final_momentum": 1.0,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.2,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1.5e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 1000,
        "views": BYOL_VIEWS,
    },
    # SMoG: lightly's SMoG settings (3,000 groups, beta 0.99, temperature 0.1, regrouping every 300 steps); BYOL's
    # 300-epoch LARS preset and views.
    "smog_imagenet": {
        **_IMAGENET,
        "method.name": "smog",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.pred_hidden_dim": 2048,
        "method.num_groups": 3000,
        "method.group_momentum": 0.99,
        "method.temperature": 0.1,
        "method.regroup_every": 300,
        "method.base_momentum": 0.99,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 300,
        "views": BYOL_VIEWS,
    },
    # solo-learn cifar/mocov3.yaml
    "mocov3_cifar10": {
        **_SOLO_LEARN_CIFAR,
        "method.name": "mocov3",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.pred_hidden_dim": 4096,
        "method.temperature": 0.2,
        "method.base_momentum": 0.99,
        "method.final_momentum": 1.0,
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-6,
        "optim.probe_lr": 0.3,
        "views": BT_CIFAR_VIEWS,
    },
    # MoCo v3 (Chen et al. 2021), CONFIG.md's ResNet-50 1000-epoch setup
    "mocov3_imagenet": {
        **_IMAGENET,
        "method.name": "mocov3",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.pred_hidden_dim": 4096,
        "method.temperature": 1.0,
        "method.base_momentum": 0.996,
        "method.final_momentum": 1.0,
        "data.batch_size": 256,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1.5e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 1000,
        "views": MOCOV3_VIEWS,
    },
    # solo-learn cifar/vicreg.yaml
    "vicreg_cifar10": {
        **_SOLO_LEARN_CIFAR,
        "method.name": "vicreg",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 2048,
        "method.sim_coeff": 25.0,
        "method.std_coeff": 25.0,
        "method.cov_coeff": 1.0,
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-4,
        "optim.probe_lr": 0.1,
        "views": VICREG_CIFAR_VIEWS,
        "geometry": ONE_ENTRY_TWO_VIEWS,
    },
    # VICReg (Bardes et al. 2022) and main_vicreg.py
    "vicreg_imagenet": {
        **_IMAGENET,
        "method.name": "vicreg",
        "method.proj_hidden_dim": 8192,
        "method.proj_output_dim": 8192,
        "method.sim_coeff": 25.0,
        "method.std_coeff": 25.0,
        "method.cov_coeff": 1.0,
        "data.batch_size": 64,
        "optim.name": "lars",
        "optim.lr": 0.2,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1.6e-3,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 1000,
        "views": BYOL_VIEWS,
    },
    # VICRegL (Bardes et al. 2022), facebookresearch/VICRegL README's ResNet-50 SLURM command and main_vicregl.py
    "vicregl_imagenet": {
        **_IMAGENET,
        "method.name": "vicregl",
        "method.proj_hidden_dim": 8192,
        "method.proj_output_dim": 8192,
        "method.maps_hidden_dim": 512,
        "method.maps_output_dim": 512,
        "method.alpha": 0.75,
        "method.num_matches": [20, 4],
        "data.batch_size": 64,
        "optim.name": "lars",
        "optim.lr": 0.2,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1.6e-3,
        "trainer.max_epochs": 300,
        "views": BYOL_VIEWS,
    },
    # DetCon-S (Hénaff et al. 2021), the paper's sec. 3 and appendix A, google-deepmind/detcon's config: 1000 epochs
    "detcon_imagenet": {
        **_IMAGENET,
        "method.name": "detcon",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.temperature": 0.1,
        "method.grid": 4,
        "method.image_region": False,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 1000,
        "views": BYOL_VIEWS,
    },
    # SSL-EY (Chapman et al. 2023), jameschapman19/SSL-EY main_ssley.py: VICReg's script, 100 epochs
    "ssl_ey_imagenet": {
        **_IMAGENET,
        "method.name": "ssl_ey",
        "method.proj_hidden_dim": 8192,
        "method.proj_output_dim": 8192,
        "data.batch_size": 64,
        "optim.name": "lars",
        "optim.lr": 0.2,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1.6e-3,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 100,
        "views": BYOL_VIEWS,
    },
    # FroSSL (Skean et al. 2023), OFSkean/FroSSL scripts/pretrain/imagenet/frossl.yaml: ResNet-18, 2 GPUs x 256
    # tsb0601/EMP-SSL's ImageNet-100 command and main.py's defaults (batch 100, LARS eta 0.005, weight decay 1e-4)
    "emp_ssl_imagenet100": {
        "backbone.name": "resnet18",
        "backbone.small_stem": False,
        "data.name": "imagefolder",
        "data.image_size": 224,
        "method.name": "emp_ssl",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 1024,
        "method.tcr_eps": 0.2,
        "method.lambd": 200.0,
        "data.batch_size": 25,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.lr_scaling": "none",
        "optim.eta": 0.005,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 0,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 10,
        "views": [(0.4, 0.4, 0.4, 0.2, 0.8, 0.2, 0.1, 0.1, 0.25)],
        "geometry": [(None, 20, 0.25, 0.5)],
    },
    "frossl_imagenet_resnet18": {
        **_IMAGENET,
        "backbone.name": "resnet18",
        "method.name": "frossl",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 1024,
        "method.invariance_weight": 2.0,
        "data.batch_size": 256,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.02,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 100,
        "views": BYOL_VIEWS,
    },
    # solo-learn cifar/dino.yaml (+ its DINO defaults: teacher 0.07, student 0.1, no warm-up, freeze 1 epoch)
    "dino_cifar10": {
        **_SOLO_LEARN_CIFAR,
        "method.name": "dino",
        "method.proj_hidden_dim": 2048,
        "method.use_bn_in_head": False,
        "method.bottleneck_dim": 256,
        "method.num_prototypes": 4096,
        "method.student_temperature": 0.1,
        "method.teacher_temperature": 0.07,
        "method.warmup_teacher_temperature_epochs": 0.0,
        "method.center_momentum": 0.9,
        "method.base_momentum": 0.9995,
        "method.final_momentum": 1.0,
        "method.freeze_last_layer_epochs": 1.0,
        "optim.lr": 0.3,
        "optim.weight_decay": 1e-6,
        "optim.probe_lr": 0.1,
        "views": BT_CIFAR_VIEWS,
    },
    # DINO (Caron et al. 2021): the README's ResNet-50 command on main_dino.py's defaults
    "dino_imagenet": {
        **_IMAGENET,
        "method.name": "dino",
        "method.proj_hidden_dim": 2048,
        "method.use_bn_in_head": False,
        "method.bottleneck_dim": 256,
        "method.num_prototypes": 65536,
        "method.student_temperature": 0.1,
        "method.teacher_temperature": 0.04,
        "method.warmup_teacher_temperature": 0.04,
        "method.warmup_teacher_temperature_epochs": 0.0,
        "method.center_momentum": 0.9,
        "method.base_momentum": 0.996,
        "method.final_momentum": 1.0,
        "method.freeze_last_layer_epochs": 1.0,
        "data.batch_size": 64,
        "optim.name": "sgd",
        "optim.lr": 0.03,
        "optim.lr_scaling": "linear",
        "optim.momentum": 0.9,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 10,
        "optim.warmup_start_lr": 0.0,
        "optim.final_lr": 1e-6,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 100,
        "views": DINO_IMAGENET_VIEWS,
        "geometry": [(None, 1, 1.0, 0.5), (None, 1, 1.0, 0.5), (96, 8, 0.14, 0.5)],
        "view_sizes": [224, 224] + [96] * 8,
    },
    # DINOv2's ImageNet-1k setup (ssl_default_config.yaml + vitl16_short.yaml), Sinkhorn-Knopp centring
    # iBOT's README ViT-S/16 command over main_ibot.py's defaults
    "ibot_imagenet": {
        "backbone.name": "vit_small_patch16_224",
        "backbone.drop_path_rate": 0.1,
        "data.name": "imagefolder",
        "data.image_size": 224,
        "data.batch_size": 64,
        "method.name": "ibot",
        "method.centering": "centering",
        "method.num_prototypes": 8192,
        "method.patch_prototypes": 0,
        "method.teacher_temperature": 0.07,
        "method.patch_teacher_temperature": 0.07,
        "method.warmup_teacher_temperature_epochs": 30,
        "method.koleo_weight": 0.0,
        "method.mask_probability": 0.5,
        "method.mask_ratio_min": 0.1,
        "method.mask_ratio_max": 0.5,
        "method.base_momentum": 0.996,
        "optim.name": "adamw",
        "optim.lr": 5e-4,
        "optim.lr_scaling": "linear",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.4,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1e-6,
        "trainer.max_epochs": 800,
        "views": [
            (*DINO_IMAGENET_VIEWS[0][:8], 0.25),
            (*DINO_IMAGENET_VIEWS[1][:8], 0.25),
            (*DINO_IMAGENET_VIEWS[2][:8], 0.05),
        ],
        "geometry": [(None, 1, 1.0, 0.5), (None, 1, 1.0, 0.5), (96, 10, 0.25, 0.5)],
        "view_sizes": [224, 224] + [96] * 10,
    },
    "dinov2_imagenet": {
        "backbone.name": "vit_large_patch16_224",
        "backbone.drop_path_rate": 0.3,
        "backbone.kwargs.init_values": 1e-5,
        "data.name": "imagefolder",
        "data.image_size": 224,
        "method.name": "dinov2",
        "method.centering": "sinkhorn_knopp",
        "method.use_bn_in_head": False,
        "method.num_prototypes": 65536,
        "method.bottleneck_dim": 256,
        "method.proj_hidden_dim": 2048,
        "method.teacher_temperature": 0.07,
        "method.warmup_teacher_temperature": 0.04,
        "method.warmup_teacher_temperature_epochs": 30,
        "method.koleo_weight": 0.1,
        "method.ibot_weight": 1.0,
        "method.mask_probability": 0.5,
        "method.mask_ratio_min": 0.1,
        "method.mask_ratio_max": 0.5,
        "method.base_momentum": 0.992,
        "optim.name": "adamw",
        "optim.lr": 0.002,
        "optim.lr_scaling": "sqrt",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.4,
        "optim.layer_decay": 0.9,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1e-6,
        "trainer.max_epochs": 100,
        "views": [
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
        ],
        "geometry": [(None, 1, 1.0, 0.5), (None, 1, 1.0, 0.5), (96, 8, 0.32, 0.5)],
        "view_sizes": [224, 224] + [96] * 8,
    },
    # LightlyTrain's DINOv3.1 (dinov31.py's recipe): DINOv2 ViT-S/14 post-trained with PaKA at 518 px, weight decay
    # held at 0.04, 1,000 warm-up steps (1.08 epochs of COCO's 924 steps of 128); DINOv3.1's views (98 px locals)
    "dinov2_paka_coco": {
        "backbone.name": "vit_small_patch14_dinov2",
        "backbone.kwargs.patch_size": 14,
        "data.name": "imagefolder",
        "data.image_size": 518,
        "data.batch_size": 128,
        "method.name": "dinov2",
        "method.paka_weight": 1.0,
        "method.paka_locals": 8,
        "method.centering": "centering",
        "method.num_prototypes": 65536,
        "method.bottleneck_dim": 256,
        "method.teacher_temperature": 0.07,
        "method.warmup_teacher_temperature": 0.04,
        "method.warmup_teacher_temperature_epochs": 1.08,
        "method.koleo_weight": 0.1,
        "method.base_momentum": 0.992,
        "optim.name": "adamw",
        "optim.lr": 0.002,
        "optim.lr_scaling": "sqrt",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.04,
        "optim.warmup_epochs": 1.08,
        "trainer.max_epochs": 5,
        "views": [
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
            (0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.08),  # the clean renders: no colour (their box: shift_of)
            (0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.08),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
        ],
        "geometry": [
            (None, 1, 1.0, 0.5),
            (None, 1, 1.0, 0.5),
            (98, 8, 0.32, 0.5),
            (None, 1, 1.0, 0.0),
            (None, 1, 1.0, 0.0),
            (98, 4, 0.4, 0.5),
            (98, 4, 0.4, 0.5),
        ],
        "view_sizes": [518, 518] + [98] * 8 + [518, 518] + [98] * 8,
    },
    # valeoai/Franca's ViT-B/14 on ImageNet-21k: DINOv2's views with 98 px local crops (7 patches of 14 px a side)
    "franca_imagenet21k": {
        "backbone.name": "vit_base_patch14_dinov2",
        "backbone.drop_path_rate": 0.1,
        "backbone.kwargs.patch_size": 14,
        "backbone.kwargs.init_values": 1e-5,
        "data.name": "imagefolder",
        "data.image_size": 224,
        "data.batch_size": 32,
        "method.name": "franca",
        "method.nesting_levels": 5,
        "method.normalize_bottleneck": False,
        "method.centering": "sinkhorn_knopp",
        "method.use_bn_in_head": False,
        "method.num_prototypes": 131072,
        "method.patch_prototypes": 131072,
        "method.bottleneck_dim": 384,
        "method.proj_hidden_dim": 2048,
        "method.teacher_temperature": 0.07,
        "method.warmup_teacher_temperature": 0.04,
        "method.koleo_weight": 0.1,
        "method.ibot_weight": 1.0,
        "method.mask_probability": 0.5,
        "method.mask_ratio_min": 0.1,
        "method.mask_ratio_max": 0.65,
        "method.base_momentum": 0.994,
        "optim.name": "adamw",
        "optim.lr": 3.505e-4,
        "optim.lr_scaling": "sqrt",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.2,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 25,
        "optim.final_lr": 1e-6,
        "trainer.max_epochs": 156,
        "views": [
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 1.0, 0.0, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.1, 0.2, 0.32),
            (0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05),
        ],
        "geometry": [(None, 1, 1.0, 0.5), (None, 1, 1.0, 0.5), (98, 8, 0.32, 0.5)],
        "view_sizes": [224, 224] + [98] * 8,
    },
    # MAE PRETRAIN.md (ViT-B): one crop of area 0.2-1 with a flip, no colour (jitter_prob 0: its factors unused)
    "mae_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "backbone.kwargs.img_size": 224,
        "data.name": "imagefolder",
        "data.image_size": 224,
        "method.name": "mae",
        "method.mask_ratio": 0.75,
        "method.decoder_embed_dim": 512,
        "method.decoder_depth": 8,
        "method.decoder_heads": 16,
        "method.norm_pix_loss": True,
        "optim.name": "adamw",
        "optim.lr": 1.5e-4,
        "optim.lr_scaling": "linear",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.exclude_bias_and_norm": True,
        "optim.warmup_epochs": 40,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.2)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # CMAE's 300-epoch ViT-B pre-training config: its model, head, optimizer and schedule, and its views: the online
    # one without colour changes, the target one its box moved by up to 31 of 224 px, with colour, grey and blur.
    "cmae_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "data.image_size": 224,
        "data.batch_size": 128,
        "method.name": "cmae",
        "method.mask_ratio": 0.65,
        "method.decoder_embed_dim": 512,
        "method.decoder_depth": 8,
        "method.feature_decoder_depth": 2,
        "method.decoder_heads": 16,
        "method.norm_pix_loss": True,
        "method.proj_hidden_dim": 1536,
        "method.proj_output_dim": 256,
        "method.pred_hidden_dim": 1536,
        "method.temperature": 0.07,
        "method.contrastive_weight": 1.0,
        "method.base_momentum": 0.996,
        "method.final_momentum": 0.996,
        "optim.name": "adamw",
        "optim.lr": 1.5e-4,
        "optim.lr_scaling": "linear",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.warmup_epochs": 40,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 300,
        "augmentation.views.1.shift_of": 0,
        "augmentation.views.1.max_shift": 0.138,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.153), (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.08)],
        "geometry": [(None, 1, 0.766, 0.5), (None, 1, 1.0, 0.5)],
        "view_sizes": [224, 224],
    },
    # CrossMAE's README pre-training command (ViT-B, kept mask ratio 0.25, 12 decoder blocks) and MAE's optimizer.
    "crossmae_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "data.image_size": 224,
        "method.name": "crossmae",
        "method.mask_ratio": 0.75,
        "method.predict_ratio": 0.25,
        "method.decoder_embed_dim": 512,
        "method.decoder_depth": 12,
        "method.decoder_heads": 16,
        "method.norm_pix_loss": True,
        "optim.name": "adamw",
        "optim.lr": 1.5e-4,
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.warmup_epochs": 40,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.2)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # SimMIM simmim_pretrain__vit_base__img224__800ep.yaml and config.py (ViT-B): one crop of area 0.67-1 with a flip
    "simmim_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "backbone.kwargs.init_values": 0.1,
        "backbone.drop_path_rate": 0.1,
        "data.image_size": 224,
        "method.name": "simmim",
        "method.mask_ratio": 0.6,
        "method.mask_patch_size": 32,
        "optim.name": "adamw",
        "optim.lr": 5e-5,
        "optim.lr_scaling": "linear",
        "optim.betas": [0.9, 0.999],
        "optim.weight_decay": 0.05,
        "optim.warmup_epochs": 10,
        "optim.warmup_start_lr": 2e-6,
        "optim.final_lr": 2e-5,
        "optim.grad_clip": 5.0,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.67)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # CAPI default_pretrain_config.yaml (ViT-L/14, 16 registers): one crop of area 0.6-1 with a flip
    "capi_imagenet": {
        "backbone.name": "vit_large_patch14_224",
        "backbone.kwargs.patch_size": 14,
        "backbone.kwargs.reg_tokens": 16,
        "backbone.drop_path_rate": 0.2,
        "data.image_size": 224,
        "method.name": "capi",
        "method.num_prototypes": 16384,
        "method.predictor_depth": 12,
        "method.student_temperature": 0.12,
        "method.target_temperature": 0.06,
        "method.clustering_temperature": 0.12,
        "method.mask_ratio": 0.65,
        "method.prediction_subsampling": 0.05,
        "method.base_momentum": 0.999,
        "optim.name": "adamw",
        "optim.lr": 1e-3,
        "optim.lr_scaling": "none",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.1,
        "trainer.max_epochs": 6400,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.6)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # AIM-0.6B (ml-aim's aim_600M trunk; the paper's pre-training hyperparameters): one crop of area 0.4-1 with a flip
    "aim_imagenet": {
        "backbone.name": "vit_large_patch14_224",
        "backbone.kwargs.patch_size": 14,
        "backbone.kwargs.embed_dim": 1536,
        "backbone.kwargs.depth": 24,
        "backbone.kwargs.num_heads": 12,
        "backbone.kwargs.class_token": False,
        "data.image_size": 224,
        "method.name": "aim",
        "method.head_width": 2048,
        "method.head_depth": 12,
        "method.norm_pix_loss": True,
        "optim.name": "adamw",
        "optim.lr": 1e-3,
        "optim.lr_scaling": "none",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 1600,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.4)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # NEPA's ViT-B/14 with LayerScale and QK-Norm; MAE's optimisation and views (the paper's settings unread)
    # valeoai/Franca's rasa_dito.yml: VOC at 518 px, 128 images, 9 stages of 5 epochs, AdamW 2e-4 without decay
    "rasa_voc": {
        "backbone.name": "vit_base_patch14_dinov2",
        "backbone.kwargs.patch_size": 14,
        "backbone.remove_positions": True,
        "data.image_size": 518,
        "data.batch_size": 128,
        "method.name": "rasa",
        "method.stages": 9,
        "optim.name": "adamw",
        "optim.lr": 2e-4,
        "optim.final_lr": 2e-4,
        "optim.lr_scaling": "none",
        "optim.weight_decay": 0.0,
        "trainer.max_epochs": 45,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.2)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [518],
    },
    "nepa_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 14,
        "backbone.kwargs.init_values": 1e-5,
        "data.image_size": 224,
        "method.name": "nepa",
        "optim.name": "adamw",
        "optim.lr": 3e-4,
        "optim.lr_scaling": "linear",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.warmup_epochs": 40,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 1600,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.08)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # fairseq's v2 base_images_only_task: 16 inverse block masks per image, the conv decoder, MAE's views
    "data2vec2_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "data.image_size": 224,
        "data.batch_size": 16,
        "method.name": "data2vec2",
        "method.mask_ratio": 0.8,
        "method.mask_block": 3,
        "method.masks_per_image": 16,
        "method.average_top_k_layers": 10,
        "method.decoder_dim": 768,
        "method.decoder_layers": 6,
        "method.decoder_groups": 16,
        "method.class_weight": 2.56,
        "method.base_momentum": 0.9998,
        "method.final_momentum": 0.99999,
        "optim.name": "adamw",
        "optim.lr": 1e-3,
        "optim.lr_scaling": "none",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.05,
        "optim.grad_clip": 4.0,
        "optim.warmup_epochs": 10,
        "trainer.max_epochs": 75,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.2)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # SALT's stage 2 on I-JEPA's masks and predictor, stable-pretraining's optimisation; the teacher required
    "salt_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.patch_size": 16,
        "data.image_size": 224,
        "data.batch_size": 32,
        "method.name": "salt",
        "method.predictor_embed_dim": 384,
        "method.predictor_depth": 12,
        "method.num_targets": 4,
        "method.loss": "l1",
        "optim.name": "adamw",
        "optim.lr": 6.25e-4,
        "optim.lr_scaling": "none",
        "optim.betas": [0.9, 0.95],
        "optim.weight_decay": 0.04,
        "optim.warmup_epochs": 10,
        "trainer.max_epochs": 400,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.3)],
        "geometry": [(None, 1, 1.0, 0.0)],
        "view_sizes": [224],
    },
    # data2vec_vision's README, ViT-B for 800 epochs: BEiT's views with a colour jitter of 0.4, always
    "data2vec_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.drop_path_rate": 0.25,
        "backbone.kwargs.init_values": 1e-4,
        "data.image_size": 224,
        "data.batch_size": 128,
        "method.name": "data2vec",
        "method.mask_ratio": 0.613,
        "method.min_mask_block": 16,
        "method.average_top_k_layers": 6,
        "method.loss_beta": 2.0,
        "method.base_momentum": 0.999,
        "method.final_momentum": 0.9998,
        "optim.name": "adamw",
        "optim.lr": 2e-3,
        "optim.lr_scaling": "none",
        "optim.weight_decay": 0.05,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 10,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.4, 0.0, 1.0, 0.0, 0.0, 0.0, 0.08)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # BEiT's run_beit_pretraining.py with the README's command and the paper's 800 epochs: one crop of area 0.08-1
    # with a flip, no colour
    "beit_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "backbone.kwargs.init_values": 0.1,
        "data.image_size": 224,
        "data.batch_size": 128,
        "method.name": "beit",
        "method.mask_ratio": 0.383,
        "method.min_mask_block": 16,
        "method.vocab_size": 8192,
        "optim.name": "adamw",
        "optim.lr": 1.875e-4,
        "optim.lr_scaling": "linear",
        "optim.betas": [0.9, 0.98],
        "optim.weight_decay": 0.05,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 1e-5,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.08)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # SlowFast's in1k_VIT_B_MaskFeat_PT.yaml: one crop of area 0.5-1 with a flip, no colour
    "maskfeat_imagenet": {
        "backbone.name": "vit_base_patch16_224",
        "data.image_size": 224,
        "data.batch_size": 32,
        "method.name": "maskfeat",
        "method.mask_ratio": 0.4,
        "method.min_mask_block": 16,
        "method.hog_cell": 8,
        "method.hog_bins": 9,
        "optim.name": "adamw",
        "optim.lr": 2e-4,
        "optim.lr_scaling": "linear",
        "optim.weight_decay": 0.05,
        "optim.grad_clip": 0.02,
        "optim.warmup_epochs": 30,
        "optim.final_lr": 1e-6,
        "trainer.max_epochs": 300,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.5)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # I-JEPA configs/in1k_vith14_ep300.yaml: one crop of area 0.3-1, no flip, no colour
    "ijepa_imagenet": {
        "backbone.name": "vit_huge_patch14_224",
        "backbone.kwargs.patch_size": 14,
        "data.image_size": 224,
        "method.name": "ijepa",
        "method.predictor_embed_dim": 384,
        "method.predictor_depth": 12,
        "method.num_targets": 4,
        "method.target_scale_min": 0.15,
        "method.target_scale_max": 0.2,
        "method.target_aspect_min": 0.75,
        "method.target_aspect_max": 1.5,
        "method.context_scale_min": 0.85,
        "method.context_scale_max": 1.0,
        "method.min_context_patches": 10,
        "method.base_momentum": 0.996,
        "method.final_momentum": 1.0,
        "method.loss": "smooth_l1",  # the official code's F.smooth_l1_loss
        "optim.name": "adamw",
        "optim.lr": 1.0e-3,
        "optim.lr_scaling": "none",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.4,
        "optim.warmup_epochs": 40,
        "optim.warmup_start_lr": 2.0e-4,
        "optim.final_lr": 1.0e-6,
        "trainer.max_epochs": 300,
        "trainer.precision": "bf16",
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.3)],
        "geometry": [(None, 1, 1.0, 0.0)],
        "view_sizes": [224],
    },
    # LeJEPA (Balestriero and LeCun 2025): the README's GOTO hyperparameters, ViT-L/14 as in its scripts/
    "lejepa_imagenet": {
        **_LEJEPA,
        "backbone.name": "vit_large_patch14_224",
        "backbone.kwargs.patch_size": 14,
        "backbone.drop_path_rate": 0.1,
        "optim.weight_decay": 5e-2,
    },
    # ... and for ResNets, whose weight decay is 5e-4
    "lejepa_imagenet_resnet50": {**_LEJEPA, "backbone.name": "resnet50", "optim.weight_decay": 5e-4},
    # solo-learn cifar/swav.yaml (+ its SwAV defaults: epsilon 0.05, 3 Sinkhorn iterations), its queue of 3840 from
    # epoch 50
    "swav_cifar10": {
        **_SOLO_LEARN_CIFAR,
        "method.name": "swav",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.num_prototypes": 3000,
        "method.temperature": 0.1,
        "method.epsilon": 0.05,
        "method.sinkhorn_iterations": 3,
        "method.freeze_prototypes_epochs": 2.0,
        "method.queue_size": 3840,
        "method.queue_start_epochs": 50.0,
        "optim.lr": 0.6,
        "optim.weight_decay": 1e-6,
        "optim.probe_lr": 0.1,
        "views": SWAV_CIFAR_VIEWS,
        "geometry": ONE_ENTRY_TWO_VIEWS,
    },
    # SwAV (Caron et al. 2020), scripts/swav_800ep_pretrain.sh
    "swav_imagenet": {
        **_IMAGENET,
        "method.name": "swav",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.num_prototypes": 3000,
        "method.temperature": 0.1,
        "method.epsilon": 0.05,
        "method.sinkhorn_iterations": 3,
        "method.freeze_prototypes_epochs": 1.0,
        "data.batch_size": 64,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.exclude_bias_and_norm": False,
        "optim.warmup_epochs": 10,
        "optim.warmup_start_lr": 0.3,
        "optim.final_lr": 4.8e-3,
        "trainer.max_epochs": 800,
        "views": SWAV_IMAGENET_VIEWS,
        "geometry": [(None, 2, 1.0, 0.5), (96, 6, 0.14, 0.5)],
        "view_sizes": [224, 224] + [96] * 6,
    },
    # DCL (Yeh et al. 2022): SimCLR's setting at batch 256, 200 epochs; the optimizer as lightly's benchmark
    # (benchmarks/imagenet/resnet50/dcl.py): LARS at SimCLR's 0.075 x sqrt(batch), weight decay 1e-6
    "dcl_imagenet": {
        **_IMAGENET,
        "method.name": "dcl",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.temperature": 0.1,
        "method.weight_fn": "none",
        "method.sigma": 0.5,
        "data.batch_size": 32,
        "optim.name": "lars",
        "optim.lr": 1.2,
        "optim.lr_scaling": "sqrt",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 200,
        "views": [SIMCLR_IMAGENET_VIEW] * 2,
    },
    # MMCR (Yerxa et al. 2023), ThomasYerxa/mmcr pretrain_imagenet.py --n_aug 2 --objective MMCR: projector
    # 8192-8192-512, lambda 0, LARS lr 0.8 x batch/256 at 2048, weight decay 1e-6, cosine to 1/1000, 100 epochs
    "mmcr_imagenet": {
        **_IMAGENET,
        "method.name": "mmcr",
        "method.proj_hidden_dim": 8192,
        "method.proj_output_dim": 512,
        "method.lambd": 0.0,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.8,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 6.4e-3,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 100,
        "views": BYOL_VIEWS,
    },
    # TiCo (Zhu et al. 2022): beta 0.9, rho 8, head 4096 -> 256, teacher 0.99 -> 1, on BYOL's optimizer and views
    # (lightly's benchmarks/imagenet/resnet50/tico.py; byol/configs/byol.py's 1000-epoch preset)
    "tico_imagenet": {
        **_IMAGENET,
        "method.name": "tico",
        "method.proj_hidden_dim": 4096,
        "method.proj_output_dim": 256,
        "method.beta": 0.9,
        "method.rho": 8.0,
        "method.base_momentum": 0.99,
        "method.final_momentum": 1.0,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.2,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1.5e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 1000,
        "views": BYOL_VIEWS,
    },
    # DirectCLR (Jing et al. 2022), facebookresearch/directclr main.py --mode directclr --dim 360: LARS lr 4.8 at
    # batch 4096, weight decay 1e-6, 10 warm-up epochs, cosine to 1/1000, 100 epochs, BYOL's views
    "directclr_imagenet": {
        **_IMAGENET,
        "method.name": "directclr",
        "method.d0": 360,
        "method.temperature": 0.1,
        "data.batch_size": 128,
        "optim.name": "lars",
        "optim.lr": 0.3,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 4.8e-3,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 100,
        "views": BYOL_VIEWS,
    },
    # Alignment and uniformity (Wang and Isola 2020), SsnL/moco@align_uniform README's best ImageNet-100 run:
    # 3 x L_align(alpha 2) + L_uniform(t 3), SGD lr 0.03 per 128, weight decay 1e-4, cosine, 200 epochs, MoCo v2's
    # views; solo's loss is theirs / 3 (lambd 1/3), so its lr is 3 x theirs and its weight decay theirs / 3
    "align_uniform_imagenet100": {
        **_IMAGENET,
        "method.name": "align_uniform",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.align_alpha": 2.0,
        "method.uniform_t": 3.0,
        "method.lambd": 1 / 3,
        "data.batch_size": 32,
        "optim.name": "sgd",
        "optim.lr": 3 * 0.03 * 256 / 128,
        "optim.lr_scaling": "linear",
        "optim.momentum": 0.9,
        "optim.weight_decay": 1e-4 / 3,
        "optim.warmup_epochs": 0.0,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": False,
        "trainer.max_epochs": 200,
        "views": [(0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.2)] * 2,
    },
    # DenseCL: WXinlong/DenseCL densecl_imagenet_200ep.py: MoCo v2's queue, temperature and momentum, loss_lambda 0.5,
    # SGD lr 0.03 at 256, weight decay 1e-4, cosine, 200 epochs, MoCo v2's views
    "densecl_imagenet": {
        **_IMAGENET,
        "method.name": "densecl",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 128,
        "method.queue_size": 65536,
        "method.temperature": 0.2,
        "method.dense_weight": 0.5,
        "method.momentum": 0.999,
        "data.batch_size": 32,
        "optim.name": "sgd",
        "optim.lr": 0.03,
        "optim.lr_scaling": "linear",
        "optim.momentum": 0.9,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 0.0,
        "optim.final_lr": 0.0,
        "optim.exclude_bias_and_norm": False,
        "trainer.max_epochs": 200,
        "views": [(0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.2)] * 2,
    },
    # PIRL: VISSL's pirl_jigsaw_4node_resnet.yaml: a bank of 128-d embeddings with momentum 0.5, temperature 0.07, the
    # two losses 0.5 each; SGD lr 0.12 at 1,024 (0.03 per 256), weight decay 1e-4 off BatchNorm and biases, cosine to
    # 0.00012, 800 epochs; the image crop of area 0.08-1 and the jigsaw's of 0.6-1, jitter 0.4/0.4/0.4/0.2 always
    "pirl_imagenet": {
        **_IMAGENET,
        "method.name": "pirl",
        "method.proj_output_dim": 128,
        "method.temperature": 0.07,
        "method.jigsaw_weight": 0.5,
        "method.bank_momentum": 0.5,
        "data.batch_size": 32,
        "optim.name": "sgd",
        "optim.lr": 0.03,
        "optim.lr_scaling": "linear",
        "optim.momentum": 0.9,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 0.0,
        "optim.final_lr": 0.00012,
        "optim.exclude_bias_and_norm": True,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.4, 0.2, 1.0, 0.2, 0.0, 0.0, 0.08), (0.4, 0.4, 0.4, 0.2, 1.0, 0.2, 0.0, 0.0, 0.6)],
    },
    # VCReg: cross-entropy plus each block's variance and covariance terms (alpha 0.16, beta 0.01); torchvision's
    # ResNet-50 schedule (SGD lr 0.1 per 256, wd 1e-4, 90 epochs), one supervised view (crops 0.08-1, flips).
    "vcreg_imagenet": {
        **_IMAGENET,
        "method.name": "vcreg",
        "method.num_classes": 0,
        "method.var_weight": 0.16,
        "method.cov_weight": 0.01,
        "data.batch_size": 32,
        "optim.name": "sgd",
        "optim.lr": 0.1,
        "optim.lr_scaling": "linear",
        "optim.momentum": 0.9,
        "optim.weight_decay": 1e-4,
        "optim.warmup_epochs": 0.0,
        "optim.final_lr": 0.0,
        "trainer.max_epochs": 90,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.08)],
        "geometry": [(None, 1, 1.0, 0.5)],
    },
    # LightlyTrain's distillation (lightly-train _methods/distillationv2): DINOv2 ViT-B/14 teacher, MSE, one Linear
    # layer, LARS lr 1.5 x batch/256, weight decay 1e-6, clipping 1.0, cosine to 1/1000; DistillationV2Transform's view
    "distill_imagenet": {
        **_IMAGENET,
        "method.name": "distill",
        "method.teacher": "vit_base_patch14_dinov2.lvd142m",
        "method.teacher_kwargs.img_size": 224,
        "method.loss": "mse",
        "method.proj_hidden_dim": 0,
        "method.patch_weight": 0.0,
        "data.batch_size": 16,
        "optim.name": "lars",
        "optim.lr": 1.5,
        "optim.lr_scaling": "linear",
        "optim.eta": 0.001,
        "optim.weight_decay": 1e-6,
        "optim.exclude_bias_and_norm": True,
        "optim.grad_clip": 1.0,
        "optim.warmup_epochs": 10,
        "optim.final_lr": 7.5e-4,
        "trainer.max_epochs": 100,
        "views": [(0.4, 0.4, 0.2, 0.1, 0.8, 0.2, 0.0, 0.0, 0.14)],
        "geometry": [(None, 1, 1.0, 0.5)],
        "view_sizes": [224],
    },
    # facebookresearch/msn configs/pretrain/msn_vits16.yaml and src/msn_train.py (its momentum's end over 1.25 x the
    # run), views from src/data_manager.py make_transforms
    "msn_imagenet": {
        "backbone.name": "vit_small_patch16_224",
        "backbone.drop_path_rate": 0.0,
        "data.image_size": 224,
        "data.batch_size": 64,
        "method.name": "msn",
        "method.proj_hidden_dim": 2048,
        "method.proj_output_dim": 256,
        "method.num_prototypes": 1024,
        "method.temperature": 0.1,
        "method.sharpen": 0.25,
        "method.sinkhorn_iterations": 3,
        "method.regularisation_weight": 1.0,
        "method.mask_ratio": 0.15,
        "method.base_momentum": 0.996,
        "method.final_momentum": 0.9992,
        "optim.name": "adamw",
        "optim.lr": 1.0e-3,
        "optim.lr_scaling": "none",
        "optim.weight_decay": 0.04,
        "optim.weight_decay_end": 0.4,
        "optim.grad_clip": 3.0,
        "optim.warmup_epochs": 15,
        "optim.warmup_start_lr": 2.0e-4,
        "optim.final_lr": 1.0e-6,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.3), (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05)],
        "geometry": [(None, 2, 1.0, 0.5), (96, 10, 0.3, 0.5)],
        "view_sizes": [224, 224] + [96] * 10,
    },
    # MSN's recipe with lightly's power-law prior (PMSNLoss: exponent 0.25)
    "pmsn_imagenet": {
        "backbone.name": "vit_small_patch16_224",
        "method.name": "pmsn",
        "method.power_law_exponent": 0.25,
        "method.regularisation_weight": 1.0,
        "method.num_prototypes": 1024,
        "method.final_momentum": 0.9992,
        "optim.lr": 1.0e-3,
        "trainer.max_epochs": 800,
        "views": [(0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.3), (0.4, 0.4, 0.4, 0.1, 0.8, 0.2, 0.5, 0.0, 0.05)],
        "geometry": [(None, 2, 1.0, 0.5), (96, 10, 0.3, 0.5)],
        "view_sizes": [224, 224] + [96] * 10,
    },
}
# CLIP (Radford et al. 2021, sec. 2.5, appendix F): AdamW beta2 0.98, weight decay 0.2, lr 5e-4 for RN50,
# text Transformer 512 wide, 12 layers, 8 heads, context 77, embedding 1024 for RN50, 32 epochs.
CLIP_EXPECTED = {
    "method.name": "clip",
    "backbone.name": "resnet50",
    "data.name": "csv",
    "optim.name": "adamw",
    "optim.lr": 5e-4,
    "optim.weight_decay": 0.2,
    "optim.betas": [0.9, 0.98],
    "method.embed_dim": 1024,
    "method.text.width": 512,
    "method.text.depth": 12,
    "method.text.heads": 8,
    "method.text.context_length": 77,
    "method.init_logit_scale": 1 / 0.07,
    "method.max_logit_scale": 100.0,
    "trainer.max_epochs": 32,
}


# SigLIP (Zhai et al. 2023): t' = log 10 (t = 10), b = -10, beta2 0.95, lr 1e-3, decoupled weight decay 1e-4 (0.1 in
# torch's lr-coupled AdamW at lr 1e-3), no augmentation; the towers and epochs follow the CLIP recipe (a choice).
SIGLIP_EXPECTED = {
    "method.name": "siglip",
    "backbone.name": "resnet50",
    "data.name": "csv",
    "data.image_size": 224,
    "optim.name": "adamw",
    "optim.lr": 1e-3,
    "optim.lr_scaling": "none",
    "optim.weight_decay": 1e-4 / 1e-3,
    "optim.betas": [0.9, 0.95],
    "optim.grad_clip": 1.0,
    "method.init_logit_scale": 10.0,
    "method.init_bias": -10.0,
    "method.embed_dim": 1024,
    "method.text.width": 512,
    "method.text.depth": 12,
    "method.text.heads": 8,
    "method.text.context_length": 77,
    "trainer.max_epochs": 32,
}


# LiT (Zhai et al. 2022; the authors' big_vision lit_coco.py and LiT-B16B_2): the AugReg ViT-B/16 of ImageNet-21k
# locked, no image head (its 768-wide class token the embedding), a BERT-Base-sized text tower, the global batch of
# 4096, Adam lr 1e-3, decoupled weight decay 1e-2 (10 in torch's lr-coupled AdamW at lr 1e-3), clipping at 1.0, logit
# scale 10, 60,000 steps.
LIT_EXPECTED = {
    "method.name": "lit",
    "method.teacher": "vit_base_patch16_224.augreg_in21k",
    "method.image_head": False,
    "method.loss": "clip",
    "method.init_logit_scale": 10.0,
    "method.text.width": 768,
    "method.text.depth": 12,
    "method.text.heads": 12,
    "data.name": "csv",
    "data.image_size": 224,
    "optim.name": "adamw",
    "optim.lr": 1e-3,
    "optim.lr_scaling": "none",
    "optim.weight_decay": 1e-2 / 1e-3,
    "optim.betas": [0.9, 0.999],
    "optim.grad_clip": 1.0,
    "trainer.max_steps": 60000,
}


def _check_numbers(cfg, expected: dict, name: str = "") -> None:
    for key, value in expected.items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-9), f"{name}: {key} = {got}, expected {value}"
        elif isinstance(value, list):
            assert list(got) == value, f"{name}: {key} = {got}, expected {value}"
        else:
            assert got == value, f"{name}: {key} = {got!r}, expected {value!r}"


def test_siglip_recipe_cited_numbers():
    cfg = _compose("experiment=siglip_csv_resnet50")
    _check_numbers(cfg, SIGLIP_EXPECTED, "siglip_csv_resnet50")
    (view,) = cfg.augmentation.views  # one view per pair, the whole image resized: no augmentation
    assert list(view.crop_scale) == [1.0, 1.0] and view.count == 1
    assert all(view[k] == 0.0 for k in ("hflip_prob", "jitter_prob", "grayscale_prob", "blur_prob", "solarize_prob"))
    assert math.log(cfg.method.init_logit_scale) == pytest.approx(math.log(10))  # the paper's t' = log 10


def test_lit_recipe_cited_numbers():
    cfg = _compose("experiment=lit_csv_vitb16")
    _check_numbers(cfg, LIT_EXPECTED, "lit_csv_vitb16")
    assert 8 * cfg.data.batch_size == 4096  # the authors' global batch on the recipe's 8 processes
    # 3% of the steps of warm-up, at CC12M's ~12.4M pairs per epoch of 4096
    assert cfg.optim.warmup_epochs * 12_400_000 / 4096 == pytest.approx(0.03 * 60000, rel=0.05)


def test_clip_recipe_cited_numbers():
    cfg = _compose("experiment=clip_csv_resnet50")
    for key, value in CLIP_EXPECTED.items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-9), key
        elif isinstance(value, list):
            assert list(got) == value, key
        else:
            assert got == value, key


# What a recipe cannot run without and leaves to the command line: the weights that RASA post-trains.
GIVEN = {"experiment=rasa_voc": ("trainer.init_from=/runs/franca_imagenet21k",)}


def _compose(*overrides: str):
    """The validated config, a copy of this worker's first composition of it: several tests read each recipe."""
    return copy.deepcopy(_composed(overrides + tuple(o for given in overrides for o in GIVEN.get(given, ()))))


@functools.cache
def _composed(overrides: tuple[str, ...]):
    solo.config.register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return validate_pretrain(compose("pretrain", overrides=list(overrides)))


def _view_tuple(v) -> tuple:
    return (
        v.brightness,
        v.contrast,
        v.saturation,
        v.hue,
        v.jitter_prob,
        v.grayscale_prob,
        v.blur_prob,
        v.solarize_prob,
        v.crop_scale[0],
    )


def test_every_documented_recipe_is_on_disk():
    missing = set(EXPECTED) - set(EXPERIMENTS)
    assert not missing, f"recipes checked here but absent from solo/configs/experiment: {sorted(missing)}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_header_names_global_package_and_cites_a_source(name):
    lines = (CONFIGS / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert lines[0].strip() == "# @package _global_", "experiments override several groups, so they live at the root"
    header = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert len(header) >= 3, "the leading comment must cite the recipe's source"
    assert ("et al." in text or " and " in text) and any(str(year) in text for year in range(2020, 2027)), text


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_composes_under_the_typed_schema(name):
    cfg = _compose(f"experiment={name}")
    for key in ("base_momentum", "final_momentum", "center_momentum"):  # teacher momenta are fractions
        if key in cfg.method:
            assert 0.0 <= cfg.method[key] <= 1.0, (key, cfg.method[key])
    if "base_momentum" in cfg.method:
        assert cfg.method.base_momentum <= cfg.method.final_momentum
    missing = OmegaConf.missing_keys(cfg)
    assert missing <= {"data.root", "data.file"}, f"unset mandatory keys: {missing}"
    if missing:
        for key in missing:
            OmegaConf.update(cfg, key, "/datasets/imagenet")
    obj = OmegaConf.to_object(cfg)  # every key checked against solo.config's dataclasses
    assert isinstance(obj, PretrainConfig)
    assert type(obj.method) is METHODS[obj.method.name].schema  # typed by the named method's registered schema
    for view in obj.augmentation.views:
        assert isinstance(view, ViewAugmentation)
        view.validate()
    sizes = view_sizes(obj.augmentation.views, obj.data.image_size)
    if obj.method.name in ("clip", "siglip"):  # image-text: one view per pair
        assert sizes == [obj.data.image_size]
    else:  # the method's global views at data.image_size, then (multi-crop methods only) smaller local crops
        count = METHODS[obj.method.name].target.num_views
        assert sizes[:count] == [obj.data.image_size] * count
        local = sizes[count:]
        if obj.method.name in ("emp_ssl", "fastsiam"):  # any number of views, all of one size (their check_data)
            assert set(local) <= {obj.data.image_size}, sizes
        else:
            assert not local or METHODS[obj.method.name].target.local_crops, sizes
            paka = 2 + obj.method.paka_locals if getattr(obj.method, "paka_locals", 0) else 0  # DINOv3.1's views last
            assert all(s < obj.data.image_size for s in local[: len(local) - paka]), sizes
    assert obj.optim.lr_scaling in ("linear", "sqrt", "none")
    assert obj.optim.warmup_epochs < obj.trainer.max_epochs
    assert name.startswith(obj.method.name), "recipe files are named <method>_<dataset>[_<backbone>]"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cited_numbers(name):
    cfg = _compose(f"experiment={name}")
    expected = dict(EXPECTED[name])
    views = expected.pop("views")
    geometry = expected.pop("geometry", None)
    sizes = expected.pop("view_sizes", None)
    for key, value in expected.items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        if isinstance(value, float):
            assert math.isclose(got, value, rel_tol=1e-9), f"{name}: {key} = {got}, expected {value}"
        else:
            assert got == value, f"{name}: {key} = {got!r}, expected {value!r}"
    assert [_view_tuple(v) for v in cfg.augmentation.views] == views
    if geometry is None:
        assert [(v.size, v.count) for v in cfg.augmentation.views] == [(None, 1)] * 2
        for v in cfg.augmentation.views:  # the crop's lower bound is in the view tuples
            assert v.crop_scale[1] == 1.0 and v.hflip_prob == 0.5
    else:
        assert [(v.size, v.count, v.crop_scale[1], v.hflip_prob) for v in cfg.augmentation.views] == geometry
    if sizes is not None:
        assert view_sizes(cfg.augmentation.views, cfg.data.image_size) == sizes


def test_global_learning_rates_match_the_papers():
    """Scaled as the training loop does it (solo.optim.scaled_lr) at the papers' global batches."""
    from solo.optim import scaled_lr

    simclr = _compose("experiment=simclr_imagenet").optim
    assert math.isclose(scaled_lr(simclr, 4096), 4.8)  # SimCLR sec. 2.3: 0.3 x 4096/256
    sqrt_rule = _compose("experiment=simclr_imagenet_resnet18").optim
    assert math.isclose(scaled_lr(sqrt_rule, 4096), 4.8)  # 0.075 x sqrt(4096), appendix B.1
    assert math.isclose(scaled_lr(sqrt_rule, 256), 0.075 * math.sqrt(256))
    bt = _compose("experiment=barlow_twins_imagenet").optim
    assert math.isclose(scaled_lr(bt, 2048), 1.6)  # Barlow Twins sec. 2.2: 0.2 x 2048/256
    assert math.isclose(bt.final_lr, scaled_lr(bt, 2048) / 1000)  # decayed by a factor of 1000
    bt18 = _compose("experiment=barlow_twins_imagenet_resnet18").optim
    assert math.isclose(bt18.final_lr, scaled_lr(bt18, 256) / 1000)
    cifar = _compose("experiment=simclr_cifar10").optim
    assert math.isclose(scaled_lr(cifar, 256), 0.4)


def test_new_methods_global_learning_rates_match_the_papers():
    """The peak (and, where the recipe sets one, final) lr at each reference run's global batch."""
    from solo.optim import scaled_lr

    byol = _compose("experiment=byol_imagenet").optim
    assert math.isclose(scaled_lr(byol, 4096), 3.2)  # BYOL: 0.2 x 4096/256
    moco = _compose("experiment=mocov3_imagenet").optim
    assert math.isclose(scaled_lr(moco, 4096), 4.8)  # MoCo v3 1000 epochs: --lr=.3 x 4096/256
    vicreg = _compose("experiment=vicreg_imagenet").optim
    assert math.isclose(scaled_lr(vicreg, 2048), 1.6)  # VICReg: 0.2 x 2048/256
    assert math.isclose(vicreg.final_lr, scaled_lr(vicreg, 2048) / 1000)  # end_lr = base_lr x 0.001
    swav = _compose("experiment=swav_imagenet").optim
    assert math.isclose(scaled_lr(swav, 4096), 4.8)  # --base_lr 4.8 at 64 x 64
    assert math.isclose(swav.final_lr, 0.0048) and math.isclose(swav.warmup_start_lr, 0.3)
    dino = _compose("experiment=dino_imagenet").optim
    assert math.isclose(scaled_lr(dino, 512), 0.06)  # --lr 0.03 x (8 x 64)/256
    franca = _compose("experiment=franca_imagenet21k").optim
    assert math.isclose(scaled_lr(franca, 2048), 7.01e-4 * math.sqrt(2))  # base_lr 7.01e-4, sqrt_wrt_1024, at 2048
    pirl = _compose("experiment=pirl_imagenet").optim
    assert math.isclose(scaled_lr(pirl, 1024), 0.12) and math.isclose(pirl.final_lr, 0.12 / 1000)  # VISSL's values
    for recipe, lr in (("byol", 1.0), ("mocov3", 0.3), ("vicreg", 0.3), ("dino", 0.3), ("swav", 0.6)):
        assert math.isclose(scaled_lr(_compose(f"experiment={recipe}_cifar10").optim, 256), lr), recipe


def test_issue45_recipes_global_learning_rates_match_their_sources():
    """dcl, mmcr, tico, directclr, align_uniform and distill: the peak (and final) lr at each source's global batch."""
    from solo.optim import scaled_lr

    dcl = _compose("experiment=dcl_imagenet").optim
    for batch in (256, 1024):  # SimCLR appendix B.1's 0.075 x sqrt(batch), as lightly's DCL benchmark
        assert math.isclose(scaled_lr(dcl, batch), 0.075 * math.sqrt(batch))
    mmcr = _compose("experiment=mmcr_imagenet").optim
    assert math.isclose(scaled_lr(mmcr, 2048), 6.4)  # --lr 0.8 x 2048/256
    assert math.isclose(mmcr.final_lr, scaled_lr(mmcr, 2048) / 1000)  # composer's alpha_f=0.001
    tico = _compose("experiment=tico_imagenet").optim
    assert math.isclose(scaled_lr(tico, 4096), 3.2)  # BYOL: 0.2 x 4096/256
    directclr = _compose("experiment=directclr_imagenet").optim
    assert math.isclose(scaled_lr(directclr, 4096), 4.8)  # main.py --learning-rate 4.8 at --batch-size 4096
    assert math.isclose(directclr.final_lr, 4.8 * 0.001)  # end_lr = base_lr x 0.001
    distill = _compose("experiment=distill_imagenet").optim
    assert math.isclose(scaled_lr(distill, 128), 1.5 * 128 / 256)  # DistillationV2LARSArgs lr x batch/256
    assert math.isclose(distill.final_lr, scaled_lr(distill, 128) / 1000)  # CosineWarmupScheduler end_value=0.001
    au = _compose("experiment=align_uniform_imagenet100")
    # Three times the authors' loss, lr and weight decay: --lr 0.03 at --batch-size 128, --wd 1e-4, weights 3 and 1.
    assert math.isclose(scaled_lr(au.optim, 128), 3 * 0.03)
    assert math.isclose(3 * au.optim.weight_decay, 1e-4) and math.isclose(3 * au.method.lambd, 1.0)


def test_command_line_overrides_beat_the_experiment():
    cfg = _compose("experiment=simclr_cifar10", "backbone=resnet50", "method.temperature=0.5", "data.batch_size=64")
    assert (
        cfg.backbone.name == "resnet50" and cfg.backbone.small_stem is True
    )  # the experiment's small_stem still applies
    assert cfg.method.temperature == 0.5 and cfg.data.batch_size == 64


def test_no_experiment_keeps_the_plain_defaults():
    cfg = _compose()
    assert cfg.data.name == "digits" and cfg.method.name == "simclr"


def test_unknown_experiment_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as info:
        _compose("experiment=no_such_recipe")
    message = str(info.value)
    assert "experiment/no_such_recipe" in message
    assert "Available options in 'experiment'" in message
    for name in EXPERIMENTS:
        assert name in message


@pytest.mark.slow
@pytest.mark.one_process
def test_cli_prints_the_composed_config():
    out = subprocess.run(
        [sys.executable, "main_pretrain.py", "experiment=simclr_cifar10", "--cfg", "job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    printed = OmegaConf.create(out.stdout)
    assert printed.method.name == "simclr" and printed.method.temperature == 0.2
    assert printed.data.name == "cifar10" and printed.backbone.small_stem is True
    assert printed.optim.lr == 0.4 and printed.trainer.max_epochs == 1000


# ------------------------------------------------------------------ a claim made in barlow_twins_imagenet.yaml


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).double()


def _train(model, optimizer, loss_scale, steps=6):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 5, generator=g, dtype=torch.float64)
        y = torch.randn(16, 3, generator=g, dtype=torch.float64)
        optimizer.zero_grad()
        (loss_scale * (model(x) - y).pow(2).sum()).backward()
        optimizer.step()
    return model


def test_scale_loss_with_scaled_decay_equals_a_separate_bias_lr():
    """method.scale_loss=s with optim.weight_decay=wd*s reproduces, under our LARS, a bias/norm lr of s x the weights'
    lr at weight decay wd (the Barlow Twins paper's 0.0048 vs 0.2 with s = 0.024)."""
    lr, wd, s, eta = 1.6, 1.5e-6, 0.0048 / 0.2, 0.001
    a, b = _tiny_model(), _tiny_model()
    a0 = copy.deepcopy(a.state_dict())
    b.load_state_dict(a0)
    opt_a = LARS(param_groups(a, wd * s), lr=lr, weight_decay=wd * s, eta=eta)
    groups = param_groups(b, wd)
    assert [g["lars_exclude"] for g in groups] == [False, True]
    groups[1]["lr"] = lr * s  # the paper's separate lr for biases and norm parameters
    opt_b = LARS(groups, lr=lr, weight_decay=wd, eta=eta)
    _train(a, opt_a, loss_scale=s)
    _train(b, opt_b, loss_scale=1.0)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-10, atol=1e-12, msg=name)
    # Without the trick (one lr for all, as barlow_twins_imagenet runs by default) the biases/norm params move
    # differently, so the comparison above is not vacuous.
    c = _tiny_model()
    c.load_state_dict(a0)
    _train(c, LARS(param_groups(c, wd), lr=lr, weight_decay=wd, eta=eta), loss_scale=1.0)
    assert not torch.allclose(c[0].bias, b[0].bias)


def test_a_loss_divided_by_three_with_three_times_the_lr_and_a_third_of_the_weight_decay_is_the_same_sgd():
    """align_uniform_imagenet100's claim: solo's loss (alignment + uniformity / 3) is the authors' 3 x alignment +
    uniformity divided by 3, and SGD with momentum at 3 x their lr and 1/3 of their weight decay (on every parameter)
    then takes their steps exactly."""
    from solo.optim import SGDConfig, build_optimizer

    lr, wd, s = 0.03, 1e-4, 1 / 3
    theirs, ours = _tiny_model(), _tiny_model()
    start = copy.deepcopy(theirs.state_dict())
    ours.load_state_dict(start)

    def sgd(model, lr, wd):
        cfg = SGDConfig(name="sgd", lr=lr, weight_decay=wd, momentum=0.9, exclude_bias_and_norm=False)
        return build_optimizer(cfg, param_groups(model, wd, exclude_bias_and_norm=False), lr)

    _train(theirs, sgd(theirs, lr, wd), loss_scale=1.0)
    _train(ours, sgd(ours, lr / s, wd * s), loss_scale=s)
    for (name, a), b in zip(theirs.named_parameters(), ours.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # The loss divided by 3 alone (the authors' lr and weight decay kept) trains differently.
    other = _tiny_model()
    other.load_state_dict(start)
    _train(other, sgd(other, lr, wd), loss_scale=s)
    assert not torch.allclose(other[0].weight, theirs[0].weight)
