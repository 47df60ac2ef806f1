"""iBOT (Zhou et al., 2022): DINO's self-distillation of the class token and masked image modelling with an online
tokenizer, the EMA teacher's scores of every masked patch; DINOv2's code with iBOT's own choices: DINO's centring for
both targets, a last layer of the patches' own after the shared head, the patches' teacher temperature on a schedule of
its own, every global crop masked, no KoLeo."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.methods.base import register_method
from solo.methods.dino import warmed_up
from solo.methods.dinov2 import Centering, DINOv2, DINOv2Config
from solo.schema import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, PROBABILITY, ruled


@dataclass
class IBOTConfig(DINOv2Config):
    """DINOv2's keys at iBOT's defaults (bytedance/ibot main_ibot.py), and the patches' teacher temperature."""

    name: str = "ibot"
    num_prototypes: int = ruled(8192, AT_LEAST_ONE)  # --out_dim
    patch_prototypes: int = ruled(8192, NON_NEGATIVE)  # --patch_out_dim, --shared_head false (0: shared)
    teacher_temperature: float = ruled(0.04, POSITIVE)  # --teacher_temp
    warmup_teacher_temperature: float = ruled(0.04, POSITIVE)
    warmup_teacher_temperature_epochs: float = ruled(30.0, NON_NEGATIVE)
    patch_teacher_temperature: float = ruled(0.07, POSITIVE)  # --teacher_patch_temp, after the same warm-up
    warmup_patch_teacher_temperature: float = ruled(0.04, POSITIVE)  # --warmup_teacher_patch_temp
    centering: Centering = Centering("centering")
    koleo_weight: float = ruled(0.0, NON_NEGATIVE)
    mask_probability: float = ruled(1.0, PROBABILITY)  # every global crop predicts its masked patches
    mask_ratio_min: float = ruled(0.3, FRACTION)  # --pred_ratio 0.3, --pred_ratio_var 0
    mask_ratio_max: float = ruled(0.3, FRACTION)
    base_momentum: float = ruled(0.996, PROBABILITY)  # --momentum_teacher


@register_method("ibot", schema=IBOTConfig)
class IBOT(DINOv2):
    augmentations = {"digits": "digits_mild", "natural": "multicrop_ibot"}

    def register_schedules(self, cfg) -> None:
        super().register_schedules(cfg)
        start = self.patch_schedule(0, 1)
        self.register_buffer("patch_teacher_temperature", torch.tensor(start))  # in the checkpoint, as the other
        self.register_buffer("next_patch_temperature", torch.tensor(start), persistent=False)

    def patch_schedule(self, step: int, steps_per_epoch: int) -> float:
        """The patches' teacher temperature after `step` optimizer steps: warmed up over the class token's epochs."""
        c = self.cfg
        return warmed_up(
            c.warmup_patch_teacher_temperature,
            c.patch_teacher_temperature,
            c.warmup_teacher_temperature_epochs,
            step,
            steps_per_epoch,
        )

    def patch_temperature(self) -> torch.Tensor:
        return self.patch_teacher_temperature

    def prepare_step(self, index: int, total_steps: int) -> None:
        super().prepare_step(index, total_steps)
        self.next_patch_temperature.fill_(self.patch_schedule(index + 1, self.steps_per_epoch))

    def after_optimizer_step(self) -> None:
        super().after_optimizer_step()
        self.patch_teacher_temperature.copy_(self.next_patch_temperature)

    def metrics(self) -> dict[str, torch.Tensor]:
        return {**super().metrics(), "train/patch_teacher_temperature": self.patch_teacher_temperature}
