"""DINO (Caron et al., 2021): self-distillation from a momentum teacher on multi-crop views, with a centred,
sharpened teacher."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from solo.losses import dino_center, dino_loss
from solo.methods.base import (
    DSEOption,
    KoLeoOption,
    Method,
    cosine_momentum,
    ema_update,
    encode_views,
    make_teacher,
    register_method,
    with_group_settings,
)
from solo.schema import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, PROBABILITY, ruled


@dataclass
class DINOConfig(DSEOption, KoLeoOption):
    name: str = "dino"
    proj_hidden_dim: int = ruled(2048, AT_LEAST_ONE)
    use_bn_in_head: bool = False  # BatchNorm after the head's hidden layers (DINO's --use_bn_in_head, for ResNets)
    bottleneck_dim: int = ruled(256, AT_LEAST_ONE)
    num_prototypes: int = ruled(65536, AT_LEAST_ONE)  # the head's output dimension, K
    student_temperature: float = ruled(0.1, POSITIVE)
    teacher_temperature: float = ruled(0.04, POSITIVE)  # after the warm-up
    warmup_teacher_temperature: float = ruled(0.04, POSITIVE)
    warmup_teacher_temperature_epochs: float = ruled(0.0, NON_NEGATIVE)
    center_momentum: float = ruled(0.9, MOMENTUM)
    base_momentum: float = ruled(0.996, PROBABILITY)  # the teacher's share in its EMA update, at the start
    final_momentum: float = ruled(1.0, PROBABILITY)  # ... and at the end (cosine schedule)
    freeze_last_layer_epochs: float = ruled(1.0, NON_NEGATIVE)  # the head's last layer is not updated before


def warmed_up(start: float, end: float, epochs: float, step: int, steps_per_epoch: int) -> float:
    """A value after `step` optimizer steps: linear from `start` to `end` over `epochs` epochs, then `end`."""
    warmup = epochs * steps_per_epoch
    return end if step >= warmup else start + (end - start) * step / warmup


def teacher_temperature(cfg, step: int, steps_per_epoch: int) -> float:
    """The teacher's temperature after `step` optimizer steps: linear from cfg.warmup_teacher_temperature to
    cfg.teacher_temperature over cfg.warmup_teacher_temperature_epochs, then constant (DINO, DINOv2)."""
    return warmed_up(
        cfg.warmup_teacher_temperature,
        cfg.teacher_temperature,
        cfg.warmup_teacher_temperature_epochs,
        step,
        steps_per_epoch,
    )


def init_head_layers(mlp: Iterable[nn.Module]) -> None:
    """DINO's initialisation of a head's linear layers (DINOv2's and Franca's alike): small weights (trunc_normal, std
    0.02, its bounds +-2), zero biases."""
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)


class DINOHead(nn.Module):
    """MLP (GELU) -> bottleneck -> L2 normalisation -> weight-normalised linear layer to K prototypes, whose
    norms are fixed at 1 (DINO's `norm_last_layer`, the default that keeps training stable). With `patch_out_dim`, the
    patch tokens (forward's `patches`) take a last layer of their own after the shared MLP (iBOT's head without
    shared_head)."""

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        bottleneck_dim: int,
        out_dim: int,
        use_bn: bool = False,
        patch_out_dim: int = 0,
    ):
        super().__init__()
        norm = (lambda: nn.BatchNorm1d(hidden_dim)) if use_bn else nn.Identity
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden_dim),
            norm(),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            norm(),
            nn.GELU(),
            nn.Linear(hidden_dim, bottleneck_dim),
        )
        init_head_layers(self.mlp)
        self.last_layer = nn.Linear(bottleneck_dim, out_dim, bias=False)
        self.patch_last_layer = nn.Linear(bottleneck_dim, patch_out_dim, bias=False) if patch_out_dim else None
        self.out_dims, self.patch_out_dims = [out_dim], [patch_out_dim or out_dim]  # one level (Franca's have more)

    def forward(self, x: torch.Tensor, patches: bool = False) -> torch.Tensor:
        """Scores of the rows of `x`; `patches`: of patch tokens, through their own last layer where the head has one
        (a flag of forward, not a method of its own: FSDP gathers a unit's parameters around its forward only)."""
        last = self.patch_last_layer if patches and self.patch_last_layer is not None else self.last_layer
        return F.linear(F.normalize(self.mlp(x), dim=-1), F.normalize(last.weight, dim=1))

    def last_layers(self) -> list[nn.Parameter]:
        """The prototypes' weights, which the first epochs keep frozen."""
        return [*self.last_layer.parameters(), *(self.patch_last_layer.parameters() if self.patch_last_layer else [])]


class SelfDistillation(Method):
    """What DINO and DINOv2 share: a teacher (an EMA of backbone and `head`) moved after every optimizer step on a
    cosine momentum schedule, its temperature warming up, and the head's last layer frozen at first."""

    teachers = ("teacher",)

    def register_schedules(self, cfg) -> None:
        """The teacher's temperature (a buffer: in the checkpoint, the next step's) and its EMA momentum, as device
        tensors that prepare_step and after_optimizer_step set in place."""
        self.register_buffer("teacher_temperature", torch.tensor(teacher_temperature(cfg, 0, 1)))
        self.register_buffer("next_temperature", torch.tensor(teacher_temperature(cfg, 0, 1)), persistent=False)
        self.register_buffer("teacher_momentum", torch.tensor(cfg.base_momentum), persistent=False)
        self.momentum = cfg.base_momentum

    def param_groups(self, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict]:
        frozen_steps = round(self.cfg.freeze_last_layer_epochs * self.steps_per_epoch)
        groups = super().param_groups(weight_decay, exclude_bias_and_norm)
        return with_group_settings(groups, self.head.last_layers(), frozen_steps=frozen_steps)

    def prepare_step(self, index: int, total_steps: int) -> None:
        self.momentum = cosine_momentum(self.cfg.base_momentum, self.cfg.final_momentum, index + 1, total_steps)
        self.teacher_momentum.fill_(self.momentum)
        self.next_temperature.fill_(teacher_temperature(self.cfg, index + 1, self.steps_per_epoch))

    def after_optimizer_step(self) -> None:
        ema_update(self.teacher, nn.ModuleList([self.backbone, self.head]), self.ema_momentum())
        self.teacher_temperature.copy_(self.next_temperature)

    def metrics(self) -> dict[str, torch.Tensor]:
        return {
            "train/teacher_momentum": torch.tensor(self.momentum),
            "train/teacher_temperature": self.teacher_temperature,
        }


@register_method("dino", schema=DINOConfig)
class DINO(SelfDistillation):
    augmentations = {"digits": "digits", "natural": "multicrop_dino"}
    sync_teacher_batchnorm = True  # the teacher's backbone BatchNorms see the global batch, as the student's
    local_crops = True

    def __init__(self, backbone, feature_dim: int, cfg: DINOConfig):
        super().__init__(backbone, feature_dim)
        self.take_regularisers(cfg)
        self.cfg = cfg
        self.head = DINOHead(
            feature_dim, cfg.proj_hidden_dim, cfg.bottleneck_dim, cfg.num_prototypes, cfg.use_bn_in_head
        )
        self.teacher = make_teacher(nn.ModuleList([backbone, self.head]))
        # Buffers: part of the checkpoint, so a resumed run goes on with the same centre and temperature.
        self.register_buffer("center", torch.zeros(cfg.num_prototypes))
        self.register_schedules(cfg)

    def encode(self, batch: dict) -> dict:
        views = batch["views"]
        # The official MultiCropWrapper: the crops of one size share their BatchNorm statistics, the head takes all
        # of them at once; the teacher sees the global crops only.
        with torch.no_grad():
            teacher = encode_views(self.teacher[0], views[: self.num_views], per_view_statistics=False)
        return {**self.encode_backbone(views, per_view_statistics=False), "teacher": teacher}

    def batch_loss(self, encoded: dict, batch: dict) -> dict:
        student = encode_views(self.head, encoded["features"], per_view_statistics=False)
        with torch.no_grad():
            teacher = encode_views(self.teacher[1], encoded["teacher"], per_view_statistics=False)
        loss = dino_loss(student, teacher, self.center, self.cfg.student_temperature, self.teacher_temperature)
        with torch.no_grad():  # after the loss, from this batch's teacher outputs: the next step's centre
            self.center.copy_(dino_center(teacher, self.center, self.cfg.center_momentum))
        return self.view_outputs(loss, encoded["features"][: self.num_views], batch, encoded.get("dense"))
