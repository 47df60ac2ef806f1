"""Structured-config schemas: every option is typed here; the YAML files under configs/ only set values.

`solo/configs/pretrain.yaml` is composed under `PretrainConfig`, so Hydra rejects a misspelt key or a wrong
type with the key's full name and lists the options of a group when one is unknown. The `method` group
is typed by the schema its method was registered with (see solo.methods), which `validate_pretrain`
applies after composition, together with the keys added with `+` that no schema knows, the names of
registered things (datasets, optimizers, loggers) and what the method needs from the data.
"""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from solo.backbones import BACKBONES, SMALL_IMAGES, choose_patch_size, configured_patch_size, has_resnet_stem
from solo.data import DATASETS, data_id, view_sizes
from solo.data.views.transforms import ViewAugmentation, check_shifts
from solo.distributed.env import detect
from solo.errors import ConfigError
from solo.eval.linear import LinearProtocol
from solo.loggers import LOGGERS
from solo.methods import METHODS
from solo.optim import OPTIMIZERS
from solo.registry import Registry
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, Rule, check_values, choices, ruled

log = logging.getLogger("solo")

# 16: CUDA only, with a gradient scaler; 64: for exactness checks, not for speed.
Precision = choices("Precision", "32", "bf16", "16", "64")
# ddp: every process holds the whole model; fsdp: parameters, gradients and optimizer state sharded (FSDP2).
Strategy = choices("Strategy", "ddp", "fsdp")
# torch.compile: off; each block of each tower (blocks); the whole image backbone as one graph (backbone); or the
# whole training step, forward, backward, optimizer and EMA, as one graph (step; CUDA graphs on a GPU).
Compile = choices("Compile", "off", "blocks", "backbone", "step")

# trainer.resume and finetune.resume. auto: from the newest intact checkpoint (a warning names the damaged ones
# newer than it); strict: a damaged newest checkpoint stops the run; never: a fresh start, and a checkpoint in the run
# directory is an error. true and false, their values before, are auto and never.
RESUME_POLICIES = {"auto": "auto", "strict": "strict", "never": "never", "true": "auto", "false": "never"}
RESUME = Rule("must be auto, strict or never (true: auto, false: never)", lambda v: str(v).lower() in RESUME_POLICIES)


def resume_policy(value) -> str:
    """auto, strict or never, for a value of trainer.resume (or finetune.resume)."""
    return RESUME_POLICIES[str(value).lower()]


def registered_groups() -> dict[str, Registry]:
    """The config groups typed by a registry: each option's schema is its registered entry's (`<group>.name`)."""
    return {"backbone": BACKBONES, "method": METHODS, "data": DATASETS, "optim": OPTIMIZERS, "logger": LOGGERS}


@dataclass
class AugmentationConfig:
    # The recipe's option name; auto (augmentation/auto.yaml, the default): the method's recipe for the data.
    name: str = "auto"
    # Each entry is one recipe; `size` and `count` make multi-crop (e.g. 2 global + 6 local crops).
    views: List[ViewAugmentation] = field(default_factory=list)

    def validate(self) -> None:
        check_shifts(self.views)  # between the views (each is checked alone by its own validate)


@dataclass
class TrainerConfig:
    max_epochs: int = ruled(10, AT_LEAST_ONE)
    max_steps: Optional[int] = ruled(None, AT_LEAST_ONE)  # stop there (and set the schedule's length); None: max_epochs
    seed: int = ruled(0, NON_NEGATIVE)
    # torch's intra-op threads per process; None: OMP_NUM_THREADS where set (torchrun sets 1 for several processes,
    # solo-pretrain --nproc_per_node each one's share), else the process's cores, on a GPU less its data workers
    threads: Optional[int] = ruled(None, AT_LEAST_ONE)
    # Micro-batches per step: data.batch_size is split in `accumulate` parts, the gradient stays the whole batch's.
    accumulate: int = ruled(1, AT_LEAST_ONE)
    precision: Precision = Precision("32")
    sync_batchnorm: bool = True  # global-batch BatchNorm statistics when W > 1
    channels_last: bool = True  # CUDA only
    strategy: Strategy = Strategy("ddp")  # how W > 1 processes hold the model; the step is the same either way
    # fsdp: free each block's gathered parameters after its forward (less memory, one more all-gather in backward)
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False  # per block: each block's activations recomputed in the backward
    # Before the first step, estimate the step's peak memory (solo.train.estimates) and stop with an error naming the keys
    # to change if it exceeds what the device has (or memory_limit_gib, GiB per process, when set).
    memory_check: bool = True
    memory_limit_gib: Optional[float] = ruled(None, POSITIVE)
    compile: Compile = Compile("off")  # blocks | backbone | step (a warning, and eager, where compiling does not work)
    # auto: continue from the newest intact checkpoint in <run dir>/checkpoints (a warning names newer damaged ones);
    # strict: stop when the newest is damaged; never: start afresh (a checkpoint there is an error); true/false: auto/never
    resume: str = ruled("auto", RESUME)
    # Start from other weights, with a new optimizer and schedule: a pretraining run directory or training checkpoint
    # of this method (its whole model: backbone, heads, teachers; the same method and backbone config); another
    # method's run, a zoo name or solo weights file (a backbone: the method's heads start afresh, its teachers from
    # it). A resume from the run's own checkpoints does not read them.
    init_from: Optional[str] = None
    checkpoint_every_steps: int = ruled(0, NON_NEGATIVE)  # 0: only at epoch ends
    # Finish the step, checkpoint, (under SLURM) requeue, exit; a second SIGINT (Ctrl-C) exits at once.
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGUSR1", "SIGTERM", "SIGINT"])
    requeue: bool = True  # under SLURM, `scontrol requeue` the job after a preemption checkpoint
    keep_checkpoints: int = ruled(2, AT_LEAST_ONE)
    log_every_steps: int = ruled(10, AT_LEAST_ONE)
    probe: bool = True  # online linear probe on detached backbone features (needs labels)
    # Evaluate (validation, health metrics, k-NN) every this many epochs, and at the end; None: every epoch for a run
    # whose length is trainer.max_epochs, at the end only for one that trainer.max_steps stops
    eval_every: Optional[int] = ruled(None, AT_LEAST_ONE)
    knn_k: int = ruled(
        0, NON_NEGATIVE
    )  # > 0: online weighted k-NN val accuracy at each evaluation (cosine, k neighbours; needs labels)
    knn_temperature: float = ruled(0.07, POSITIVE)
    # Image-text methods: an ImageFolder split (class folders, e.g. /data/imagenet/val) classified zero-shot at each
    # epoch end with CLIP's ImageNet prompts, as main_linear.py data=imagefolder does: val/folder_zeroshot_acc1, _acc5.
    zero_shot_folder: Optional[str] = None
    plots: bool = True  # at the end: curves.png from metrics.jsonl, embedding.png of val features (labels)
    progress_bar: bool = True


@dataclass
class PretrainConfig:
    # The registered groups (registered_groups) are typed by their option's schema: in the option's YAML while the
    # config is composed, and by the named entry's in validate_pretrain.
    backbone: Any = MISSING
    method: Any = MISSING
    data: Any = MISSING
    augmentation: AugmentationConfig = MISSING
    optim: Any = MISSING
    logger: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    imports: List[str] = field(default_factory=list)  # Python modules that register your own methods, datasets, ...


@dataclass
class KNNConfig:
    k: int = ruled(20, AT_LEAST_ONE)
    temperature: float = ruled(0.07, POSITIVE)  # votes weighted by exp(cosine / temperature)


@dataclass
class FinetuneConfig:
    """main_linear.py's full fine-tuning, run by the pretraining trainer as method=supervised (solo.downstream.finetune)."""

    enabled: bool = False
    epochs: int = ruled(10, AT_LEAST_ONE)
    # An `optim` option of any registered optimizer, chosen as optim@finetune.optim=<name> (linear.yaml: SGD, lr 0.01,
    # no warm-up, cosine to 0); typed by its schema.
    optim: Any = MISSING
    precision: Precision = Precision("32")
    accumulate: int = ruled(1, AT_LEAST_ONE)
    crop_scale: List[float] = field(default_factory=lambda: [0.4, 1.0])
    hflip_prob: float = ruled(0.0, PROBABILITY)
    resume: str = ruled("auto", RESUME)  # as trainer.resume, in <run dir>/finetune/checkpoints
    checkpoint_every_steps: int = ruled(0, NON_NEGATIVE)  # 0: at epoch ends
    log_every_steps: int = ruled(10, AT_LEAST_ONE)


# A ViT's features for the probes: its class token, or the mean of its patch tokens (after the last norm).
Pool = choices("Pool", "cls", "mean")


@dataclass
class LinearEvalConfig:
    pretrained: str = MISSING  # zoo name, solo .safetensors file, training checkpoint .pt, or pretraining run dir
    random_init: bool = False  # the same architecture freshly initialised: the baseline the weights must beat
    seed: int = ruled(0, NON_NEGATIVE)
    # A ViT's features: cls (its class token) or mean (its patch tokens' mean); unset: the pooling the method that
    # trained the weights probes (Method.pool: mean for I-JEPA and DINOv2, else cls).
    pool: Optional[Pool] = None
    # A ViT's features read after its first N blocks (then its final norm and the pool); fine-tuning runs them all.
    # Unset: where the method that trained the weights reads them (Method.feature_depth: NEPA the middle, else all).
    feature_blocks: Optional[int] = ruled(None, AT_LEAST_ONE)
    feature_cache: bool = True  # features under $SOLO_CACHE/features (default ~/.cache/solo), keyed by weights + data
    plots: bool = True  # embedding.png (val features, 2-D) and curves.png in the run dir
    data: Any = MISSING  # typed as in PretrainConfig
    logger: Any = MISSING
    linear: LinearProtocol = field(default_factory=LinearProtocol)  # its seed is ${seed} (linear.yaml)
    knn: KNNConfig = field(default_factory=KNNConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=PretrainConfig)
    cs.store(name="linear_schema", node=LinearEvalConfig)
    # For the default run directory's name: data.batch_size x the processes the launcher starts.
    OmegaConf.register_new_resolver(
        "solo.global_batch", lambda batch_size: int(batch_size) * detect().world_size, replace=True
    )
    OmegaConf.register_new_resolver("solo.eval_name", eval_name, replace=True)
    OmegaConf.register_new_resolver("solo.registered", registered, replace=True)
    OmegaConf.register_new_resolver("solo.image_tower", image_tower, replace=True)
    # The data's identity (data.id, or derived from where the files are): another folder is another run directory.
    OmegaConf.register_new_resolver("solo.data_id", data_id, replace=True)


def eval_name(pretrained: str, random_init: bool) -> str:
    """A run-directory name for evaluating `pretrained`: a zoo name, or the run (and step) a path points to."""
    path = Path(str(pretrained))
    parts = (
        [path.parent.parent.name, path.stem]
        if path.parent.name == "checkpoints"
        else [path.stem if path.suffix else path.name]
    )
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(p for p in parts if p))
    return name + ("-random_init" if random_init else "")


def registered() -> str:
    """What --help lists: every registry's names (after the command line's imports=[...] are imported)."""
    return "\n".join(f"  {r.describe()}" for r in registered_groups().values())


def image_tower(backbone: str, model: str | None) -> str:
    """The image tower's name, for the run directory: open_clip's model (method.model) if set, else the backbone."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model) if model else backbone


# What may differ between a checkpoint's run and the run that resumes it: how long, how often, where,
# how it is logged and evaluated. data.batch_size too, as long as the global batch stays (checked apart).
SAFE_TO_CHANGE = (
    "trainer.max_epochs",
    "trainer.threads",
    "trainer.max_steps",
    "trainer.resume",
    "trainer.init_from",
    "trainer.checkpoint_every_steps",
    "trainer.keep_checkpoints",
    "trainer.preempt_signals",
    "trainer.requeue",
    "trainer.log_every_steps",
    "trainer.eval_every",
    "trainer.knn_k",
    "trainer.knn_temperature",
    "trainer.zero_shot_folder",
    "trainer.plots",
    "trainer.progress_bar",
    "trainer.channels_last",
    "trainer.accumulate",
    "trainer.strategy",
    "trainer.reshard_after_forward",
    "trainer.activation_checkpointing",
    "trainer.memory_check",
    "trainer.memory_limit_gib",
    "trainer.compile",
    "data.batch_size",
    "data.augment_on",
    "data.num_workers",
    "data.root",  # where the data are: their identity is data.id, compared (see data_id)
    "data.file",
    "data.path",
    "data.shards",
    "data.val_shards",
    "data.download",
    "logger",
    "imports",
)


def changed_keys(trained: dict, now: dict) -> list[tuple[str, object, object]]:
    """(key, trained value, new value) for every training-relevant key whose value differs. Keys that only one side
    has are not compared (a newer solo adds keys), except under a free-form `kwargs` mapping (a backbone's), where a
    key given or dropped changes the model: its missing side reads None."""
    old, new = _flatten(trained), _flatten(now)
    safe = tuple(SAFE_TO_CHANGE) + tuple(k + "." for k in SAFE_TO_CHANGE)
    keys = (old.keys() & new.keys()) | {k for k in old.keys() ^ new.keys() if ".kwargs." in k}
    changed = [(k, old.get(k), new.get(k)) for k in sorted(keys)]
    return [(k, a, b) for k, a, b in changed if a != b and not k.startswith(safe)]


def _flatten(value, key: str = "") -> dict:
    if isinstance(value, dict):
        return {
            k: v for name, item in value.items() for k, v in _flatten(item, f"{key}.{name}" if key else name).items()
        }
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{key}[{i}]").items()}
    return {key: value}


def import_modules(modules) -> None:
    """Import the config's `imports` (the user's modules, which register their methods, datasets, ...)."""
    for module in modules or []:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"imports: cannot import {module!r} ({e}); is it on PYTHONPATH?") from None


def typed(cfg: DictConfig, schema: type, groups: tuple[str, ...]) -> DictConfig:
    """`cfg` merged onto `schema`, each of `groups` (a registered group's name, or a key ending in one: finetune.optim)
    typed by its named entry's schema, every value checked."""
    typed_schema = OmegaConf.structured(schema)
    for group in groups:
        registry = registered_groups()[group.rpartition(".")[2]]
        entry = registry[OmegaConf.select(cfg, f"{group}.name", default="<unset>")]
        OmegaConf.update(typed_schema, group, OmegaConf.structured(entry.schema), merge=False)
    try:
        checked = OmegaConf.merge(typed_schema, cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config: {e}") from None
    check_values(checked)
    return checked


def validate_pretrain(cfg: DictConfig) -> DictConfig:
    """The composed config checked against every schema, `cfg.imports` imported first, its `auto` values chosen
    (choose_for_the_data, which logs why); raises ConfigError."""
    import_modules(cfg.get("imports"))
    checked = typed(cfg, PretrainConfig, tuple(registered_groups()))
    for line in choose_for_the_data(checked):
        if detect().rank == 0:
            log.info(line)
    method = METHODS[checked.method.name].target
    method.check_data(view_sizes(checked.augmentation.views, checked.data.image_size), DATASETS[checked.data.name])
    method.check_config(checked)
    _check_accumulation(checked, method)
    _check_compiled_step(checked)
    _check_patch_grid(checked)
    checked.data.id = data_id(checked.data)  # kept in the checkpoints: a resume on other data is refused
    return checked


CONFIGS = Path(__file__).parent / "configs"
# The image side that the papers' recipes (their multi-crop local crop sizes) were written for, and the multiple of
# pixels that their sizes scaled to another side are rounded to (a ViT's: its patch).
RECIPE_IMAGE_SIZE, RECIPE_MULTIPLE = 224, 8


def choose_for_the_data(cfg: DictConfig) -> list[str]:
    """Resolve, in place, the defaults that follow the data: augmentation=auto (the method's recipe for the digits, or
    its natural-image one, the paper's views at data.image_size), backbone.small_stem=auto (small for images of at
    most SMALL_IMAGES px on a ResNet stem), backbone.kwargs.patch_size=auto (solo.backbones.choose_patch_size) and
    the method's own (Method.choose_for_the_data). Returns a line per choice saying what was chosen and why."""
    said = []
    method, d = METHODS[cfg.method.name].target, cfg.data
    patch_line = choose_patch_size(cfg.backbone, d.image_size)  # first: the recipe's crops tile into the patches
    if patch_line:
        said.append(patch_line)
    if not cfg.augmentation.views and cfg.augmentation.name != "auto":
        options = sorted(p.stem for p in (CONFIGS / "augmentation").glob("*.yaml"))
        raise ConfigError(
            f"augmentation.name={cfg.augmentation.name}: a recipe with no views; choose one with augmentation=<name> "
            f"({', '.join(options)}), or augmentation=auto for the method's own"
        )
    if not cfg.augmentation.views:
        kind = "digits" if d.name == "digits" else "natural"
        recipe = method.augmentations[kind]
        size = None if kind == "digits" else d.image_size
        multiple = configured_patch_size(cfg.backbone) or RECIPE_MULTIPLE
        cfg.augmentation = recipe_views(recipe, size, method.local_crops, multiple)
        said.append(
            f"augmentation={recipe}: method={method.name}'s recipe for "
            + ("the digits" if kind == "digits" else f"natural images (data={d.name}), at {d.image_size} px")
            + " (augmentation=auto; augmentation=<name> chooses another)"
        )
    if cfg.backbone.get("small_stem") == "auto":
        resnet = has_resnet_stem(cfg.backbone.name)
        small = resnet and d.image_size <= SMALL_IMAGES
        cfg.backbone.small_stem = small
        if resnet:  # a ViT's or a ConvNeXt's stem: nothing to choose, nothing said
            size = "at most" if small else "over"
            said.append(
                f"backbone.small_stem={str(small).lower()}: data.image_size={d.image_size} is {size} {SMALL_IMAGES} px "
                "(backbone.small_stem=auto; true or false chooses)"
            )
    return said + method.choose_for_the_data(cfg)


def recipe_views(name: str, image_size: int | None, local_crops: bool, multiple: int = RECIPE_MULTIPLE) -> DictConfig:
    """The augmentation option `name` (its YAML), typed, without its local crops (views of a fixed `size`) unless
    `local_crops`; with `image_size`, those crops' sizes (written for RECIPE_IMAGE_SIZE px) scaled to it, in multiples
    of `multiple` px (a ViT's patch, whose grid they must tile; else 8)."""
    recipe = OmegaConf.merge(
        OmegaConf.structured(AugmentationConfig), OmegaConf.load(CONFIGS / "augmentation" / f"{name}.yaml")
    )
    if not local_crops:  # DeepClusterV2 takes the global crops of SwAV's multi-crop, as it compares two views
        recipe.views = [view for view in recipe.views if view.size is None]
    if image_size is not None:
        for view in recipe.views:
            if view.size is not None:
                scaled = view.size * image_size / RECIPE_IMAGE_SIZE
                view.size = max(multiple, round(scaled / multiple) * multiple)
    return recipe


def check_required(cfg: DictConfig) -> None:
    """Raise ConfigError for the first required key left unset (??? in the YAML: data.root of data=imagefolder)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required and not set: add {missing[0]}=... to the command line")


def validate_linear(cfg: DictConfig) -> DictConfig:
    """main_linear.py's composed config checked against its schemas; raises ConfigError."""
    return typed(cfg, LinearEvalConfig, ("data", "logger", "finetune.optim"))


def _check_patch_grid(cfg: DictConfig) -> None:
    """Every view, and the evaluation images, must tile into the backbone's patches (timm refuses mid-run)."""
    patch = configured_patch_size(cfg.backbone)
    if patch is None or (cfg.backbone.get("kwargs") or {}).get("dynamic_img_pad"):
        return
    sizes = [("data.image_size", cfg.data.image_size)] + [
        (f"augmentation.views[{i}].size", view.size) for i, view in enumerate(cfg.augmentation.views) if view.size
    ]
    for key, size in sizes:
        if size % patch:
            low, high = size // patch * patch, (size // patch + 1) * patch
            given = (cfg.backbone.get("kwargs") or {}).get("patch_size") is not None
            source = f"backbone.kwargs.patch_size={patch}" if given else f"backbone.name={cfg.backbone.name}"
            raise ConfigError(
                f"{key}={size} does not tile into the backbone's {patch} px patches ({source}): use {low or high} "
                f"or {high}, or set backbone.kwargs.patch_size to a divisor of {size}"
            )


def _check_accumulation(cfg: DictConfig, method) -> None:
    k, batch = cfg.trainer.accumulate, cfg.data.batch_size
    if k > 1 and not method.can_accumulate():
        raise ConfigError(
            f"trainer.accumulate={k}: method={method.name} cannot accumulate gradients exactly (it has no encode/batch_loss "
            "split, see solo.methods.Method.encode); use trainer.accumulate=1"
        )
    if batch % k:
        raise ConfigError(
            f"trainer.accumulate={k} does not divide data.batch_size={batch}: each process splits its batch into "
            f"{k} equal micro-batches; use a data.batch_size that is a multiple of {k}"
        )


def _check_compiled_step(cfg: DictConfig) -> None:
    """trainer.compile=step captures one process's whole step: what it cannot capture is refused here."""
    t = cfg.trainer
    if str(t.compile) != "step":
        return
    if t.accumulate > 1:
        raise ConfigError(
            f"trainer.compile=step with trainer.accumulate={t.accumulate}: gradient accumulation's passes keep and restore "
            "the random state on the host, which a compiled step cannot; use trainer.compile=blocks with accumulation"
        )
    if str(t.precision) == "16":
        raise ConfigError(
            "trainer.compile=step with trainer.precision=16: the gradient scaler reads the host every step; use "
            "trainer.precision=bf16"
        )
    if detect().world_size > 1:
        raise ConfigError(
            f"trainer.compile=step on {detect().world_size} processes: the compiled step is one process's so far (DDP's "
            "and FSDP's hooks run between its parts); use trainer.compile=blocks on several processes"
        )


def plain(cfg: DictConfig) -> dict:
    """The config as plain Python values (choices as their strings): for checkpoints, loggers and YAML."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
