"""Structured-config schemas: every option is typed here; the YAML files under configs/ only set values.

`configs/pretrain.yaml` is composed under `PretrainConfig`, so Hydra rejects a misspelt key or a wrong
type with the key's full name and lists the options of a group when one is unknown. The `method` group
is typed by the schema its method was registered with (see solo.methods), which `validate_pretrain`
applies after composition, together with the keys added with `+` that no schema knows, the names of
registered things (datasets, optimizers, loggers) and what the method needs from the data.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from solo.cli import eval_name
from solo.data.transforms import ViewAugmentation
from solo.distributed.env import detect
from solo.errors import ConfigError
from solo.eval.linear import LinearProtocol
from solo.schema import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, check_values, ruled


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
# error: an unreadable image stops the run, naming it; skip: the next readable sample takes its place, counted.
OnBadImage = choices("OnBadImage", "error", "skip")
# Where the training views' pixels are computed: cpu (per sample, in the DataLoader workers), device (the
# whole batch on the training device; parameters still drawn per sample in the workers), auto: device on CUDA.
AugmentOn = choices("AugmentOn", "auto", "cpu", "device")


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
    image_size: int = ruled(16, AT_LEAST_ONE)  # the size of every view that sets no size of its own, and of evaluation images
    batch_size: int = ruled(128, AT_LEAST_ONE)  # per process; the global batch is batch_size x world size
    num_workers: Optional[int] = ruled(None, NON_NEGATIVE)  # DataLoader workers per process; None: what the machine has
    on_bad_image: OnBadImage = OnBadImage("error")
    check_images: int = ruled(100, NON_NEGATIVE)  # decoded at start, to find unreadable files before training
    augment_on: AugmentOn = AugmentOn("auto")
    shards: Optional[str] = None  # webdataset only: the train shards, a brace pattern ('/data/{00000..00331}.tar')
    val_shards: Optional[str] = None  # webdataset only: the val shards; None: no validation
    shuffle_window: int = ruled(4, AT_LEAST_ONE)  # webdataset only: shards whose samples are shuffled together
    cache_dir: Optional[str] = None  # webdataset only: shard indexes and fetched shards; None: ~/.cache/solo/shards
    num_samples: int = ruled(1000, AT_LEAST_ONE)  # synthetic only
    num_classes: int = ruled(10, AT_LEAST_ONE)  # synthetic only


@dataclass
class AugmentationConfig:
    # Each entry is one recipe; `size` and `count` make multi-crop (e.g. 2 global + 6 local crops).
    views: List[ViewAugmentation] = field(default_factory=lambda: [ViewAugmentation(), ViewAugmentation()])


@dataclass
class OptimConfig:
    name: str = "lars"  # a registered optimizer: lars | sgd | adamw
    lr: float = ruled(0.3, POSITIVE)  # for a global batch of 256 under lr_scaling=linear
    lr_scaling: LRScaling = LRScaling("linear")
    weight_decay: float = ruled(1e-6, NON_NEGATIVE)
    momentum: float = ruled(0.9, MOMENTUM)
    eta: float = ruled(0.02, POSITIVE)  # LARS trust coefficient
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW
    exclude_bias_and_norm: bool = True
    warmup_epochs: float = ruled(1.0, NON_NEGATIVE)
    warmup_start_lr: float = ruled(0.0, NON_NEGATIVE)
    final_lr: float = ruled(0.0, NON_NEGATIVE)
    grad_clip: Optional[float] = ruled(None, POSITIVE)  # max global gradient norm
    probe_lr: float = ruled(0.1, POSITIVE)  # online linear probe (no weight decay, not LARS-adapted)


@dataclass
class TrainerConfig:
    max_epochs: int = ruled(10, AT_LEAST_ONE)
    max_steps: int = -1  # > 0 stops there (and sets the schedule's length)
    seed: int = 0
    # Micro-batches per step: data.batch_size is split in `accumulate` parts, the gradient stays the whole batch's.
    accumulate: int = ruled(1, AT_LEAST_ONE)
    precision: Precision = Precision("32")
    sync_batchnorm: bool = True  # global-batch BatchNorm statistics when W > 1
    channels_last: bool = True  # CUDA only
    resume: bool = True  # continue from <run dir>/checkpoints/last.pt when it exists
    checkpoint_every_steps: int = ruled(0, NON_NEGATIVE)  # 0: only at epoch ends
    # Finish the step, checkpoint, (under SLURM) requeue, exit; a second SIGINT (Ctrl-C) exits at once.
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGUSR1", "SIGTERM", "SIGINT"])
    requeue: bool = True  # under SLURM, `scontrol requeue` the job after a preemption checkpoint
    keep_checkpoints: int = ruled(2, AT_LEAST_ONE)
    log_every_steps: int = ruled(10, AT_LEAST_ONE)
    probe: bool = True  # online linear probe on detached backbone features (needs labels)
    knn_k: int = ruled(0, NON_NEGATIVE)  # > 0: online weighted k-NN val accuracy each epoch (cosine, k neighbours; needs labels)
    knn_temperature: float = ruled(0.07, POSITIVE)
    # Image-text methods: an ImageFolder split (class folders, e.g. /data/imagenet/val) classified zero-shot at each
    # epoch end with CLIP's ImageNet prompts, as main_linear.py data=imagefolder does: val/folder_zeroshot_acc1, _acc5.
    zero_shot_folder: Optional[str] = None
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
    import solo.methods  # noqa: F401  (stores each method's schema as /schema/method/<name>)

    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=PretrainConfig)
    cs.store(name="linear_schema", node=LinearEvalConfig)
    # For the default run directory's name: data.batch_size x the processes the launcher starts.
    OmegaConf.register_new_resolver("solo.global_batch", lambda batch_size: int(batch_size) * detect().world_size, replace=True)
    OmegaConf.register_new_resolver("solo.eval_name", eval_name, replace=True)
    OmegaConf.register_new_resolver("solo.image_tower", image_tower, replace=True)


def image_tower(backbone: str, model: str | None) -> str:
    """The image tower's name, for the run directory: open_clip's model (method.model) if set, else the backbone."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model) if model else backbone


# What may differ between a checkpoint's run and the run that resumes it: how long, how often, where,
# how it is logged and evaluated. data.batch_size too, as long as the global batch stays (checked apart).
SAFE_TO_CHANGE = (
    "trainer.max_epochs", "trainer.max_steps", "trainer.resume", "trainer.checkpoint_every_steps",
    "trainer.keep_checkpoints", "trainer.preempt_signals", "trainer.requeue", "trainer.log_every_steps",
    "trainer.knn_k", "trainer.knn_temperature", "trainer.zero_shot_folder", "trainer.plots", "trainer.progress_bar", "trainer.channels_last",
    "trainer.accumulate",
    "data.batch_size", "data.augment_on", "data.num_workers", "data.root", "data.file", "data.download", "logger", "imports",
)


def changed_keys(trained: dict, now: dict) -> list[tuple[str, object, object]]:
    """(key, trained value, new value) for every training-relevant key whose value differs; keys that only
    one side has (added by a newer solo) are not compared."""
    old, new = _flatten(trained), _flatten(now)
    safe = tuple(SAFE_TO_CHANGE) + tuple(k + "." for k in SAFE_TO_CHANGE)
    return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k] and not k.startswith(safe)]


def _flatten(value, key: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _flatten(item, f"{key}.{name}" if key else name).items()}
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{key}[{i}]").items()}
    return {key: value}


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
    check_values(checked)
    DATASETS[checked.data.name], OPTIMIZERS[checked.optim.name], LOGGERS[checked.logger.name]  # noqa: B018
    method.target.check_data(view_sizes(checked.augmentation.views, checked.data.image_size), DATASETS[checked.data.name])
    method.target.check_config(checked)
    _check_accumulation(checked, method.target)
    return checked


def _check_accumulation(cfg: DictConfig, method) -> None:
    k, batch = cfg.trainer.accumulate, cfg.data.batch_size
    if k > 1 and not method.can_accumulate():
        raise ConfigError(
            f"trainer.accumulate={k}: method={method.name} cannot accumulate gradients exactly (it has no encode/joint "
            "split, see solo.methods.Method.encode); use trainer.accumulate=1"
        )
    if batch % k:
        raise ConfigError(
            f"trainer.accumulate={k} does not divide data.batch_size={batch}: each process splits its batch into "
            f"{k} equal micro-batches; use a data.batch_size that is a multiple of {k}"
        )


def plain(cfg: DictConfig) -> dict:
    """The config as plain Python values (choices as their strings): for checkpoints, loggers and YAML."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
