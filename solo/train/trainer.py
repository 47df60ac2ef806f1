"""Pretraining: build the components (model, data, step, evaluator, checkpointer, logger), then run the loop."""

from __future__ import annotations

import logging
import os
import random
import time
import warnings
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from solo.backbones import WHERE_BLOCKS_ARE, blocks_of, build_backbone, feature_width
from solo.backbones.stochastic import Draws
from solo.backbones.vit import with_nothing_removed
from solo.config import changed_keys, check_required, plain, resume_policy, validate_pretrain
from solo.data.decode import SkippedImages
from solo.data.sampling.seeding import sample_seed
from solo.data.sampling.source import DataSource, cores_per_process, loader_workers
from solo.distributed import DistEnv, batch_sizes, world_size
from solo.distributed.checkpoint import Checkpoints, find_checkpoints
from solo.distributed.env import process_group
from solo.distributed.run_dir import hold_run_dir
from solo.dtypes import full_precision
from solo.errors import CheckpointError, ConfigError, DataError, Interrupted, NotFound, SoloError
from solo.eval.health import alignment_squares, collapse, lidar, lidar_sums
from solo.loggers import Loggers
from solo.methods import METHODS, build_method, create_method
from solo.methods.distill import FrozenTeacher
from solo.optim import build_optimizer, layer_decay, scaled_lr, warmup_cosine
from solo.train import estimates
from solo.train.distribute import checkpoint_blocks, compile_model, distribute
from solo.train.evaluator import Evaluator
from solo.train.loaders import Splits, build_loaders, build_splits
from solo.train.preemption import Preemption, requeue_slurm_job
from solo.train.state import Checkpointer, ModelState, OptimizerState, RNGState
from solo.train.step import TrainStep, merge_encoded, precision_context
from solo.zoo.pretrained import resolve
from solo.zoo.teachers import load_teacher
from solo.zoo.weights import Pretrained, load_strict

log = logging.getLogger("solo")


class PretrainModel(nn.Module):
    """The method and its online linear probe, trained together under one DDP wrapper (a solo.train.step.Trainable)."""

    def __init__(self, method: nn.Module, num_classes: int | None):
        super().__init__()
        self.method = method
        self.draws: Draws | None = None  # the trainer's (solo.backbones.stochastic): where each forward draws
        self.probe = None
        method.feeds_probe = bool(num_classes)
        if num_classes:
            # Standardised features, as for MAE's linear probing: the probe's lr need not track the feature scale.
            self.probe = nn.Sequential(
                nn.BatchNorm1d(method.feature_dim, affine=False), nn.Linear(method.feature_dim, num_classes)
            )

    def forward(self, batch: dict, *, encoded: dict | None = None, last: dict | None = None) -> dict:
        """The method's outputs on `batch` and the probe's loss. Gradient accumulation calls it with the whole
        batch's `encoded` (the method's encode output), or with `encoded` of all micro-batches but the `last`,
        which is encoded here, with its graph (see solo.train.step)."""
        if last is not None:
            with self.per_sample_draws(last):
                encoded = merge_encoded([encoded, self.method.encode(last)])
        with self.per_sample_draws(batch):
            out = self.method(batch) if encoded is None else self.method.batch_loss(encoded, batch)
        if self.probe is not None:
            logits = self.probe(out["features"].detach())  # the probe must not shape the representation
            # The mean over the global batch (W times this rank's share, as the losses): exact for uneven ranks.
            labels = out["labels"]
            total = sum(batch_sizes(len(labels), labels.device))
            out["probe_loss"] = F.cross_entropy(full_precision(logits), labels, reduction="sum") * (
                world_size() / total
            )
        return out

    def encode(self, batch: dict) -> dict:
        with self.per_sample_draws(batch):
            return self.method.encode(batch)

    def per_sample_draws(self, batch: dict):
        """The draws inside the model (stochastic depth, dropout) per sample of `batch` (its "index")."""
        return nullcontext() if self.draws is None else self.draws.on(batch.get("index"))

    def clipped_parameters(self):
        return self.method.parameters()  # the probe's gradients are its own: optim.grad_clip leaves them alone

    def prepare_step(self, index: int, total_steps: int) -> None:
        self.method.prepare_step(index, total_steps)

    def after_optimizer_step(self) -> None:
        self.method.after_optimizer_step()

    def teachers(self) -> tuple[nn.Module, ...]:
        return tuple(getattr(self.method, name) for name in self.method.teachers)

    def towers(self) -> list[nn.Module]:
        """The modules called on their own (backbones, heads, teachers' parts, the probe): FSDP's units."""
        parts = []
        for child in [*self.method.children(), self.probe]:
            parts += (
                list(child.values() if isinstance(child, nn.ModuleDict) else child)
                if isinstance(child, (nn.ModuleList, nn.ModuleDict))
                else [child]
            )
        return [p for p in parts if p is not None]

    def backbones(self) -> list[nn.Module]:
        return [self.method.backbone]


def build_model(cfg: DictConfig, num_classes: int | None, backbone: nn.Module | None = None) -> PretrainModel:
    """The method of `cfg` with its probe; around `backbone` when given (fine-tuning: weights to start from). A method
    that learns from a frozen pretrained teacher gets it loaded here (solo.zoo.teachers), where the zoo can be read."""
    teacher = load_teacher(cfg.method, cfg.data) if METHODS[cfg.method.name].target.pretrained_teacher else None
    if backbone is None:
        return PretrainModel(create_method(cfg.method, cfg.backbone, teacher), num_classes)
    width = feature_width(backbone, cfg.data.image_size)
    return PretrainModel(build_method(cfg.method, backbone, width, teacher), num_classes)


def build_optimizer_for(model: PretrainModel, optim_cfg, lr: float):
    """The method's parameter groups, and the probe's with its own lr (no weight decay, no LARS adaptation)."""
    groups = model.method.param_groups(optim_cfg.weight_decay, optim_cfg.exclude_bias_and_norm)
    if optim_cfg.layer_decay is not None:
        backbone = model.method.backbone
        blocks = blocks_of(backbone)
        if not blocks:
            raise ConfigError(
                f"optim.layer_decay={optim_cfg.layer_decay} scales the learning rate by depth, and the backbone "
                f"{type(backbone).__name__} has no blocks where solo looks for them ({WHERE_BLOCKS_ARE}): unset "
                "optim.layer_decay, or use a backbone that keeps its blocks there"
            )
        groups = layer_decay(groups, backbone, blocks, optim_cfg.layer_decay)
    if model.probe is not None:
        groups.append(
            {
                "params": list(model.probe.parameters()),
                "weight_decay": 0.0,
                "lars_exclude": True,
                "lr_scale": optim_cfg.probe_lr / optim_cfg.lr,
            }
        )
    return build_optimizer(optim_cfg, groups, lr)


def pretrain(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Run (or resume) the pretraining described by `cfg` in `run_dir`; returns the last metrics."""
    cfg = validate_pretrain(cfg)
    check_required(cfg)
    with process_group() as (env, device), hold_run_dir(run_dir):  # before the run writes into run_dir
        return Trainer(cfg, Path(run_dir), env, device).fit()


class Trainer:
    """Builds the components of a run from its validated config, then `fit()` runs (or resumes) it; `backbone`, when
    given, is the image encoder to train instead of a new one of cfg.backbone (fine-tuning's pretrained weights)."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, env: DistEnv, device: torch.device, backbone: nn.Module | None = None
    ):
        t = self.t = cfg.trainer
        self.cfg, self.run_dir, self.env, self.device = cfg, run_dir, env, device
        self.say = log.info if env.is_main else (lambda *a, **k: None)
        if not env.is_main:  # every rank runs the same code: its warnings are rank 0's, printed once there
            warnings.simplefilter("ignore")
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        self._set_threads()
        splits = self._build_splits()
        self.model = self._build_model(splits, backbone)
        self.source = self._build_data(splits)
        self.lr = scaled_lr(cfg.optim, self.source.global_batch)
        self.total_steps = t.max_steps or t.max_epochs * self.source.steps_per_epoch
        self.model.method.set_schedule(self.source.steps_per_epoch, self.total_steps)
        self._check_cost()
        optimizer = self._build_step()
        self.warned_collapse = False
        self.eval_every = t.eval_every or (None if t.max_steps else 1)  # epochs; None: at the end only
        self.evaluator = Evaluator(
            self.model,
            self.loaders,
            splits.num_classes,
            knn_k=t.knn_k,
            knn_temperature=t.knn_temperature,
            device=device,
            autocast=self.train_step.autocast,
            skipped=self.skipped,
        )
        self.checkpointer = self._build_checkpointer(optimizer)
        self.step, self.logger, self.last_metrics = 0, None, {}

    def _build_splits(self) -> Splits:
        """The train and val base datasets; a method that learns from labels refuses data without them."""
        method, d = METHODS[self.cfg.method.name].target, self.cfg.data
        splits = build_splits(d, self.env, self.t.seed, pairs=method.inputs == "image_text")
        if method.needs_labels and not splits.num_classes:
            raise ConfigError(
                f"method={method.name} learns from the labels, and data={d.name}'s train split has "
                "none: give it labelled data (class folders, a label column)"
            )
        return splits

    def _build_data(self, splits: Splits) -> DataSource:
        """The loaders (`self.loaders`) of what the method's batches carry; the train source, which hands each batch
        to the device."""
        t = self.t
        self.loaders = build_loaders(
            splits,
            self.cfg.data,
            self.cfg.augmentation.views,
            self.env,
            seed=t.seed,
            spec=self.model.method.batch_spec(),
            knn=t.knn_k > 0,
            device=self.device,
            zero_shot_folder=t.zero_shot_folder,
        )
        source = self.loaders.train
        # Views made on the device: the next batch's are launched from a thread of their own while this step launches
        # its kernels, where one thread launched both in turn (on a GPU, the host's launches bound the step).
        source.prepare_with(
            self._to_device, ahead=self.loaders.device_views is not None and source.loader.num_workers > 0
        )
        self.skipped = SkippedImages(self.say) if self.cfg.data.on_bad_image == "skip" else None
        self.found_skipped: list[int] = []  # train images skipped since the last log (_note_skipped)
        self._say_checked()
        return source

    def _check_cost(self) -> None:
        """The step's cost before the first: its peak memory against the device's (trainer.memory_check), and on a
        CPU with data of a user's size, the time a step will take."""
        say_cost = self.device.type == "cpu" and self.cfg.data.name not in SIZED_FOR_A_CPU
        probe = self._probe_batch() if self.t.memory_check or say_cost else None  # read once for both estimates
        if self.t.memory_check:
            self._check_memory(probe)
        if say_cost:
            self._say_cpu_cost(probe)

    def _build_step(self) -> torch.optim.Optimizer:
        """The model compiled and distributed as trainer.* say, its optimizer and schedules, and the training step
        (`self.train_step`); the optimizer."""
        t, cfg, model = self.t, self.cfg, self.model
        if str(t.compile) in ("blocks", "backbone"):
            compile_model(model, str(t.compile))
        keep_local = () if model.method.sync_teacher_batchnorm else model.teachers()
        forward = distribute(
            model,
            self.device,
            strategy=str(t.strategy),
            sync_batchnorm=t.sync_batchnorm,
            keep_local=keep_local,
            reshard_after_forward=t.reshard_after_forward,
            precision=str(t.precision),
        )
        optimizer = build_optimizer_for(model, cfg.optim, self.lr)
        warmup_steps = min(round(cfg.optim.warmup_epochs * self.source.steps_per_epoch), self.total_steps)
        cosine = partial(warmup_cosine, total_steps=self.total_steps)
        self.schedule = partial(
            cosine,
            warmup_steps=warmup_steps,
            base_lr=self.lr,
            warmup_start_lr=cfg.optim.warmup_start_lr,
            final_lr=cfg.optim.final_lr,
        )
        weight_decay = None
        if cfg.optim.weight_decay_end is not None:
            weight_decay = partial(
                cosine, warmup_steps=0, base_lr=cfg.optim.weight_decay, final_lr=cfg.optim.weight_decay_end
            )
        self.train_step = TrainStep(
            forward,
            model,
            optimizer,
            precision=str(t.precision),
            device=self.device,
            schedule=self.schedule,
            total_steps=self.total_steps,
            grad_clip=cfg.optim.grad_clip,
            accumulate=t.accumulate,
            draws=model.draws,
            compiled=str(t.compile) == "step",
            weight_decay=weight_decay,
        )
        return optimizer

    def _build_checkpointer(self, optimizer: torch.optim.Optimizer) -> Checkpointer:
        """What a checkpoint holds: the model's and the optimizer's tensors as each rank holds them, each rank's random
        generators, the step's and the data's positions, and rank 0's config."""
        t, model = self.t, self.model
        sharded = {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer)}
        components = {"scaler": self.train_step, "data": self.source}
        info = {"global_batch": self.source.global_batch, "config": plain(self.cfg)}
        checkpoints = Checkpoints(self.run_dir / "checkpoints", t.keep_checkpoints, self.env.is_main)
        generators = RNGState(self.device, self.env.rank, t.seed)
        return Checkpointer(checkpoints, sharded, generators, components, info)

    def _build_model(self, splits, backbone: nn.Module | None) -> PretrainModel:
        """The model, built alike on every rank (a classifier's head sized by the data's classes unless set), on the
        device in the run's precision, with its per-sample draws."""
        t, device = self.t, self.device
        if self.cfg.method.get("num_classes") == 0:  # a classifier's head, sized by the data unless set
            self.cfg.method.num_classes = splits.num_classes
            self.say(f"method.num_classes={splits.num_classes}: the train split's classes (a number chooses)")
        start = self._starting_weights()
        if start is not None and start.contents == "backbone":  # before the method copies it into its teachers
            backbone, _ = build_backbone(self.cfg.backbone)
            self._load_start(backbone, with_nothing_removed(backbone, start.state), "backbone")
        model = build_model(self.cfg, splits.num_classes if t.probe else None, backbone)
        if start is not None and start.contents == "model":
            self._load_start(model.method, start.state, f"{self.cfg.method.name} model")
        for teacher in (m for m in model.modules() if isinstance(m, FrozenTeacher)):
            renormalised = ", the views renormalised to its own statistics" if teacher.renormalise else ""
            self.say(
                f"teacher: method.teacher={teacher.source}, frozen, features {teacher.width} wide{renormalised} "
                "(method.teacher=<a zoo name, run, weights file, timm model or open_clip:model> chooses another)"
            )
        model.method.set_data(len(splits.train))
        # From here each rank draws its own stream, so that randomness left rank-local never repeats another rank's
        # draws (the step's own are per sample: solo.backbones.stochastic).
        torch.manual_seed(sample_seed(t.seed, 0, self.env.rank, 0))
        random.seed(sample_seed(t.seed, 0, self.env.rank, 1))
        self.channels_last = t.channels_last and device.type == "cuda"
        self.dtype = torch.float64 if t.precision == "64" else torch.float32
        model.to(
            device, dtype=self.dtype, memory_format=torch.channels_last if self.channels_last else torch.preserve_format
        )
        model.draws = Draws(t.seed, device).attach(model)
        if t.activation_checkpointing:
            checkpoint_blocks(model)
        return model

    def _starting_weights(self) -> Pretrained | None:
        """trainer.init_from's weights (every rank reads them whole), unless the run resumes from its own checkpoints,
        which replace every weight."""
        source = self.t.init_from
        if source is None or find_checkpoints(self.run_dir / "checkpoints").intact is not None:
            return None
        try:
            start = resolve(source, contents="model")
        except NotFound:
            raise ConfigError(
                f"trainer.init_from={source}: no such pretraining run directory, training checkpoint, solo weights file "
                "or zoo name (python -m solo.zoo list names them)"
            ) from None
        except (SoloError, ValueError, KeyError, FileNotFoundError) as e:
            raise ConfigError(f"trainer.init_from={source}: {e}") from None
        if start.contents == "model" and start.method["name"] != self.cfg.method.name:  # another method's run
            start = replace(start, state=start.backbone_state(), contents="backbone")
        return start

    def _load_start(self, module: nn.Module, state: dict, what: str) -> None:
        source = self.t.init_from
        try:
            load_strict(module, state, f"the {what} of trainer.init_from={source}")
        except KeyError as e:
            raise ConfigError(
                f"{e.args[0]}; start from a run of this method with the same method and backbone settings, or from "
                "another method's run, zoo name or weights file with this backbone's settings"
            ) from None
        afresh = "the method's heads, optimizer and schedule" if what == "backbone" else "its optimizer and schedule"
        self.say(f"init_from: the {what} of {source} ({len(state)} tensors); {afresh} start afresh (trainer.init_from)")

    def _set_threads(self) -> None:
        """torch's intra-op threads: trainer.threads; else OMP_NUM_THREADS where it is set (by you; by torchrun, 1 per
        process when it starts several and you did not; by solo-pretrain --nproc_per_node, each process's share); else
        the process's share of the cores: all of it on the CPU, where the model computes (its data workers mostly
        wait: bench/threads.py), less the data workers on a GPU, where the host's work is theirs."""
        workers, cores = loader_workers(self.cfg.data.num_workers), cores_per_process()
        environment = os.environ.get("OMP_NUM_THREADS", "")
        if self.t.threads:
            threads, how = self.t.threads, "trainer.threads"
        elif environment.isdigit() and int(environment) > 0:
            threads, how = int(environment), "OMP_NUM_THREADS"
        elif self.device.type == "cpu":
            threads, how = cores, "the process's cores, as the model computes on them"
        else:
            threads, how = max(1, cores - workers), f"the process's {cores} cores less its data workers"
        torch.set_num_threads(threads)
        self.say(f"threads: {threads} for torch, {workers} data workers per process ({how}; trainer.threads sets it)")

    def _say_checked(self) -> None:
        """How long the start-up check took (data read from encoded files); with data.on_bad_image=skip, the unreadable
        images named (self.skipped, which names those found later too)."""
        checked = self.loaders.checked
        if checked.count:
            rest = checked.total - checked.count
            self.say(
                f"data: {checked.count} of {checked.total} images decoded at the start in {checked.seconds:.1f} s "
                + (
                    f"(data.check_images={self.cfg.data.check_images}; data.check_images=all decodes all, "
                    f"about {checked.seconds * checked.total / checked.count:.0f} s)"
                    if rest
                    else f"(data.check_images={self.cfg.data.check_images})"
                )
            )
        if self.skipped is not None:
            self.skipped.name(checked.unreadable)

    def _note_skipped(self, batch: dict) -> None:
        """Remember the train images the batch's samples skipped (data.on_bad_image=skip), to name at the next log."""
        length = len(self.loaders.train.loader.dataset)
        rows = batch["skipped"] > 0
        for index, count in zip(batch["index"][rows].tolist(), batch["skipped"][rows].tolist()):
            self.found_skipped += [(index + k) % length for k in range(count)]

    def _name_skipped(self) -> None:
        """Name the train images skipped since the last log, found on any rank (every rank calls it)."""
        taken = len(self.found_skipped)  # the read-ahead thread may append meanwhile
        found = self.found_skipped[:taken]
        del self.found_skipped[:taken]
        if self.env.world_size > 1:
            everyone = [None] * self.env.world_size
            dist.all_gather_object(everyone, found)
            found = [i for ours in everyone for i in ours]
        if self.env.is_main:
            self.skipped.find(self.loaders.read_train, found)

    def _probe_batch(self) -> dict:
        """The first PROBE_BATCH train samples, on the device: what the step's cost is estimated on."""
        dataset = self.loaders.train.loader.dataset
        keys = [(0, i) for i in range(min(estimates.PROBE_BATCH, len(dataset)))]
        return self._to_device(self.loaders.train.loader.collate_fn([dataset[k] for k in keys]))

    def _say_cpu_cost(self, probe: dict) -> None:
        """On a CPU, what a step will take, timed on a probe batch, and what to lower: sizes for a GPU take minutes."""
        d = self.cfg.data
        seconds = estimates.step_seconds(
            self.model, probe, d.batch_size, precision_context(str(self.t.precision), self.device)[0]
        )
        if seconds is None:
            return
        self.say(
            f"cpu: a step of {d.batch_size} images of {d.image_size} px per process will take about "
            f"{duration(seconds)}, the run's {self.total_steps} steps about {duration(seconds * self.total_steps)} "
            f"(timed on {estimates.PROBE_BATCH} images here); to go faster, lower data.image_size and data.batch_size, "
            "or train on a GPU"
        )

    def _check_memory(self, probe: dict) -> None:
        """Estimate the step's peak memory on a probe batch (solo.train.estimates); stop here if it cannot fit."""
        cfg, t = self.cfg, self.t
        found = estimates.estimate(
            self.model,
            probe,
            micro_batch=cfg.data.batch_size // t.accumulate,
            optimizer=cfg.optim.name,
            shards=self.env.world_size if t.strategy == "fsdp" else 1,
            device=self.device,
            autocast=precision_context(str(t.precision), self.device)[0],
            limit_gib=t.memory_limit_gib,
        )
        self.say(f"memory: the step needs {found.describe()} (trainer.memory_check)")
        estimates.check_fits(found, cfg, METHODS[cfg.method.name].target.can_accumulate())

    def _resume(self) -> bool:
        """Restore every component from the newest intact checkpoint, as trainer.resume says (solo.config.resume_policy);
        True if resumed. Rank 0 verifies the checkpoints and tells the others which one to read."""
        given = f"trainer.resume={str(self.t.resume).lower()}"
        policy = resume_policy(self.t.resume)
        found = self.checkpointer.checkpoints.find()
        if policy == "never":
            existing = found.intact or next((path for path, _ in found.damaged), None)
            if existing is not None:
                raise CheckpointError(
                    f"{existing} exists and {given}: choose a new hydra.run.dir or delete {self.run_dir}"
                )
            return False
        if found.damaged:
            if found.intact is None:
                raise CheckpointError(
                    f"{found.describe_damage()}; no older checkpoint is intact: start a new run (hydra.run.dir=...)"
                )
            if policy == "strict":
                raise CheckpointError(
                    f"{given}: {found.describe_damage()}; the newest intact checkpoint is {found.intact}: set "
                    "trainer.resume=auto to resume from it"
                )
            if self.env.is_main:
                log.warning(
                    f"warning: {found.describe_damage()}; resuming from {found.intact}, the newest intact checkpoint "
                    "(trainer.resume=auto; strict stops instead)"
                )
        last = found.intact
        if last is None:
            return False
        try:
            state = self.checkpointer.load(last)
        except Exception as e:
            raise CheckpointError(
                f"cannot load checkpoint {last}: {e}. Delete it to fall back to an older step-* checkpoint in "
                f"{last.parent}, or set trainer.resume=never with a new hydra.run.dir"
            ) from None
        check_resumable(state, self.cfg, self.source.global_batch, self.run_dir)
        try:
            self.step = self.checkpointer.restore(last, state)
        except Exception as e:  # e.g. tensors of other shapes: torch's reason is its message's last line
            reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            raise CheckpointError(
                f"cannot restore {last} into this run's model ({reason}): resume it with the values in "
                f"{self.run_dir / 'config.yaml'}, or start a new run in another directory (hydra.run.dir=...)"
            ) from None
        data = state["data"]
        self.say(f"resuming from {last} at step {self.step} (epoch {data['epoch']}, batch {data['batch_in_epoch']})")
        return True

    def _start(self) -> None:
        resumed = self._resume()
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.checkpointer.info["config"], self.run_dir / "config.yaml")
            self.logger = Loggers(
                self.run_dir, self.cfg.logger, self.checkpointer.info["config"], self.step if resumed else None
            )
        o, d = self.cfg.optim, self.cfg.data
        self.say(
            f"world size {self.env.world_size}, global batch {self.source.global_batch} ({d.batch_size} per process"
            + (
                f" in {self.t.accumulate} micro-batches of {d.batch_size // self.t.accumulate}"
                if self.t.accumulate > 1
                else ""
            )
            + "), "
            f"lr {o.lr} x {o.lr_scaling} scaling = {self.lr:.4g}, {self.source.steps_per_epoch} steps per epoch, "
            f"{self.total_steps} steps, run dir {self.run_dir}"
        )
        if self.eval_every is None:
            self.say(
                f"evaluation: at the end only, as trainer.max_steps={self.t.max_steps} sets the run's length "
                "(trainer.eval_every=N evaluates every N epochs too)"
            )

    @property
    def finished(self) -> bool:
        return self.step == self.total_steps

    def fit(self) -> dict:
        """Train to the end, or to a preemption signal (checkpointed); the last metrics. The preemption signals are
        caught only while it runs: their previous handlers are back when it returns or raises."""
        self.checked_step = None  # the step whose preemption check last began (_stop_requested)
        self.preemption = Preemption(list(self.t.preempt_signals), self.device, self._say_stopping)
        try:
            return self._fit()
        except KeyboardInterrupt:  # a second Ctrl-C (or the first, where SIGINT is not among trainer.preempt_signals)
            self.checkpointer.checkpoints.wait()
            last = self.checkpointer.checkpoints.last
            raise Interrupted(
                f"stopped by Ctrl-C during step {self.step + 1}, without a checkpoint of it; "
                + (
                    f"the last checkpoint is {last.resolve()}, where the same command resumes"
                    if last.exists()
                    else "no checkpoint was written: the same command starts the run again"
                )
            ) from None
        except RuntimeError as e:
            if "DataLoader worker" not in str(e) or not (
                "killed by signal" in str(e) or "exited unexpectedly" in str(e)
            ):
                raise  # a worker's own exception, re-raised by torch, is the data's error (solo.cli.user_message)
            raise DataError(  # the kernel's out-of-memory killer takes the largest process: often a worker
                f"data.num_workers={self.loaders.train.loader.num_workers}: a data-loading worker died ({e}); when the "
                "machine runs out of memory the kernel kills one (dmesg says 'Out of memory'). Use fewer workers "
                "(data.num_workers), a smaller data.batch_size or data.image_size, then run the same command to resume"
            ) from None
        finally:
            self.preemption.close()
            self.loaders.close()
            self.checkpointer.checkpoints.wait()  # the last checkpoint is on disk when fit returns or raises

    def _say_stopping(self, signal_name: str) -> None:
        """What a preemption signal does, said when it arrives: the run stops at the next step that checks for it."""
        every = self.t.log_every_steps
        # The next check after the last one begun: a signal that lands between a step's end and its check is read
        # there, one that lands after the flag was read waits for the next logging step.
        checked = self.step if self.checked_step is None else self.checked_step  # None: before the first step
        at = min(self.total_steps, (checked // every + 1) * every)
        self.say(
            f"{signal_name}: stopping after step {at} (signals are checked every trainer.log_every_steps={every} "
            "steps), with a checkpoint there; the same command resumes"
            + ("; Ctrl-C again stops at once, without it" if signal_name == "SIGINT" else "")
        )

    def _stop_requested(self) -> bool:
        self.checked_step = self.step  # before the flag is read: _say_stopping names the step that reads a signal
        return self.preemption.requested()

    def _fit(self) -> dict:
        self._start()
        start_step, started = self.step, time.perf_counter()
        self.checked_step = self.step
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            disable=not (self.env.is_main and self.t.progress_bar),
            dynamic_ncols=True,
        )
        with bar:  # closed on any exit, so that what is printed next starts a line of its own
            window = MetricsWindow(self.device)
            while self.step < self.total_steps:
                for batch in self.source:  # on the device (MapDataSource.prepare_with)
                    out = self.train_step(batch, self.step)
                    self.step += 1
                    logging_step = self.step % self.t.log_every_steps == 0 or self.step == self.total_steps
                    window.add(out, batch, with_lidar=logging_step)
                    bar.update(1)
                    # The host reads the device's numbers only here: losses, the non-finite check, the preemption flag.
                    if logging_step:
                        self._log(window.flush(), bar)
                        if self.step < self.total_steps and self._stop_requested():
                            bar.close()
                            return self._stop_for_preemption()
                    every = self.t.checkpoint_every_steps
                    if every and self.step % every == 0 and not self._epoch_done():
                        self._save()
                    if self.step == self.total_steps:
                        break
                self._end_epoch()
        if self.t.plots:
            self.evaluator.plot(self.run_dir, self.env.is_main)
        if start_step == self.total_steps:
            self.say(
                f"nothing to do: {self.checkpointer.checkpoints.last} already holds the finished run ({self.total_steps} steps)"
            )
        else:
            self._summary(self.step - start_step, time.perf_counter() - started)
        self._close()
        return self.last_metrics

    def _summary(self, steps: int, seconds: float) -> None:
        """The end-of-run lines: what was trained, how fast, the final metrics, and where everything is."""
        final = {k: v for k, v in self.last_metrics.items() if k.startswith("val/")}
        pictures = [p.name for p in (self.run_dir / "curves.png", self.run_dir / "embedding.png") if p.exists()]
        self.say(
            f"done: {steps} steps in {seconds / 60:.1f} min ({self.source.global_batch * steps / seconds:.0f} img/s)"
            + "".join(f", {k} {v:.4f}" for k, v in final.items())
            + f"\n  checkpoint {self.checkpointer.checkpoints.last}\n  metrics {self.run_dir / 'metrics.jsonl'}"
            + (f", plots {', '.join(pictures)}" if pictures else "")
        )

    def _save(self) -> None:
        self.train_step.check_finite()  # never a checkpoint from a step whose loss was not finite
        self.checkpointer.save(self.step)

    def _log(self, window: dict, bar) -> None:
        self.train_step.check_finite()
        losses, steps, elapsed = window["losses"], window["steps"], window["seconds"]
        metrics = {
            "step": self.step,
            "epoch": self.source.epoch,
            "train/loss": losses[0],
            "lr": self.schedule(self.step - 1),
            "train/img_per_s": self.source.global_batch * steps / elapsed,
        }
        if self.model.probe is not None:
            metrics["train/probe_loss"] = losses[1]
        if window["alignment"] is not None:
            metrics["train/alignment"] = window["alignment"]  # solo.eval.health.alignment_squares
        if window["lidar"] is not None:
            metrics["train/lidar"] = window["lidar"]  # solo.eval.health.lidar
        if self.skipped is not None:
            metrics["data/skipped_images"] = window["skipped"]  # unreadable images read in this window, all ranks
            if window["skipped"]:
                self._name_skipped()
            check_skipped(window["skipped"], self.source.global_batch * steps, self.cfg.data.name)
        metrics |= {k: float(v) for k, v in self.model.method.metrics().items()}
        self.last_metrics = metrics
        if self.logger:
            self.logger.log(metrics)
        bar.set_postfix(loss=f"{losses[0]:.4f}", img_s=f"{metrics['train/img_per_s']:.0f}")

    def _end_epoch(self) -> None:
        """At an epoch's end (or the last step): validate when due (trainer.eval_every, and at the end), log, move to
        the next epoch, checkpoint."""
        due = self.finished or (self.eval_every is not None and (self.source.epoch + 1) % self.eval_every == 0)
        val = self.evaluator() if due else {}
        if val:
            self.last_metrics = {"step": self.step, "epoch": self.source.epoch, **val}
            if self.logger:
                self.logger.log(self.last_metrics)
            self.say(f"epoch {self.source.epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in val.items()))
            collapsed = collapse(val)
            if collapsed and self.env.is_main and not self.warned_collapse:
                log.warning(f"epoch {self.source.epoch}: {collapsed}")
                self.warned_collapse = True  # once a run: a collapsed run stays so
        if self._epoch_done():
            self.source.set_epoch(self.source.epoch + 1)
        self._save()

    def _epoch_done(self) -> bool:
        return self.source.batch_in_epoch == self.source.steps_per_epoch

    def _stop_for_preemption(self) -> dict:
        self._save()
        self.checkpointer.checkpoints.wait()  # on disk before the job is requeued (which kills it) or exits
        self.say(f"{self.preemption.received or 'a signal on another rank'}: checkpoint written at step {self.step}")
        if self.env.is_main and self.t.requeue:
            self.say(requeue_slurm_job() or "not under SLURM: restart the same command to resume")
        self._close()
        return self.last_metrics

    def _close(self) -> None:
        if self.logger:
            self.logger.close()

    def _to_device(self, batch: dict) -> dict:
        if self.device.type == "cuda":  # the current device is per thread, and the read-ahead thread's is cuda:0
            with torch.cuda.device(self.device):
                return self._moved(batch)
        return self._moved(batch)

    def _moved(self, batch: dict) -> dict:
        if self.skipped is not None:
            self._note_skipped(batch)
        if self.loaders.device_views is not None:
            batch = self.loaders.device_views(batch, self.device)
        fmt = torch.channels_last if self.channels_last else torch.preserve_format

        def move(x):
            if isinstance(x, list):
                return [move(v) for v in x]
            if x.is_floating_point():
                return x.to(
                    self.device,
                    self.dtype,
                    non_blocking=True,
                    memory_format=fmt if x.dim() == 4 else torch.preserve_format,
                )
            return x.to(self.device, non_blocking=True)

        return {k: move(v) for k, v in batch.items()}


class MetricsWindow:
    """Training losses, skipped images and the views' alignment summed on the device between two logging steps (a few
    operations a step, whatever the batch), and LiDAR's sums of the steps asked for (the logging step's): read (one
    sync) only when logged."""

    def __init__(self, device: torch.device):
        # loss, probe loss, skipped images, the views' alignment summed over samples, its number of samples, LiDAR's
        # samples
        self.sums = torch.zeros(6, dtype=torch.float64, device=device)
        self.aligned = 0  # samples whose alignment this rank summed (counted on the host)
        self.lidar_sums, self.lidar_classes, self.lidar_views = None, 0, 0  # solo.eval.health.lidar_sums
        self.steps, self.start = 0, time.perf_counter()

    @torch.no_grad()
    def add(self, out: dict, batch: dict, with_lidar: bool = False) -> None:
        loss = out["loss"]
        values = [loss, out.get("probe_loss", loss).to(loss.dtype)]
        values.append(batch["skipped"].sum().to(loss.dtype) if "skipped" in batch else loss.new_zeros(()))
        views, features = batch.get("views", []), out.get("features")
        if features is not None and len(views) > 1 and len(features) >= 2 * len(views[0]):
            values.append(alignment_squares(features.to(loss.dtype), len(views[0])))  # solo.eval.health
            self.aligned += len(views[0])
        self.sums[: len(values)] += torch.stack(values)
        self.steps += 1
        sums = lidar_sums(features, len(views[0])) if with_lidar and features is not None and len(views) > 1 else None
        if sums is not None:
            self.lidar_sums = sums if self.lidar_sums is None else self.lidar_sums + sums
            self.lidar_classes += len(views[0])
            self.lidar_views = len(features) // len(views[0])

    def flush(self) -> dict:
        sums = self.sums.clone()
        sums[4], sums[5] = self.aligned, self.lidar_classes
        if dist.is_initialized():
            dist.all_reduce(sums)
        lidar_value = None
        if self.lidar_sums is not None:  # every rank has views (the trainer's batches are even), so every rank sums
            if dist.is_initialized():
                dist.all_reduce(self.lidar_sums)
            # Not from a step whose features are not finite: the trainer's non-finite check stops the run with its own
            # message after this flush.
            if sums[5] >= 2 and bool(self.lidar_sums.isfinite().all()):
                lidar_value = lidar(self.lidar_sums, int(sums[5]), self.lidar_views)
        losses = (sums[:2] / (self.steps * (dist.get_world_size() if dist.is_initialized() else 1))).tolist()
        window = {
            "losses": losses,
            "skipped": int(sums[2]),
            "alignment": float(sums[3] / sums[4]) if sums[4] > 0 else None,
            "lidar": lidar_value,
            "steps": self.steps,
            "seconds": time.perf_counter() - self.start,
        }
        self.sums.zero_()
        self.aligned, self.steps, self.start = 0, 0, time.perf_counter()
        self.lidar_sums, self.lidar_classes = None, 0
        return window


# data.on_bad_image=skip replaces an unreadable image by a readable one; past this share of a logging window's
# images, the data (or data.root / data.path) is wrong rather than a few files damaged.
MAX_SKIPPED_SHARE = 0.5


# The embedded digits and the generated test images: small enough for a CPU, so no word on a CPU step's cost.
SIZED_FOR_A_CPU = ("digits", "synthetic")


def duration(seconds: float) -> str:
    """`seconds` as a person says it: 40 s, 3.5 min, 2.1 h."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def check_skipped(skipped: int, images: int, dataset: str) -> None:
    if skipped > MAX_SKIPPED_SHARE * images:
        raise DataError(
            f"data={dataset}: {skipped} of the last {images} images read could not be read and were skipped "
            "(data.on_bad_image=skip); check the data's paths (data.root, data.path) and files"
        )


def check_resumable(state: dict, cfg: DictConfig, global_batch: int, run_dir: Path) -> None:
    """The checkpoint must have been trained with this run's configuration (but for SAFE_TO_CHANGE keys)
    and global batch (any world size)."""
    changed = changed_keys(state["config"], plain(cfg))
    other_data = [(old, new) for key, old, new in changed if key == "data.id"]
    if other_data:
        (old, new), *_ = other_data
        raise CheckpointError(
            f"{run_dir} holds a run trained on other data (data.id={old}, this run's data.id={new}): point data at "
            f"that run's files, or if they are the same files moved, resume with data.id={old}"
        )
    if changed:
        listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)
        raise CheckpointError(
            f"{run_dir} holds a run trained with another configuration ({listed}). Resume it with the values in "
            f"{run_dir / 'config.yaml'}, or start a new run in another directory (hydra.run.dir=...)"
        )
    if state["global_batch"] != global_batch:
        raise CheckpointError(
            f"the checkpoint was trained with a global batch of {state['global_batch']}, this run has {global_batch}: "
            "keep data.batch_size x world size the same to resume (any world size works), or start a new run dir"
        )
