"""Structured-config schemas: every option is typed here; the YAML files under configs/ only set values.

Each group file names its schema in its defaults list (`- /schema/method/simclr@_here_`), so Hydra
rejects a misspelt key or a wrong type with the key's full name, and lists the options of a group
when one is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from solo.data.transforms import ViewAugmentation
from solo.eval.linear import LinearProtocol


@dataclass
class BackboneConfig:
    name: str = "resnet18"  # a timm model name, or torchvision.resnet18 / torchvision.resnet50 / ...
    small_stem: bool = False  # 3x3 stride-1 first conv and no max-pool, for 32px-sized images
    pretrained: bool = False
    kwargs: Dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model


@dataclass
class MethodConfig:
    name: str = MISSING


@dataclass
class SimCLRConfig(MethodConfig):
    name: str = "simclr"
    proj_hidden_dim: int = 2048
    proj_output_dim: int = 128
    temperature: float = 0.2


@dataclass
class BarlowTwinsConfig(MethodConfig):
    name: str = "barlow_twins"
    proj_hidden_dim: int = 2048
    proj_output_dim: int = 2048
    lambd: float = 0.0051
    scale_loss: float = 1.0


@dataclass
class TextConfig:
    """CLIP's text tower: a Transformer over byte tokens, pooled at the end-of-text token."""

    width: int = 512
    depth: int = 12
    heads: int = 8
    context_length: int = 77  # tokens, start and end included; longer captions are truncated (and counted)
    causal: bool = True


@dataclass
class CLIPConfig(MethodConfig):
    name: str = "clip"
    embed_dim: int = 512
    init_logit_scale: float = 14.285714285714286  # 1 / 0.07, as in CLIP
    max_logit_scale: float = 100.0
    text: TextConfig = field(default_factory=TextConfig)


@dataclass
class DataConfig:
    name: str = "digits"  # digits | synthetic | cifar10 | cifar100 | imagefolder | csv (image-text)
    root: Optional[str] = None
    file: Optional[str] = None  # csv only: the captions file, may contain {split}, relative paths from root
    download: bool = False
    image_size: int = 16
    batch_size: int = 128  # per process; the global batch is batch_size x world size
    num_workers: int = 2
    num_samples: int = 1000  # synthetic only
    num_classes: int = 10  # synthetic only


@dataclass
class AugmentationConfig:
    views: List[ViewAugmentation] = field(default_factory=lambda: [ViewAugmentation(), ViewAugmentation()])


@dataclass
class OptimConfig:
    name: str = "lars"  # lars | sgd | adamw
    lr: float = 0.3  # for a global batch of 256 under lr_scaling=linear
    lr_scaling: str = "linear"  # linear (lr x global_batch / 256) | sqrt (lr x sqrt(global_batch / 256)) | none
    weight_decay: float = 1e-6
    momentum: float = 0.9
    eta: float = 0.02  # LARS trust coefficient
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW
    exclude_bias_and_norm: bool = True
    warmup_epochs: float = 1.0
    warmup_start_lr: float = 0.0
    final_lr: float = 0.0
    grad_clip: Optional[float] = None  # max global gradient norm
    probe_lr: float = 0.1  # online linear probe (no weight decay, not LARS-adapted)


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    max_steps: int = -1  # > 0 stops there (and sets the schedule's length)
    seed: int = 0
    precision: str = "32"  # 32 | bf16 | 16 (CUDA only, with a gradient scaler) | 64 (for exactness checks)
    sync_batchnorm: bool = True  # global-batch BatchNorm statistics when W > 1
    channels_last: bool = True  # CUDA only
    resume: bool = True  # continue from <run dir>/checkpoints/last.pt when it exists
    checkpoint_every_steps: int = 0  # 0: only at epoch ends
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGUSR1", "SIGTERM"])  # checkpoint, requeue, exit
    requeue: bool = True  # under SLURM, `scontrol requeue` the job after a preemption checkpoint
    keep_checkpoints: int = 2
    log_every_steps: int = 10
    probe: bool = True  # online linear probe on detached backbone features (needs labels)
    knn_k: int = 0  # > 0: online weighted k-NN val accuracy each epoch (cosine, k neighbours; needs labels)
    knn_temperature: float = 0.07
    plots: bool = True  # at the end: curves.png from metrics.jsonl, embedding.png of val features (labels)
    progress_bar: bool = True


@dataclass
class LoggerConfig:
    name: str = "jsonl"  # jsonl | wandb (metrics.jsonl is always written)
    project: str = "solo"
    entity: Optional[str] = None
    mode: str = "auto"  # auto (online with credentials, else offline) | online | offline


@dataclass
class PretrainConfig:
    backbone: BackboneConfig = MISSING
    method: MethodConfig = MISSING
    data: DataConfig = MISSING
    augmentation: AugmentationConfig = MISSING
    optim: OptimConfig = MISSING
    logger: LoggerConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class KNNConfig:
    k: int = 20
    temperature: float = 0.07  # votes weighted by exp(cosine / temperature)


@dataclass
class FinetuneConfig:
    enabled: bool = False
    epochs: int = 10
    lr: float = 0.01  # SGD momentum 0.9, cosine to 0, for backbone and head
    weight_decay: float = 1e-4
    crop_scale: List[float] = field(default_factory=lambda: [0.4, 1.0])
    hflip_prob: float = 0.0


@dataclass
class LinearEvalConfig:
    pretrained: str = MISSING  # zoo name, solo .safetensors file, training checkpoint .pt, or pretraining run dir
    random_init: bool = False  # the same architecture freshly initialised: the baseline the weights must beat
    seed: int = 0
    feature_cache: bool = True  # features under $SOLO_CACHE/features (default ~/.cache/solo), keyed by weights + data
    plots: bool = True  # embedding.png (val features, 2-D) and curves.png in the run dir
    data: DataConfig = MISSING
    logger: LoggerConfig = MISSING
    linear: LinearProtocol = field(default_factory=LinearProtocol)  # its seed is ${seed} (linear.yaml)
    knn: KNNConfig = field(default_factory=KNNConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


SCHEMAS = {
    "backbone": {"default": BackboneConfig},
    "method": {"simclr": SimCLRConfig, "barlow_twins": BarlowTwinsConfig, "clip": CLIPConfig},
    "text": {"default": TextConfig},
    "data": {"default": DataConfig},
    "augmentation": {"default": AugmentationConfig},
    "optim": {"default": OptimConfig},
    "logger": {"default": LoggerConfig},
}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=PretrainConfig)
    cs.store(name="linear_schema", node=LinearEvalConfig)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
