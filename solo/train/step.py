"""The training step: forward under autocast, backward, clipping, optimizer and scaler, then the method's
post-step hook (EMA teachers). The learning rate of every group follows the schedule, times its `lr_scale`."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Callable

import torch
import torch.nn as nn

from solo.errors import ConfigError, TrainingDiverged
from solo.losses import NonFiniteError


def precision_context(precision: str, device: torch.device) -> tuple[Callable, torch.amp.GradScaler]:
    """(autocast context factory, gradient scaler) for trainer.precision; 64 means float64 weights, no autocast."""
    if precision == "bf16":
        return partial(torch.autocast, device.type, dtype=torch.bfloat16), torch.amp.GradScaler(device.type, enabled=False)
    if precision == "16":
        if device.type != "cuda":
            raise ConfigError("trainer.precision=16 needs a GPU; on the CPU use trainer.precision=bf16 or 32")
        return partial(torch.autocast, "cuda", dtype=torch.float16), torch.amp.GradScaler("cuda")
    return nullcontext, torch.amp.GradScaler(device.type, enabled=False)


class TrainStep:
    """`step(batch, index)` trains on one batch; `index` is the number of optimizer steps done before it.

    `forward` is what to call (the DDP wrapper or the model), `model` the module whose `.method` (if any)
    gets `after_optimizer_step` and whose parameters are clipped.
    """

    def __init__(self, forward: nn.Module, model: nn.Module, optimizer, *, precision: str, device: torch.device,
                 schedule: Callable[[int], float], total_steps: int, grad_clip: float | None = None):
        self.forward, self.model, self.optimizer = forward, model, optimizer
        self.autocast, self.scaler = precision_context(precision, device)
        self.schedule, self.total_steps, self.grad_clip = schedule, total_steps, grad_clip

    def __call__(self, batch: dict, index: int) -> dict:
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule(index) * group.get("lr_scale", 1.0)
        out = self._forward_backward(batch)
        if self.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        method = getattr(self.model, "method", None)
        if method is not None:
            method.after_optimizer_step(index + 1, self.total_steps)
        return out

    def _forward_backward(self, batch: dict) -> dict:
        try:
            with self.autocast():
                out = self.forward(batch)
        except NonFiniteError as e:
            raise TrainingDiverged(diverged_message(str(e))) from None
        loss = out["loss"] + out.get("probe_loss", 0.0)
        if not bool(torch.isfinite(loss)):
            raise TrainingDiverged(diverged_message(f"the loss is {float(loss)}"))
        self.scaler.scale(loss).backward()
        return out

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])


def diverged_message(what: str) -> str:
    return (
        f"training diverged: {what}. Stopped before writing any checkpoint from this step, so "
        "checkpoints/last.pt is the last good state; lower optim.lr, set optim.grad_clip, or use trainer.precision=32"
    )
