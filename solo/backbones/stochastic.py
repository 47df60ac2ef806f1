"""Randomness inside the model, drawn per sample: stochastic depth and dropout.

timm's DropPath and torch's Dropout draw their masks from torch's generator, row after row of whatever batch the
process holds. Rank r's row i is then dropped by the draws that rank 0 makes for its own row i (every rank seeds
alike), and a sample's mask changes with the world size and the micro-batching. The modules here draw each mask from
a hash of (run seed, step, sample index, module, call, view), as the augmentation's draws come from (seed, epoch,
sample index, view) (solo.data.sampling.seeding): a sample is dropped alike wherever and with whatever it is computed.

The trainer's Draws (one per run, `Draws.attach`ed to the model) says what a forward computes: the step, a device
tensor set in place before each step (`Draws.set_step`), and, around each forward on a batch (or micro-batch), the
samples `index` of its rows (`Draws.on`). A module's input holds whole views of those samples one after another (row j
is sample index[j % n], view j // n), as every method concatenates its views. A module without Draws (your own training
loop) draws from torch's generator, as timm's modules do. What is drawn once per step for the whole batch comes from
(run seed, step) alone: uniforms hashed on the device (`step_uniforms`: DSE's k-means++ seeds, LeJEPA's directions).
"""

from __future__ import annotations

import functools
import zlib
from contextlib import contextmanager
from typing import Callable

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


CALLS = 4


class Draws:
    """The per-sample draws of a training run: its seed, the optimizer step, and the samples of the forward running now
    (`on`). `attach` gives it to the model's per-sample modules (and to a method that draws once per step, as LeJEPA's
    directions), which draw from it; a module without one draws from torch's generator.

    The step's part of every module's hash is computed on the host when the step is set (`set_step`) and copied in
    place into a device tensor, `call_keys` (call, module): a compiled step reads it as an input, never the step as a
    constant. A forward's draws come as one table per (call, rows): every attached module's hash for each row, computed
    at the first draw and read by each module's call as a row of it (a fixed number of operations per forward, not a
    hash per module), the same numbers as each module's own hash would give; stochastic depth's row masks too, one
    table per (call, rows, dtype) for all its modules."""

    def __init__(self, seed: int, device: torch.device):
        self.seed, self.device = seed, device
        self.step_number = 0  # the optimizer step whose draws come next
        self.keys: list[int] = []  # the attached modules' keys, in their slots' order
        self.call_keys = torch.zeros(1, 0, 1, dtype=torch.int64, device=device)  # (calls, modules, 1), this step's
        self.step_key = torch.zeros((), dtype=torch.int64, device=device)  # hash of (run seed, step), this step's
        self.index: torch.Tensor | None = None  # the samples of the forward running now
        self.calls: dict = {}  # module -> how many times it drew in this forward
        self.tables: dict = {}  # (call, rows) -> (modules, rows) int64 hashes of this forward; (call, rows, dtype) -> masks

    def attach(self, model: nn.Module) -> Draws:
        """Every per-sample module of `model` that draws (drop probability above 0) draws from this; so does any
        module with a `draws` attribute (a method's once-per-step draws)."""
        for module in model.modules():
            if isinstance(module, (DropPath, Dropout)) and module.rate > 0:
                module.draws, module.slot = self, len(self.keys)
                self.keys.append(module.key)
            elif hasattr(module, "draws") and not isinstance(module, (DropPath, Dropout)):
                module.draws = self
        device = self.device
        # Room for CALLS calls of each module per forward (multi-crop's sizes, a method's several encoder calls): a
        # forward that needs more grows it once (another graph for a compiled step).
        self.call_keys = torch.zeros(CALLS, len(self.keys), 1, dtype=torch.int64, device=device)
        self.set_step(self.step_number)
        modules = sorted(
            (m for m in model.modules() if getattr(m, "draws", None) is self and hasattr(m, "slot")),
            key=lambda m: m.slot,
        )
        rates = [m.rate for m in modules]
        # Each module's row mask where a row is kept: 1 / keep (stochastic depth scaled by keep, as timm's), or 1.
        scales = [1 / (1 - r) if getattr(m, "scale_by_keep", False) and r < 1 else 1.0 for m, r in zip(modules, rates)]
        self._keeps = torch.tensor([1 - r for r in rates], dtype=torch.float64, device=device)[:, None]
        self._scales = torch.tensor(scales, dtype=torch.float64, device=device)[:, None]
        return self

    def set_step(self, step: int) -> None:
        """The draws of optimizer step `step` (0-based) come next: `call_keys` set in place (one copy to the device)."""
        self.step_number = step
        self.step_key.fill_(mix32(self._seed_key() ^ step))
        if self.keys:
            self.call_keys.copy_(self._call_keys(len(self.call_keys)), non_blocking=True)

    def _call_keys(self, calls: int) -> torch.Tensor:
        """(calls, modules, 1) on the host: the hash of (run seed, step, module) mixed with each call's number."""
        step_key = mix32(self._seed_key() ^ self.step_number)
        keys = [[mix32(mix32(step_key ^ key) ^ call) for key in self.keys] for call in range(calls)]
        return torch.tensor(keys, dtype=torch.int64).view(calls, len(self.keys), 1)

    def _seed_key(self) -> int:
        return mix32(mix32(self.seed & _MASK32) ^ (self.seed >> 32))

    @contextmanager
    def on(self, index: torch.Tensor | None):
        """A forward on the samples `index` (the batch's "index": dataset indices), with its own count of calls per
        module: a micro-batch's forward draws as the same rows' part of the whole batch's."""
        outer = self.index, self.calls, self.tables
        self.index, self.calls, self.tables = index, {}, {}
        try:
            yield
        finally:
            self.index, self.calls, self.tables = outer

    def hashes(self, module: nn.Module, rows: int) -> torch.Tensor:
        """(rows,) 32-bit hashes of (run seed, step, `module`, its call, sample, view) for `module`'s next call on
        `rows` rows: row j is sample index[j % n] of view j // n."""
        return self.tables[self._next_call(module, rows)][module.slot]

    def row_mask(self, module: nn.Module, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """(rows,) stochastic depth's mask for `module`'s next call: 0 where the row is dropped, else its scale."""
        call = self._next_call(module, rows)
        if (*call, dtype) not in self.tables:
            uniform = self.tables[call].double() / 2.0**32
            self.tables[(*call, dtype)] = ((uniform < self._keeps) * self._scales).to(dtype)
        return self.tables[(*call, dtype)][module.slot]

    def _next_call(self, module: nn.Module, rows: int) -> tuple[int, int]:
        """(call, rows) of `module`'s next call, counted, its table of hashes made if this forward has none yet."""
        index = self.index
        if index is None:
            raise RuntimeError(
                f"{type(module).__name__} draws per sample, and the batch has no 'index' (each row's sample index, which "
                "solo's data sources give): add it to the batch"
            )
        n = len(index)
        if (n == 0 and rows) or (n and rows % n):
            raise RuntimeError(
                f"{type(module).__name__} got {rows} rows in a forward on {n} samples: randomness inside the model is "
                "drawn per sample, and a module's input must hold whole views of the forward's samples one after another"
            )
        call = self.calls.get(module, 0)
        self.calls[module] = call + 1
        if call >= len(self.call_keys):  # a forward that calls its modules more often than any before
            self.call_keys = self._call_keys(call + 1).to(self.device)
        if (call, rows) not in self.tables:
            if n == 0:
                self.tables[(call, rows)] = self.call_keys.new_zeros(len(self.keys), 0)
            else:  # hash(hash(module, call ^ sample) ^ view), (modules, views, n) as (modules, rows)
                per_sample = mix32(self.call_keys[call] ^ (index.to(self.device) & _MASK32))
                views = torch.arange(rows // n, device=self.device)[:, None]
                self.tables[(call, rows)] = mix32(per_sample[:, None, :] ^ views).view(len(self.keys), rows)
        return call, rows

    def step_uniforms(self, stream: int, rows: int, columns: int) -> torch.Tensor:
        """(rows, columns) float64 uniforms in [0, 1) of this step's `stream` (an int naming what draws), hashed on
        the device from `step_key`: the same on every rank, at any world size and micro-batching. No generator is made
        in the step, and a compiled step reads the step as a device tensor, so it stays one graph."""
        key = mix32(self.step_key ^ stream)
        counter = torch.arange(rows * columns, device=self.step_key.device)
        return (mix32(key ^ counter).double() / 2.0**32).view(rows, columns)  # one hash per number: 1M in 20 ms (CPU)

    def recorded_and_replayed(self) -> tuple:
        """Two context managers for activation checkpointing (torch.utils.checkpoint's `context_fn`): the first records
        the forward's samples and call counts as a block's forward starts, the second sets them again for the forward
        run again in the backward, so that the second run draws the masks of the first."""
        state = {}

        @contextmanager
        def record():
            state["forward"] = (self.index, dict(self.calls), self.tables)
            yield

        @contextmanager
        def replay():
            outer = self.index, self.calls, self.tables
            self.index, calls, self.tables = state["forward"]
            self.calls = dict(calls)
            try:
                yield
            finally:
                self.index, self.calls, self.tables = outer

        return record(), replay()


def step_uniforms(owner: nn.Module, name: str) -> Callable[[int, int], torch.Tensor] | None:
    """`owner`'s Draws' uniforms of the step for `name` (Draws.step_uniforms) as a function of (rows, columns), or None
    where it has none (your own training loop): draw from torch's generator."""
    draws = getattr(owner, "draws", None)
    return None if draws is None else functools.partial(draws.step_uniforms, _STREAMS[name])


# What draws uniforms once per step (step_uniforms), each a stream of its own: hashed here, not in the step.
_STREAMS = {name: zlib.crc32(name.encode()) for name in ("dse", "lejepa.directions")}


def per_sample_uniforms(module: nn.Module, rows: int, per_row: int, device: torch.device) -> torch.Tensor:
    """(rows, per_row) float64 uniforms in [0, 1) for `module`'s call on `rows` rows: per sample where it has Draws
    (the trainer's), else from torch's generator."""
    if module.draws is None:
        return torch.rand(rows, per_row, dtype=torch.float64, device=device)
    h = module.draws.hashes(module, rows)
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
        self.draws: Draws | None = None  # Draws.attach: per sample; None: torch's generator
        self.slot = 0  # its row in its Draws' tables

    @property
    def rate(self) -> float:
        return self.drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        shape = (-1, *[1] * (x.dim() - 1))
        if self.draws is not None:  # per sample: a row of its Draws' masks for this forward
            return x * self.draws.row_mask(self, x.shape[0], x.dtype).view(shape)
        keep = 1.0 - self.drop_prob
        mask = (per_sample_uniforms(self, x.shape[0], 1, x.device) < keep).to(x.dtype).view(shape)
        return x * (mask / keep if self.scale_by_keep and keep > 0 else mask)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, per sample"


class Dropout(nn.Module):
    """Dropout (torch's nn.Dropout): each element kept with probability 1 - p, scaled by 1 / (1 - p)."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.key = p, 0
        self.draws: Draws | None = None
        self.slot = 0

    @property
    def rate(self) -> float:
        return self.p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        if keep == 0.0 or x.numel() == 0:
            return x * 0
        draws = per_sample_uniforms(self, x.shape[0], x[0].numel(), x.device).view(x.shape)
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
