"""What a pretraining method is, and the lifecycle the trainer runs it through.

A method is an nn.Module from a batch to its loss. Besides `forward`, it tells the trainer:

- which of its submodules are *teachers* (`teachers`): not trained by the optimizer, updated by the
  method itself in `after_optimizer_step` (or frozen: a pretrained teacher, `pretrained_teacher`), saved in
  checkpoints, and left out of SyncBatchNorm conversion unless `sync_teacher_batchnorm`;
- its parameter groups (`param_groups`), e.g. a predictor with its own learning rate;
- what it needs from the data (`inputs`, `needs_labels`, `check_data`): augmented views (`num_views` of one size, plus
  smaller local crops when `local_crops`, as multi-crop methods take them), or image-text pairs; and what else its
  batches carry, declared in one object (`batch_spec`: patch masks, view boxes, a probe image, a tokenizer, or a
  field of its own), which the data layer reads in one place;
- the run's length (`set_schedule`, before the optimizer is built), for schedules in epochs, and the train split's
  size (`set_data`), for state sized by the data;
- each step's two parts of its own state: the host's before the step (`prepare_step`: schedules written in place
  into device tensors, work that reads the host) and the device's after the optimizer's update
  (`after_optimizer_step`: EMA teachers), which trainer.compile=step captures with the step;
- the metrics it logs besides the loss (`metrics`), and how it is validated (`classifier`: the layer scored on the
  val features; `val_health`: health metrics of its own; image-text methods: `evaluate`);
- optionally, its split into `encode` (per sample: the backbone) and `batch_loss` (what couples the samples:
  projector BatchNorm, the loss), which gradient accumulation (`trainer.accumulate`) needs.

Why these remain. The class attributes (`inputs`, `num_views`, `local_crops`, `needs_labels`, `pool`,
`feature_depth`, `augmentations`, `teachers`, `sync_teacher_batchnorm`, `pretrained_teacher`) are read before the
method is built: the config is checked and the data, augmentation and teacher chosen from them. Everything a batch
carries beyond the views is one hook, `batch_spec`, asked once the method exists, since masks depend on its patch grid; a new need is a
new field there (solo.data.views.batch_spec), not a new attribute here. The other hooks are the points of the
lifecycle where the trainer hands over: built (`set_data`), scheduled (`set_schedule`), each step before and after
(`prepare_step`, `after_optimizer_step`), logged (`metrics`) and validated (`classifier`, `val_health`).
Shared shapes live in bases beside this one: `TwoViewMethod`, `ExpanderMethod`, `MomentumTwoViewMethod` and `SiameseMethod` here, and
solo.methods.masked_image's `MaskedViT`, `PixelReconstruction` and `TargetEncoderViT`.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from solo.backbones import check_dense_tokens, pooled_and_tokens, watch_dense
from solo.backbones.stochastic import step_uniforms, without_randomness
from solo.data.views.batch_spec import BatchSpec
from solo.distributed.batchnorm import normalises_row_groups, row_groups
from solo.errors import ConfigError
from solo.losses import co2_batch_loss, dse_score, koleo_loss
from solo.optim import param_groups
from solo.registry import Registry
from solo.schema import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ruled

METHODS = Registry("method", "method", group="method")


def register_method(name: str, schema: type) -> Callable:
    """Class decorator: the method `name`, configured by the dataclass `schema` (the `method` config group).

    The schema is also stored for Hydra as `/schema/method/<name>`: a method YAML that lists it in its
    defaults is typed while the config is composed; every method config is checked against it after.
    """

    def add(cls):
        cls.name = name
        return METHODS.register(name, schema=schema)(cls)

    return add


def _takes(method: type[Method], view_sizes: list[int], dataset) -> bool:
    """Whether `method` trains on views of these sizes (its check_data passes): for the error that names them."""
    try:
        method.check_data(view_sizes, dataset)
    except ConfigError:
        return False
    return True


class Method(nn.Module):
    """Subclasses implement `forward(batch) -> {"loss": scalar, "features": (n, width), "labels": (n,)}`.

    `batch` is a dict from the data pipeline: {"views": [tensor, ...], "label": tensor} for image
    methods, {"image": ..., "text": ..., "label": ...} for image-text ones. "features" are backbone
    features (not yet detached) and "labels" their classes, for the online probe; the loss follows
    solo's distributed convention (the mean over ranks is the global-batch loss).
    """

    name: ClassVar[str] = ""
    inputs: ClassVar[str] = "views"  # "views" (augmented views of images) or "image_text" (pairs)
    num_views: ClassVar[int] = 2  # how many views of one size (the global crops) forward expects
    local_crops: ClassVar[bool] = False  # whether smaller crops may follow the global ones (multi-crop)
    needs_labels: ClassVar[bool] = False  # whether the loss reads the labels (supervised methods), not just the probe
    teachers: ClassVar[tuple[str, ...]] = ()  # names of submodules that the optimizer does not train
    sync_teacher_batchnorm: ClassVar[bool] = False
    # Whether its constructor takes `teacher`, a frozen pretrained encoder named by method.teacher, which the trainer
    # loads (solo.zoo.teachers: solo.methods may not read the zoo) and passes on
    pretrained_teacher: ClassVar[bool] = False
    # A ViT's feature that the probes read: its class token, or "mean", its patch tokens' mean (the method's __init__
    # sets it: solo.backbones.vit.pool_patch_tokens); main_linear.py reads the same unless told `pool=`.
    pool: ClassVar[str] = "cls"
    # Where in a ViT the probes read that feature: after this fraction of its blocks (the method's __init__ sets it:
    # solo.backbones.vit.read_features_after); main_linear.py reads the same unless told `feature_blocks=`.
    feature_depth: ClassVar[float] = 1.0
    # The augmentation recipes (options of the `augmentation` group) that augmentation=auto, the default, chooses: one
    # for the embedded digits, one for any other data (natural images: the paper's views at data.image_size).
    augmentations: ClassVar[dict[str, str]] = {"digits": "digits", "natural": "simclr"}

    # The regularisers that view_outputs adds, set from a method's config by take_regularisers: KoLeo's weight
    # (KoLeoOption), and DSE's options where its weight is on (DSEOption; else None), which make encode_backbone give
    # the global views' dense tokens too.
    koleo_weight: float = 0.0
    dse: DSEOption | None = None

    def __init__(self, backbone: nn.Module, feature_dim: int):
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim
        # Whether an online probe reads forward's "features" (the trainer says): a method whose features cost a pass
        # of their own (MAE: the whole image, besides the visible patches) leaves them out when none does.
        self.feeds_probe = True

    @classmethod
    def check_data(cls, view_sizes: list[int], dataset) -> None:
        """Raise ConfigError when the augmentation's views (their sizes) or the dataset cannot feed this method."""
        if cls.inputs == "image_text" and not dataset.pairs:
            raise ConfigError(
                f"method={cls.name} trains on image-text pairs; data={dataset.name} has none (try data=digits or data=csv)"
            )
        if cls.inputs == "views" and not dataset.images:
            raise ConfigError(f"method={cls.name} trains on images; data={dataset.name} holds image-text pairs only")
        global_sizes, local_sizes = view_sizes[: cls.num_views], view_sizes[cls.num_views :]
        if len(global_sizes) != cls.num_views or len(set(global_sizes)) != 1:
            raise ConfigError(
                f"method={cls.name} compares {cls.num_views} view(s) of one size first, but augmentation.views gives sizes "
                f"{view_sizes}: list {cls.num_views} view(s) of one size first (count: {cls.num_views})"
            )
        if local_sizes and not cls.local_crops:
            takers = ", ".join(
                m.name for m in METHODS if m.target.local_crops and _takes(m.target, view_sizes, dataset)
            )
            raise ConfigError(
                f"method={cls.name} compares {cls.num_views} view(s) of one size, but augmentation.views gives sizes "
                f"{view_sizes}: the extra views (multi-crop) are only used by methods that take local crops ({takers or 'none'})"
            )
        if local_sizes and max(local_sizes) >= global_sizes[0]:
            raise ConfigError(
                f"method={cls.name} takes {cls.num_views} global crops and then smaller local crops, but augmentation.views "
                f"gives sizes {view_sizes}: the local crops (after the first {cls.num_views}) must be smaller than "
                f"{global_sizes[0]} px; put the global views first"
            )

    @classmethod
    def check_config(cls, cfg) -> None:
        """Raise ConfigError when the whole (validated) config `cfg` cannot work with this method's config; called
        with check_data before anything is built (CLIP: open_clip's towers and the data's image size)."""

    @classmethod
    def choose_for_the_data(cls, cfg) -> list[str]:
        """Resolve, in place, this method's settings that follow the data (`auto` in cfg.method), given the whole
        config with the backbone's own already resolved; a line per choice, saying what was chosen and why."""
        return []

    @classmethod
    def builds_own_backbone(cls, cfg) -> bool:
        """Whether the method builds its image encoder itself from its config `cfg` (the `method` group), so the
        `backbone` group's is not built (CLIP and SigLIP with open_clip's towers)."""
        return False

    def set_schedule(self, steps_per_epoch: int, total_steps: int) -> None:
        """The run's length, given once before the optimizer is built: for schedules counted in epochs."""
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps

    def set_data(self, num_samples: int) -> None:
        """The train split's size, given once right after the method is built: for state sized by the data (memory
        banks, as buffers, so that they move to the device and into checkpoints with the model)."""

    def batch_spec(self) -> BatchSpec:
        """What its batches carry besides the views (or pairs), "label" and "index" (solo.data.views.batch_spec): asked
        once, after the trainer has set `feeds_probe`. A method whose probe features cost a forward of their own asks
        for `probe_image=self.feeds_probe`, so that the probe learns on what it is evaluated on."""
        return BatchSpec()

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        """The optimizer's groups over the trained parameters (teachers excluded by having no gradient)."""
        return param_groups(self, weight_decay, exclude_bias_and_norm=exclude_bias_and_norm)

    def take_regularisers(self, cfg) -> None:
        """KoLeo's weight and DSE's options from the method's config `cfg`, where it has them (KoLeoOption,
        DSEOption): view_outputs adds their terms."""
        self.koleo_weight = getattr(cfg, "koleo_weight", 0.0)
        if getattr(cfg, "dse_weight", 0.0):
            check_dense_tokens(self.backbone, f"method.dse_weight={cfg.dse_weight}")
            watch_dense(self.backbone)
            self.dse = cfg
            self.draws = None  # the trainer's (solo.backbones.stochastic.Draws.attach): DSE's k-means++ draws of a step

    def encode_backbone(self, views: list[torch.Tensor], per_view_statistics: bool = True) -> dict:
        """{"features": each view through the backbone (encode_views)}, and with DSE on, "dense": the dense tokens
        (n, P, D) of the first `num_views` views (the global crops), read around the same calls (pooled_and_tokens)."""
        if self.dse is None:
            return {"features": encode_views(self.backbone, views, per_view_statistics=per_view_statistics)}
        pairs = encode_views(
            self.backbone,
            views,
            forward=lambda images: list(pooled_and_tokens(self.backbone, images)),
            per_view_statistics=per_view_statistics,
        )
        return {"features": [pooled for pooled, _ in pairs], "dense": [tokens for _, tokens in pairs[: self.num_views]]}

    def view_outputs(
        self, loss: torch.Tensor, features: list[torch.Tensor], batch: dict, dense: list[torch.Tensor] | None = None
    ) -> dict:
        """forward's outputs for `loss` and each view's backbone `features`: the features for the probe, each view with
        its sample's label; with `koleo_weight`, KoLeo on each view's features added to the loss (KoLeoOption); with
        DSE on, its term of the global views' `dense` tokens (encode_backbone's; with_dse)."""
        if self.koleo_weight:
            loss = loss + self.koleo_weight * sum(koleo_loss(f) for f in features)
        loss = self.with_dse(loss, dense)
        return {"loss": loss, "features": torch.cat(features), "labels": batch["label"].repeat(len(features))}

    def with_dse(
        self, loss: torch.Tensor, dense: list[torch.Tensor] | None, valid: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """`loss` plus DSE's weight times -DSE of `dense` (one (n, P, D) tensor of this rank's images per view; `valid`,
        one (n, P) per view, marks padding: solo.losses.dse_score) where DSE is on (DSEOption), its value kept for
        `metrics`; `loss` as it is otherwise."""
        if self.dse is None:
            return loss
        term = dse_term(self, dense, self.dse, valid)
        self.dse_loss = term.detach()
        return loss + self.dse.dse_weight * term

    def encode(self, batch: dict) -> dict:
        """The per-sample part of forward (the encoders), as a dict of (batch, ...) tensors or lists of them.

        Under trainer.accumulate=k it runs micro-batch by micro-batch; `batch_loss` then runs on all of them."""
        raise NotImplementedError(f"method={self.name} has no encode/batch_loss split")

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        """What couples the samples (projector BatchNorm, the loss) on `encode`'s output for the whole batch."""
        raise NotImplementedError(f"method={self.name} has no encode/batch_loss split")

    def forward(self, batch: dict) -> dict:
        return self.batch_loss(self.encode(batch), batch)

    @classmethod
    def can_accumulate(cls) -> bool:
        return cls.encode is not Method.encode and cls.forward is Method.forward

    def prepare_step(self, index: int, total_steps: int) -> None:
        """The host's part of optimizer step `index` (0-based), before it runs: schedules written in place into the
        method's device tensors (an EMA teacher's momentum for the update after this step, DINO's teacher
        temperature), so that a compiled step reads them as inputs; and work that reads the host between two steps
        (DeepClusterV2's k-means at an epoch's start)."""

    def after_optimizer_step(self) -> None:
        """The device's part after every optimizer update: EMA teachers (with prepare_step's momentum), SwAV's
        prototypes normalised. Part of the step that trainer.compile=step captures: no host reads, nothing that
        changes with the step but tensors."""

    def metrics(self) -> dict[str, torch.Tensor]:
        """Scalars to log besides the loss, as tensors (read at the logging interval, not every step): DSE's term where
        it is on (with_dse), to which a subclass adds its own."""
        return {"train/dse_loss": self.dse_loss} if hasattr(self, "dse_loss") else {}

    def ema_momentum(self) -> float | torch.Tensor:
        """The momentum of this step's EMA update, as prepare_step set it: inside a compiled step the device tensor
        `teacher_momentum` (an input: a number would be a constant, another graph at every step), else the host's
        number `momentum` (torch's foreach update takes a number in one launch; a tensor it would read on the host)."""
        return self.teacher_momentum if torch.compiler.is_compiling() else self.momentum

    def classifier(self, probe: nn.Module | None) -> nn.Module | None:
        """The linear layer whose accuracy on the backbone's val features is `val/acc1` (solo.train.evaluator): the
        online probe; a method with a head of its own returns that."""
        return probe

    def val_health(self, embedded: torch.Tensor, loader, device, autocast) -> dict[str, float]:
        """Health metrics of its own on the val split (`loader`), given `embedded`, the embeddings the loss sees of every
        val sample in dataset order, the same on every rank (solo.train.evaluator): a distilled student's agreement with
        its teacher. None by default."""
        return {}


def encode_views(
    encoder: nn.Module,
    views: list[torch.Tensor],
    *per_view: list,
    forward: Callable | None = None,
    per_view_statistics: bool = True,
) -> list:
    """[forward(view, *its own inputs) for each view] (`forward` defaults to `encoder`; `per_view`: lists of inputs
    with one entry per view, such as each view's patch mask). An encoder without BatchNorm (a ViT: its LayerNorm is
    per token) gives each sample the same output in any batch: the views of one size, with their inputs, are
    concatenated and go through one call (fewer kernels; under FSDP one all-gather per block, not one per view),
    rows j of it sample j % n of view j // n, as per-sample randomness (solo.backbones.stochastic) reads them.

    Which rows a BatchNorm takes its statistics over is part of the method. By default each view keeps its own, as
    the references that call the backbone once per view (BYOL, Barlow Twins, VICReg): where its BatchNorms take row
    groups (the trainer's models: solo.distributed.batchnorm.group_batchnorms, solo's global BatchNorm) the views of
    one size go through one call too, each view a group of rows with its own statistics (with solo's global BatchNorm,
    one collective per layer for all of them); otherwise (plain BatchNorms, in your own loop) each view goes through a
    call of its own. `per_view_statistics=False`: the views of one size share their statistics in one call without
    row groups, as the references that run a batch's views together (SwAV's and DINO's one call per crop size).
    `forward` may return a list of tensors (a nested head's levels): each view gets its list."""
    forward = forward or encoder
    inputs = list(zip(views, *per_view))
    has_batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in encoder.modules())
    grouped = per_view_statistics and has_batchnorm
    if grouped and not normalises_row_groups(encoder):
        return [forward(*args) for args in inputs]
    out = []
    for _, same_size in itertools.groupby(inputs, key=lambda args: args[0].shape[1:]):
        same_size = list(same_size)
        if len(same_size) == 1:
            out.append(forward(*same_size[0]))
            continue
        with row_groups(encoder, len(same_size)) if grouped else contextlib.nullcontext():
            joined = forward(*(torch.cat(column) for column in zip(*same_size)))
        sizes = [len(args[0]) for args in same_size]
        if isinstance(joined, torch.Tensor):
            out += joined.split(sizes)
        else:
            out += [list(parts) for parts in zip(*(levels.split(sizes) for levels in joined))]
    return out


def make_teacher(module: nn.Module) -> nn.Module:
    """A copy of `module` that no optimizer trains, with no stochastic depth or dropout (as the references' teachers
    are built): the start of an EMA teacher."""
    teacher = without_randomness(copy.deepcopy(module))
    teacher.requires_grad_(False)
    return teacher


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float | torch.Tensor) -> None:
    """teacher <- momentum * teacher + (1 - momentum) * student, for the parameters (buffers such as
    BatchNorm statistics are the teacher's own, updated by its forward); `momentum` a number or a 0-dim tensor on the
    device (what a compiled step reads). Under FSDP, sharded parameters (DTensors) and whole ones (a ViT's tokens,
    see solo.train.distribute) are updated apart: one foreach call cannot mix them."""
    pairs = list(zip(teacher.parameters(), student.parameters()))
    for sharded in (True, False):
        group = [(t, s.detach()) for t, s in pairs if isinstance(t, DTensor) == sharded]
        if group:
            torch._foreach_lerp_([t for t, _ in group], [s for _, s in group], 1.0 - momentum)


def cosine_momentum(base: float, final: float, step: int, total_steps: int) -> float:
    """The teacher momentum after `step` of `total_steps` optimizer steps: from `base` towards `final` on a half
    cosine (BYOL, MoCo v3, DINO)."""
    return final - (final - base) * (math.cos(math.pi * min(step, total_steps) / total_steps) + 1) / 2


def mlp(dims: list[int], *, last_bn: bool = False, activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear -> BatchNorm -> `activation` blocks, then a final Linear (optionally followed by a plain BatchNorm)."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-2], dims[1:-1]):
        layers += [nn.Linear(d_in, d_out, bias=False), nn.BatchNorm1d(d_out), activation()]
    layers.append(nn.Linear(dims[-2], dims[-1], bias=not last_bn))
    if last_bn:
        layers.append(nn.BatchNorm1d(dims[-1], affine=False))
    return nn.Sequential(*layers)


@dataclass
class KoLeoOption:
    """DINOv2's KoLeo regulariser (Sablayrolles et al., 2019) as an option of a method of views: `koleo_weight` times
    the sum over the views of KoLeo on the backbone's features (DINOv2's class tokens; pooled features of a CNN), each
    row's nearest neighbour sought in the global batch (solo.losses.koleo_loss). 0, the default, leaves the method as
    its paper has it."""

    koleo_weight: float = ruled(0.0, NON_NEGATIVE)


@dataclass
class CO2Option:
    """CO2's consistency regulariser (Wei, Wang, Shen and Yuille, 2021; lightly's `CO2Regularizer`) as an option of a
    contrastive method: `co2_weight` (0: off) times the symmetric KL divergence between how a view's embedding and the
    other view's score the negatives (solo.losses.co2_loss), at `co2_temperature`."""

    co2_weight: float = ruled(0.0, NON_NEGATIVE)  # CO2's alpha
    co2_temperature: float = ruled(0.05, POSITIVE)  # CO2's softmaxes' temperature (lightly's default)


def co2_term(z1: torch.Tensor, z2: torch.Tensor, cfg: CO2Option) -> torch.Tensor:
    """`cfg.co2_weight` times CO2 with the global batch's other samples' embeddings as the negatives, each view's
    embedding against the other's (the other a target), the two directions' mean: SimCLR's, DCL's and MACL's."""
    t = cfg.co2_temperature
    return cfg.co2_weight * (co2_batch_loss(z1, z2, t) + co2_batch_loss(z2, z1, t)) / 2


@dataclass
class DSEOption:
    """The DSE regulariser (Dai et al., 2025; lightly's `DSERegularizer`) as an option of a method with dense tokens:
    `dse_weight` (0: off) times -DSE of the tokens the method names (DINOv2's student patch tokens of the global
    crops, MAE's encoded visible patches), k-means with `dse_local_clusters` per image and `dse_global_clusters` per
    group of dse_global_clusters // dse_local_clusters images, over the global batch (solo.losses.dse_score). A method
    that takes it sets `draws = None` when it is on, for the trainer's per-step draws (`dse_term`)."""

    dse_weight: float = ruled(0.0, NON_NEGATIVE)
    dse_local_clusters: int = ruled(3, AT_LEAST_ONE)
    dse_global_clusters: int = ruled(24, AT_LEAST_ONE)


def dse_term(
    method: nn.Module, tokens: list[torch.Tensor], cfg: DSEOption, valid: list[torch.Tensor] | None = None
) -> torch.Tensor:
    """-DSE of `tokens` (one (n, P, D) tensor of this rank's images per view; `valid` marks padding), its k-means++
    drawn from the method's uniforms of the step (hashed from run and step on the device: alike on every rank)."""
    return -dse_score(tokens, cfg.dse_local_clusters, cfg.dse_global_clusters, step_uniforms(method, "dse"), valid)


class TwoViewMethod(Method):
    """Two views through the backbone and `self.projector`; subclasses give `loss(z1, z2)`."""

    # Each view's own BatchNorm statistics in the backbone and the projector, as the references that call them once
    # per view (Barlow Twins, VICReg); False: both views' together, as those that run the views in one call (SimCLR's
    # and SupCon's official code).
    per_view_statistics: ClassVar[bool] = True

    def loss(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, batch: dict) -> dict:
        return self.encode_backbone(batch["views"], per_view_statistics=self.per_view_statistics)

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        loss = self.loss(*self.project([f1, f2]))
        return self.view_outputs(loss, [f1, f2], batch, encoded.get("dense"))

    def project(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """The views' projections, in one call (with the backbone's BatchNorm convention)."""
        return encode_views(self.projector, features, per_view_statistics=self.per_view_statistics)


@dataclass
class ExpanderConfig(DSEOption, KoLeoOption):
    """The projector ("expander") of Barlow Twins and VICReg: two hidden BatchNorm layers, then the output."""

    name: str = ""
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    proj_output_dim: int = ruled(2048, AT_LEAST_ONE)


class ExpanderMethod(TwoViewMethod):
    """A two-view method whose projector is `ExpanderConfig`'s MLP: Barlow Twins, VICReg."""

    def __init__(self, backbone: nn.Module, feature_dim: int, cfg: ExpanderConfig):
        super().__init__(backbone, feature_dim)
        self.projector = mlp([feature_dim, cfg.proj_hidden_dim, cfg.proj_hidden_dim, cfg.proj_output_dim])
        self.take_regularisers(cfg)


class MomentumTwoViewMethod(Method):
    """Two views; for each, the student (backbone -> projector -> predictor) predicts the momentum teacher's output
    (a copy of backbone -> projector, moved towards the student after every optimizer step) on the other view:
    BYOL, MoCo v3. Subclasses give `loss(prediction, target)`. The teacher's BatchNorms use global-batch
    statistics too, so its outputs, and so the loss, are the same on any number of processes."""

    teachers = ("teacher",)
    sync_teacher_batchnorm = True

    def __init__(
        self,
        backbone,
        feature_dim: int,
        projector: nn.Module,
        predictor: nn.Module,
        base_momentum: float,
        final_momentum: float,
    ):
        super().__init__(backbone, feature_dim)
        self.projector, self.predictor = projector, predictor
        self.teacher = make_teacher(nn.ModuleList([backbone, projector]))
        self.base_momentum, self.final_momentum = base_momentum, final_momentum
        self.momentum = base_momentum
        self.register_buffer("teacher_momentum", torch.tensor(base_momentum), persistent=False)

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, batch: dict) -> dict:
        with torch.no_grad():
            teacher = encode_views(self.teacher[0], batch["views"])
        return {**self.encode_backbone(batch["views"]), "teacher": teacher}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        p1, p2 = encode_views(nn.Sequential(self.projector, self.predictor), [f1, f2])
        with torch.no_grad():
            t1, t2 = encode_views(self.teacher[1], encoded["teacher"])
        return self.view_outputs(self.pair_loss(p1, p2, t1, t2), [f1, f2], batch, encoded.get("dense"))

    def pair_loss(self, p1: torch.Tensor, p2: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
        """The loss of the student's predictions `p1`, `p2` against the teacher's outputs `t1`, `t2` of the two views
        (each prediction against the other view's); methods with state (queues) update it here, after the loss."""
        return self.loss(p1, t2) + self.loss(p2, t1)

    def prepare_step(self, index: int, total_steps: int) -> None:
        # The momentum of the update after this step follows the schedule at the steps then done, as in BYOL's code.
        self.momentum = cosine_momentum(self.base_momentum, self.final_momentum, index + 1, total_steps)
        self.teacher_momentum.fill_(self.momentum)

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.projector]), self.ema_momentum())

    def metrics(self) -> dict[str, torch.Tensor]:
        return {**super().metrics(), "train/teacher_momentum": torch.tensor(self.momentum)}


class SiameseMethod(Method):
    """Two views through one network, backbone -> projector -> predictor, with no teacher: each view's prediction
    regresses onto the other view's projection, which takes no gradient (SimSiam), or onto its neighbour in a support
    set (NNSiam, NNCLR). Subclasses give `pair_loss(p1, p2, z1, z2)`."""

    def __init__(self, backbone, feature_dim: int, projector: nn.Module, predictor: nn.Module):
        super().__init__(backbone, feature_dim)
        self.projector, self.predictor = projector, predictor

    def pair_loss(self, p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, batch: dict) -> dict:
        return self.encode_backbone(batch["views"])

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        f1, f2 = encoded["features"]
        z1, z2 = encode_views(self.projector, [f1, f2])
        p1, p2 = encode_views(self.predictor, [z1, z2])
        return self.view_outputs(self.pair_loss(p1, p2, z1, z2), [f1, f2], batch, encoded.get("dense"))


def with_group_settings(groups: list[dict], params, **settings) -> list[dict]:
    """`groups` with `params` moved to groups of their own that carry `settings` (solo.optim's group keys:
    `frozen_steps`, `static_lr`) besides their group's other settings."""
    moved = {id(p) for p in params}
    out = []
    for group in groups:
        kept = [p for p in group["params"] if id(p) not in moved]
        chosen = [p for p in group["params"] if id(p) in moved]
        out += [{**group, "params": kept}] if kept else []
        out += [{**group, "params": chosen, **settings}] if chosen else []
    return out
