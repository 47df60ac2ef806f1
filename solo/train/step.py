"""The training step: forward under autocast, backward, clipping, optimizer and scaler, then the method's
post-step hook (EMA teachers). The learning rate of every group follows the schedule, times its `lr_scale` (a
`static_lr` group keeps the optimizer's); so does the weight decay of every group that has one, when it has a
schedule (optim.weight_decay_end); a group with `frozen_steps` is left untouched (its gradients dropped
after clipping) for its first steps.

With `accumulate=k` the batch is split into k micro-batches and the step's gradient is still that of the
whole batch (GradCache, Gao et al. 2021): the method's per-sample `encode` runs micro-batch by micro-batch
without a graph; its `batch_loss` part (projector, loss: what couples samples) runs once on all of them, giving the
gradient of the loss with respect to every micro-batch's encoding; each micro-batch is then encoded again,
with its graph and the random state of its first pass, and back-propagates that cached gradient. The last
micro-batch runs `batch_loss` again with its own graph, so one backward reaches every parameter and DDP
all-reduces once (FSDP reduce-scatters once: `gradient_sync` is off before). Only BatchNorm inside `encode` (the
backbone's) sees micro-batch statistics; the projector's and the loss's statistics stay those of the global batch.

The step never reads a tensor on the host (on a GPU, each read would stall the queue of kernels): the
losses' value checks are deferred (solo.losses._checks), every rank's batch size is exchanged once per
shape (solo.distributed.batch_sizes_remembered), and a non-finite loss is recorded on the device, in
`first_bad_step`, for the trainer to read when it logs and before it writes any checkpoint (`check_finite`)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from functools import partial
from typing import Callable, Iterable, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

from solo.backbones.stochastic import Draws
from solo.distributed import batch_sizes_remembered
from solo.errors import ConfigError, TrainingDiverged
from solo.losses import NonFiniteError
from solo.losses._checks import host_reads_deferred
from solo.optim import clip_grad_norm
from solo.train.distribute import average_whole_gradients, cannot_compile, gradient_sync, kept_buffers


def precision_context(precision: str, device: torch.device) -> tuple[Callable, torch.amp.GradScaler]:
    """(autocast context factory, gradient scaler) for trainer.precision; 64 means float64 weights, no autocast."""
    if precision == "bf16":
        return partial(torch.autocast, device.type, dtype=torch.bfloat16), torch.amp.GradScaler(
            device.type, enabled=False
        )
    if precision == "16":
        if device.type != "cuda":
            raise ConfigError("trainer.precision=16 needs a GPU; on the CPU use trainer.precision=bf16 or 32")
        return partial(torch.autocast, "cuda", dtype=torch.float16), torch.amp.GradScaler("cuda")
    return nullcontext, torch.amp.GradScaler(device.type, enabled=False)


class Trainable(Protocol):
    """What the step needs of the model it trains (pretraining's PretrainModel, fine-tuning's Classifier)."""

    def __call__(self, batch: dict, *, encoded: dict | None = None, last: dict | None = None) -> dict:
        """{"loss": scalar, ...} on `batch` (with "probe_loss" for a probe trained beside it); under accumulation
        from the whole batch's `encoded`, or from all micro-batches' but the `last`, encoded here with its graph."""

    def encode(self, batch: dict) -> dict:
        """The per-sample part of the forward (only needed with accumulate > 1)."""

    def clipped_parameters(self) -> Iterable[nn.Parameter]:
        """The parameters whose global gradient norm optim.grad_clip bounds (not a probe beside the model)."""

    def prepare_step(self, index: int, total_steps: int) -> None:
        """The host's part of step `index` before it runs: schedules into device tensors (EMA momentum, ...)."""

    def after_optimizer_step(self) -> None:
        """The device's part after the optimizer's update (EMA teachers)."""


class TrainStep:
    """`step(batch, index)` trains on one batch; `index` is the number of optimizer steps done before it.

    `forward` is what to call (the DDP wrapper or the model), `model` the Trainable itself.
    """

    def __init__(
        self,
        forward: nn.Module,
        model: Trainable,
        optimizer,
        *,
        precision: str,
        device: torch.device,
        schedule: Callable[[int], float],
        total_steps: int,
        grad_clip: float | None = None,
        accumulate: int = 1,
        weight_decay: Callable[[int], float] | None = None,
        draws: Draws | None = None,
        compiled: bool = False,
    ):
        self.forward, self.model, self.optimizer = forward, model, optimizer
        self.draws = draws  # the draws inside the model (solo.backbones.stochastic), set to each step
        self.autocast, self.scaler = precision_context(precision, device)
        self.scaling = self.scaler.is_enabled()  # trainer.precision=16 only (torch.compile does not trace the scaler)
        self.schedule, self.total_steps, self.grad_clip = schedule, total_steps, grad_clip
        self.accumulate = accumulate
        self.weight_decay = weight_decay
        # By position: loading the optimizer's state on resume replaces its group dicts.
        self.decayed = [i for i, group in enumerate(optimizer.param_groups) if group["weight_decay"] > 0]
        self.index = torch.zeros((), dtype=torch.long, device=device)  # the step being taken, set in place
        self.first_bad_step = torch.tensor(-1, device=device)  # the first step whose loss was not finite, or -1
        self.batch_sizes: dict = {}  # every rank's batch size per local size, exchanged once
        # A group's learning rate and weight decay when no schedule sets them (static_lr, a constant decay).
        self.own = [(group["lr"], group["weight_decay"]) for group in optimizer.param_groups]
        # trainer.compile=step: each group's learning rate and weight decay, set in place before each step, and given to
        # the optimizer's groups as 0-dim views of it (a number would be a constant: another graph at each step).
        self.scalars = torch.zeros(2, len(optimizer.param_groups), dtype=torch.float64, device=device)
        self.scalar_views = [list(row.unbind()) for row in self.scalars]
        self.compiled = compiled
        self.update = compiled_step(self._update, device) if compiled else self._update
        self.state_made = False

    def __call__(self, batch: dict, index: int) -> dict:
        """Train on `batch`, optimizer step `index`: the host's part (the schedules, written into the optimizer's
        groups and, in place, into device tensors; the method's prepare_step), then the device's (`update`)."""
        frozen = self._prepare(index)
        with host_reads_deferred(), batch_sizes_remembered(self.batch_sizes):
            return self.update(batch, frozen)

    def explain(self, batch: dict, index: int):
        """torch._dynamo.explain of step `index` on `batch` (which it takes): the graphs and graph breaks of the
        device's part, what trainer.compile=step captures."""
        frozen = self._prepare(index)
        with host_reads_deferred(), batch_sizes_remembered(self.batch_sizes):
            with torch._dynamo.config.patch(trace_autograd_ops=True):
                return torch._dynamo.explain(self._update)(batch, frozen)

    def _prepare(self, index: int) -> tuple[bool, ...]:
        """The host's part of step `index`; returns which optimizer groups it leaves untouched."""
        groups = self.optimizer.param_groups
        lrs = [
            own_lr if group.get("static_lr", False) else self.schedule(index) * group.get("lr_scale", 1.0)
            for group, (own_lr, _) in zip(groups, self.own)
        ]
        decays = [
            self.weight_decay(index) if self.weight_decay is not None and i in self.decayed else own_decay
            for i, (_, own_decay) in enumerate(self.own)
        ]
        self.index.fill_(index)
        if self.compiled:
            if not self.state_made:  # after a resume's load: only what is missing
                self.optimizer.make_state()
                self.state_made = True
            self.scalars.copy_(torch.tensor([lrs, decays], dtype=torch.float64), non_blocking=True)
            lrs, decays = self.scalar_views  # the same views at every step (a resume's load replaces the groups)
        for group, lr, decay in zip(groups, lrs, decays):
            group["lr"], group["weight_decay"] = lr, decay
        if self.draws is not None:
            self.draws.set_step(index)
        self.model.prepare_step(index, self.total_steps)
        # e.g. DINO's last layer: no update at all, state included, for its group's first steps
        return tuple(index < group.get("frozen_steps", 0) for group in groups)

    def _update(self, batch: dict, frozen: tuple[bool, ...]) -> dict:
        """Forward, backward, clipping, the optimizer's update and the method's after_optimizer_step: the device's
        part of the step, captured whole under trainer.compile=step. Returns the forward's outputs, detached."""
        out = self._forward_backward(batch) if self.accumulate == 1 else self._accumulated(batch)
        average_whole_gradients(self.forward)
        bad = ~torch.isfinite(out["total"].detach()) & (self.first_bad_step < 0)
        self.first_bad_step.copy_(torch.where(bad, self.index + 1, self.first_bad_step))
        if self.grad_clip:
            if self.scaling:
                self.scaler.unscale_(self.optimizer)
            clip_grad_norm(list(self.model.clipped_parameters()), self.grad_clip)
        for group, frozen_now in zip(self.optimizer.param_groups, frozen):
            if frozen_now:
                for p in group["params"]:
                    p.grad = None
        if self.compiled:
            self.optimizer.update()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        self.model.after_optimizer_step()
        return {key: value.detach() if isinstance(value, torch.Tensor) else value for key, value in out.items()}

    def _forward_backward(self, batch: dict, forward: Callable | None = None) -> dict:
        out = self._loss(forward or self.forward, batch)
        self._scaled(out["total"]).backward()
        return out

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaling else loss

    def _loss(self, forward: Callable, batch: dict, **kwargs) -> dict:
        try:
            with self.autocast():
                out = forward(batch, **kwargs)
        except NonFiniteError as e:
            raise TrainingDiverged(diverged_message(str(e))) from None
        out["total"] = out["loss"] + out.get("probe_loss", 0.0)
        return out

    def _accumulated(self, batch: dict) -> dict:
        micro = split_batch(batch, self.accumulate)
        with kept_buffers(self.model):  # the first passes leave BatchNorm statistics as they were
            states, encoded = [], []
            with torch.no_grad(), self.autocast():
                for part in micro:
                    states.append(rng_state())
                    encoded.append(self.model.encode(part))
            after = rng_state()
            # Only floating outputs take a gradient; others (masks, indices) pass through as they are.
            leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in flatten(merge_encoded(encoded))]
            out = self._loss(self.model, batch, encoded=unflatten(merge_encoded(encoded), leaves))
            trained = [t for t in leaves if t.requires_grad]
            found = iter(torch.autograd.grad(self._scaled(out["total"]), trained, allow_unused=True))
            grads = [next(found) if t.requires_grad else None for t in leaves]
        sizes = [len(flatten(e)[0]) for e in encoded]
        gradient_sync(self.forward, False)
        for i, part in enumerate(micro[:-1]):
            # Past the DDP wrapper (its hooks stay idle) and with FSDP's sync off: one reduction, after the last.
            set_rng_state(states[i])
            with self.autocast():
                live = flatten(self.model.encode(part))
            cached = [None if g is None else g.split(sizes)[i] for g in grads]
            sum((t * g).sum() for t, g in zip(live, cached) if g is not None).backward()
        set_rng_state(states[-1])
        gradient_sync(self.forward, True)
        out = self._forward_backward(batch, partial(self.forward, encoded=merge_encoded(encoded[:-1]), last=micro[-1]))
        set_rng_state(after)
        return out

    def check_finite(self) -> None:
        """Raise TrainingDiverged if a step's loss was not finite on any rank (one host read and all-reduce): the
        trainer calls it when it logs and before every checkpoint, so no checkpoint from a bad step is written."""
        bad = torch.where(self.first_bad_step < 0, torch.iinfo(torch.long).max, self.first_bad_step)
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if int(bad) != torch.iinfo(torch.long).max:
            raise TrainingDiverged(diverged_message(f"the loss was not finite at step {int(bad)}"))

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])


def compiled_step(update: Callable, device: torch.device) -> Callable:
    """`update` compiled whole by torch.compile, its backward traced with the forward (dynamo's
    `trace_autograd_ops`), shapes static; on CUDA in mode "reduce-overhead" (CUDA graphs: the step's launches
    replayed as one). Where compilation does not work here, one warning, and `update` as it is."""
    reason = cannot_compile()
    if reason is None and not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        reason = f"torch {torch.__version__} cannot trace a backward inside a compiled function (trace_autograd_ops)"
    if reason is not None:
        warnings.warn(f"trainer.compile=step: {reason}; training runs uncompiled", stacklevel=3)
        return update
    compiled = torch.compile(update, dynamic=False, mode="reduce-overhead" if device.type == "cuda" else None)

    def call(*args):
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return compiled(*args)

    return call


def split_batch(batch: dict, k: int) -> list[dict]:
    """k micro-batches of equal size: every tensor (and every tensor of a list, e.g. the views) split on dim 0."""

    def parts(x):
        return [list(p) for p in zip(*(parts(v) for v in x))] if isinstance(x, list) else x.chunk(k)

    split = {key: parts(value) for key, value in batch.items()}
    return [{key: value[i] for key, value in split.items()} for i in range(k)]


def merge_encoded(parts: list[dict]) -> dict:
    """The micro-batches' encode outputs as one: tensors (and lists of them) concatenated on dim 0."""

    def cat(values):
        return [cat(v) for v in zip(*values)] if isinstance(values[0], list) else torch.cat(values)

    return {key: cat([p[key] for p in parts]) for key in parts[0]}


def flatten(encoded: dict) -> list[torch.Tensor]:
    return [t for key in sorted(encoded) for t in (encoded[key] if isinstance(encoded[key], list) else [encoded[key]])]


def unflatten(encoded: dict, tensors: list[torch.Tensor]) -> dict:
    """`encoded`'s structure with `tensors` (in flatten's order) in place of its own."""
    it = iter(tensors)
    return {
        key: [next(it) for _ in encoded[key]] if isinstance(encoded[key], list) else next(it) for key in sorted(encoded)
    }


def rng_state() -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1]:
        torch.cuda.set_rng_state_all(state[1])


def diverged_message(what: str) -> str:
    return (
        f"training diverged: {what}. Stopped before writing any checkpoint from that step on, so "
        "checkpoints/last is the last good state; lower optim.lr, set optim.grad_clip, or use trainer.precision=32"
    )
