"""Structured-config schemas: every option is typed here; the YAML files under configs/ only set values.

`configs/pretrain.yaml` is composed under `PretrainConfig`, so Hydra rejects a misspelt key or a wrong
type with the key's full name and lists the options of a group when one is unknown. The `method` group
is typed by the schema its method was registered with (see solo.methods), which `validate_pretrain`
applies after composition, together with the keys added with `+` that no schema knows, the names of
registered things (datasets, optimizers, loggers) and what the method needs from the data.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from solo.data.transforms import ViewAugmentation
from solo.errors import ConfigError
from solo.eval.linear import LinearProtocol


class Choice(str, Enum):
    """A fixed set of strings; YAML and the command line give `32` as an int, so values match as strings."""

    @classmethod
    def _missing_(cls, value):
        return cls._value2member_map_.get(str(value))

    def __str__(self) -> str:
        return self.value


def choices(name: str, *values: str) -> type[Choice]:
    return Choice(name, {v: v for v in values})


# 16: CUDA only, with a gradient scaler; 64: for exactness checks, not for speed.
Precision = choices("Precision", "32", "bf16", "16", "64")
# linear: lr x global_batch / 256; sqrt: lr x sqrt(global_batch / 256).
LRScaling = choices("LRScaling", "linear", "sqrt", "none")
# auto: online with credentials, else offline.
WandbMode = choices("WandbMode", "auto", "online", "offline")


@dataclass
class BackboneConfig:
    name: str = "resnet18"  # a timm model name, or torchvision.resnet18 / torchvision.resnet50 / ...
    small_stem: bool = False  # 3x3 stride-1 first conv and no max-pool, for 32px-sized images
    pretrained: bool = False
    kwargs: Dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model


@dataclass
class DataConfig:
    name: str = "digits"  # a registered dataset: see solo.data.DATASETS
    root: Optional[str] = None
    file: Optional[str] = None  # csv only: the captions file, may contain {split}, relative paths from root
    download: bool = False
    image_size: int = 16  # the size of every view that sets no size of its own, and of evaluation images
    batch_size: int = 128  # per process; the global batch is batch_size x world size
    num_workers: int = 2
    num_samples: int = 1000  # synthetic only
    num_classes: int = 10  # synthetic only


@dataclass
class AugmentationConfig:
    # Each entry is one recipe; `size` and `count` make multi-crop (e.g. 2 global + 6 local crops).
    views: List[ViewAugmentation] = field(default_factory=lambda: [ViewAugmentation(), ViewAugmentation()])


@dataclass
class OptimConfig:
    name: str = "lars"  # a registered optimizer: lars | sgd | adamw
    lr: float = 0.3  # for a global batch of 256 under lr_scaling=linear
    lr_scaling: LRScaling = LRScaling("linear")
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
    precision: Precision = Precision("32")
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
    name: str = "jsonl"  # a registered logger: jsonl | wandb (metrics.jsonl is always written)
    project: str = "solo"
    entity: Optional[str] = None
    mode: WandbMode = WandbMode("auto")


@dataclass
class PretrainConfig:
    backbone: BackboneConfig = MISSING
    method: Any = MISSING  # typed by the method's registered schema in validate_pretrain
    data: DataConfig = MISSING
    augmentation: AugmentationConfig = MISSING
    optim: OptimConfig = MISSING
    logger: LoggerConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    imports: List[str] = field(default_factory=list)  # Python modules that register your own methods, datasets, ...


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


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=PretrainConfig)
    cs.store(name="linear_schema", node=LinearEvalConfig)


def validate_pretrain(cfg: DictConfig) -> DictConfig:
    """The composed config checked against every schema, `cfg.imports` imported first; raises ConfigError."""
    for module in cfg.get("imports") or []:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"imports: cannot import {module!r} ({e}); is it on PYTHONPATH?") from None
    from solo.data import DATASETS, view_sizes
    from solo.methods import METHODS
    from solo.train.metrics import LOGGERS
    from solo.train.optim import OPTIMIZERS

    schema = OmegaConf.structured(PretrainConfig)
    method = METHODS[OmegaConf.select(cfg, "method.name", default="<unset>")]
    schema.method = OmegaConf.structured(method.schema)
    try:
        checked = OmegaConf.merge(schema, cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config: {e}") from None
    DATASETS[checked.data.name], OPTIMIZERS[checked.optim.name], LOGGERS[checked.logger.name]  # noqa: B018
    method.target.check_data(view_sizes(checked.augmentation.views, checked.data.image_size), DATASETS[checked.data.name])
    return checked


def plain(cfg: DictConfig) -> dict:
    """The config as plain Python values (choices as their strings): for checkpoints, loggers and YAML."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
