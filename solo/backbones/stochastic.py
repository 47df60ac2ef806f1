"""Randomness inside the model, drawn per sample: stochastic depth and dropout.

timm's DropPath and torch's Dropout draw their masks from torch's generator, row after row of whatever batch the
process holds. Rank r's row i is then dropped by the draws that rank 0 makes for its own row i (every rank seeds
alike), and a sample's mask changes with the world size and the micro-batching. The modules here draw each mask from
a hash of (run seed, step, sample index, module, call, view), as the augmentation's draws come from (seed, epoch,
sample index, view) (solo.data.sampling.seeding): a sample is dropped alike wherever and with whatever it is computed.

The trainer says what a forward computes: `drawn_per_sample(seed, step)` around the step, and `samples(index)` around
each forward on a batch (or micro-batch) whose rows are the samples `index`. A module's input holds whole views of
those samples one after another (row j is sample index[j % n], view j // n), as every method concatenates its views.
A forward outside them (your own training loop) draws from torch's generator, as timm's modules do.
What is drawn once per step for the whole batch (LeJEPA's directions) comes from `step_generator`, seeded by (run
seed, step) alone.
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from solo.errors import ConfigError

_MASK32 = 0xFFFFFFFF


def mix32(x):
    """A 32-bit integer hash (Wellons' lowbias32) of `x` in [0, 2^32), for Python ints and int64 tensors alike. The
    products are split in 16-bit halves so that no int64 product overflows."""

    def times(v, c):
        return (v * (c & 0xFFFF) + (((v * (c >> 16)) & 0xFFFF) << 16)) & _MASK32

    x = x ^ (x >> 16)
    x = times(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = times(x, 0x846CA68B)
    return x ^ (x >> 16)


@dataclass
class _Step:
    seed: int
    step: int
    index: torch.Tensor | None = None  # the samples of the forward running now
    calls: dict = field(default_factory=dict)  # module -> how many times it drew in this forward


_active: _Step | None = None


@contextmanager
def drawn_per_sample(seed: int, step: int):
    """The draws inside the model during the body come from (seed, step, sample index, ...)."""
    global _active
    outer, _active = _active, _Step(seed, step)
    try:
        yield
    finally:
        _active = outer


@contextmanager
def samples(index: torch.Tensor | None):
    """A forward on the samples `index` (the batch's "index": dataset indices), its own count of calls per module:
    a micro-batch's forward draws as the same rows' part of the whole batch's. Outside `drawn_per_sample`, nothing."""
    global _active
    if _active is None:
        yield
        return
    outer = _active
    _active = _Step(outer.seed, outer.step, index)
    try:
        yield
    finally:
        _active = outer


def recorded_and_replayed() -> tuple:
    """Two context managers for activation checkpointing (torch.utils.checkpoint's `context_fn`): the first records
    the draw state as the block's forward starts, the second restores it for the forward run again in the backward,
    so that the second run draws the masks of the first."""
    state = {}

    @contextmanager
    def record():
        if _active is not None:
            state["step"] = _Step(_active.seed, _active.step, _active.index, dict(_active.calls))
        yield

    @contextmanager
    def replay():
        global _active
        outer, recorded = _active, state.get("step")
        _active = recorded and _Step(recorded.seed, recorded.step, recorded.index, dict(recorded.calls))
        try:
            yield
        finally:
            _active = outer

    return record(), replay()


def _step_key(step: _Step) -> int:
    """A 32-bit hash of (run seed, step)."""
    return mix32(mix32(mix32(step.seed & _MASK32) ^ (step.seed >> 32)) ^ step.step)


def step_generator(name: str, device: torch.device) -> torch.Generator | None:
    """Inside `drawn_per_sample`: a generator on `device` seeded by (run seed, step, `name`), the same on every rank,
    at any world size and micro-batching, for what is drawn once per step for the whole batch (LeJEPA's directions).
    Outside it (your own training loop), None: draw from torch's generator."""
    if _active is None:
        return None
    return torch.Generator(device=device).manual_seed(mix32(_step_key(_active) ^ zlib.crc32(name.encode())))


@torch.compiler.disable  # Python state (the call counts): a compiled block calls it eagerly
def uniforms(module: nn.Module, rows: int, per_row: int, device: torch.device) -> torch.Tensor:
    """(rows, per_row) float64 uniforms in [0, 1) for `module`'s call on `rows` rows: per sample in a forward of the
    trainer's, else from torch's generator."""
    if _active is None:
        return torch.rand(rows, per_row, dtype=torch.float64, device=device)
    index = _active.index
    if index is None:
        raise RuntimeError(
            f"{type(module).__name__} draws per sample, and the batch has no 'index' (each row's sample index, which "
            "solo's data sources give): add it to the batch"
        )
    n = len(index)
    if (n == 0 and rows) or (n and rows % n):
        raise RuntimeError(
            f"{type(module).__name__} got {rows} rows in a forward on {n} samples: randomness inside the model is drawn "
            "per sample, and a module's input must hold whole views of the forward's samples one after another"
        )
    call = _active.calls.get(module, 0)
    _active.calls[module] = call + 1
    key = mix32(_step_key(_active) ^ module.key)
    key = mix32(key ^ call)
    row = torch.arange(rows, device=device)
    sample = index.to(device)[row % n] if n else row
    h = mix32(mix32(key ^ (sample & _MASK32)) ^ (row // max(n, 1)))
    if per_row > 1:
        h = mix32(h[:, None] ^ mix32(torch.arange(per_row, device=device) + 0x9E3779B9))
    else:
        h = h[:, None]
    return h.double() / 2.0**32


class DropPath(nn.Module):
    """Stochastic depth (timm's DropPath): each row kept with probability 1 - drop_prob, scaled by 1 / keep."""

    def __init__(self, drop_prob: float, scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob, self.scale_by_keep, self.key = drop_prob, scale_by_keep, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = (uniforms(self, x.shape[0], 1, x.device) < keep).to(x.dtype).view(-1, *[1] * (x.dim() - 1))
        return x * (mask / keep if self.scale_by_keep and keep > 0 else mask)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, per sample"


class Dropout(nn.Module):
    """Dropout (torch's nn.Dropout): each element kept with probability 1 - p, scaled by 1 / (1 - p)."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.key = p, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        if keep == 0.0 or x.numel() == 0:
            return x * 0
        draws = uniforms(self, x.shape[0], x[0].numel(), x.device).view(x.shape)
        return x * ((draws < keep).to(x.dtype) / keep)

    def extra_repr(self) -> str:
        return f"p={self.p}, per sample"


def drawn_per_sample_modules(model: nn.Module, what: str) -> nn.Module:
    """`model` with timm's DropPath and torch's Dropout replaced, in place, by the per-sample modules above, each
    keyed by its name in `model`. Attention dropout inside a fused kernel cannot be drawn per sample: refused."""
    from timm.layers import DropBlock2d
    from timm.layers import DropPath as TimmDropPath

    for name, module in list(model.named_modules()):
        if isinstance(module, DropBlock2d) and module.drop_prob > 0:
            raise ConfigError(
                f"{what}: {name} is a DropBlock (drop_prob={module.drop_prob}), whose masks are not drawn per sample "
                "(per-sample randomness keeps the step the same at any world size): set its drop_block_rate to 0, and "
                "use backbone.drop_path_rate for regularisation"
            )
        attention = getattr(module, "attn_drop", None)
        if isinstance(attention, nn.Dropout) and attention.p > 0:
            raise ConfigError(
                f"{what}: {name or 'the model'} has attention dropout (p={attention.p}), which the fused attention "
                "kernel draws from the shared generator, not per sample (per-sample randomness keeps the step the same "
                "at any world size): set its attn_drop_rate to 0, and use backbone.drop_path_rate for regularisation"
            )
        for child_name, child in list(module.named_children()):
            if isinstance(child, TimmDropPath):
                replacement = DropPath(child.drop_prob, child.scale_by_keep)
            elif type(child) is nn.Dropout:
                replacement = Dropout(child.p)
            else:
                continue
            replacement.key = zlib.crc32(f"{name}.{child_name}".encode())
            setattr(module, child_name, replacement)
    return model


def without_randomness(model: nn.Module) -> nn.Module:
    """`model` with its stochastic depth and dropout off, in place: a teacher's, as in the references (DINO's,
    DINOv2's, BYOL's teachers are built without them)."""
    for module in model.modules():
        if isinstance(module, DropPath):
            module.drop_prob = 0.0
        elif isinstance(module, (Dropout, nn.Dropout)):
            module.p = 0.0
    return model
