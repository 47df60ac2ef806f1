"""The training step's cost, estimated before the first step. Its peak memory: one error line that names the keys to
change, instead of the kernel's out-of-memory kill (CPU) or CUDA's out-of-memory error in the middle of the first
step. On a CPU, its time (`step_seconds`): what a step will take, said before the first.

The estimate is what the process holds now (the interpreter, torch, the model and its teachers), plus the gradients
and the optimizer's state (sized from the trainable parameters, divided over the ranks under FSDP), plus the
activations that autograd saves for the backward of one micro-batch. Those are counted on a copy of the model that
runs the method's forward on a probe batch of PROBE_BATCH samples, scaled to the micro-batch: activations grow with
the batch, the rest does not. A method that cannot take so small a batch (W-MSE whitens sub-batches of a fixed size)
is probed through its backbone alone, once per view."""

from __future__ import annotations

import copy
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from solo.errors import ConfigError, SoloError

GIB = 2**30
PROBE_BATCH = 2
# What the backward's temporaries, evaluation and the allocator add to the sum of the parts: the peaks bench/memory.py
# measured on the CPU lie within this margin of that sum (docs/performance.md#memory).
MARGIN = 1.2


@dataclass
class MemoryEstimate:
    held: int  # bytes the process holds now
    gradients_and_state: int  # gradients and the optimizer's state, this rank's share
    activations: int  # saved for the backward, one micro-batch
    available: int  # what this process may use: the device's free memory (its share of it), or the set limit

    @property
    def peak(self) -> int:
        return int(MARGIN * (self.held + self.gradients_and_state + self.activations))

    def describe(self) -> str:
        return (
            f"about {self.peak / GIB:.1f} GiB per process ({MARGIN}x: held {self.held / GIB:.1f}, gradients and "
            f"optimizer state {self.gradients_and_state / GIB:.1f}, activations {self.activations / GIB:.1f}); "
            f"{self.available / GIB:.1f} GiB available"
        )


def saved_bytes(run, exclude: set[int]) -> int:
    """Bytes of the tensors autograd saves for the backward while `run()` runs, each storage once, those whose storage
    starts at an address in `exclude` (the parameters) left out."""
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


def activation_bytes(model, batch: dict, micro_batch: int, autocast) -> int:
    """The activations saved by `model`'s forward on a micro-batch of `micro_batch` samples, from `batch` (PROBE_BATCH
    samples), on a copy of `model` (the run's own keeps its statistics, queues and random state)."""
    probe = copy.deepcopy(model)
    parameters = {p.untyped_storage().data_ptr() for p in probe.parameters()}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        try:
            with autocast():
                saved = saved_bytes(lambda: probe(batch), parameters)
        except SoloError:  # a setting the step cannot run with: the user's to change, now
            raise
        except Exception:  # a batch the method cannot take (W-MSE's whitening sub-batches): its backbone, per view
            backbone = probe.method.backbone
            with autocast():
                saved = sum(saved_bytes(lambda v=view: backbone(v), parameters) for view in batch.get("views", []))
    return saved * micro_batch // PROBE_BATCH


def step_seconds(model, batch: dict, batch_size: int, autocast) -> float | None:
    """About how long the step takes on `batch_size` samples: the method's forward and backward timed on `batch`
    (PROBE_BATCH samples; the second of two runs, the first picks the kernels) on a copy of `model`, scaled to the
    batch. None for a method that cannot take so small a batch (its loss refuses it with a ValueError, as W-MSE's
    whitening sub-batches: every rank probes the same samples, so every rank returns None). Any other error is raised:
    a rank that went on alone would leave the others waiting in the probe's collectives. For the CPU, where time grows
    with the batch."""
    probe = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        try:
            for _ in range(2):
                started = time.perf_counter()
                with autocast():
                    probe(batch)["loss"].backward()
        except ValueError:
            return None
    return (time.perf_counter() - started) * batch_size / PROBE_BATCH


def optimizer_states(optimizer_name: str) -> int:
    """Tensors the optimizer keeps per parameter: Adam's two moments, SGD's and LARS's momentum."""
    return 2 if "adam" in optimizer_name else 1


def held_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def available_bytes(device: torch.device, held: int) -> int:
    """What this process may use in all: what it holds, plus its share of the free memory (the GPU's; on the CPU the
    machine's or its cgroup's, shared by the processes on this node)."""
    if device.type == "cuda":
        return held + torch.cuda.mem_get_info(device)[0]
    free = _meminfo("MemAvailable")
    try:  # a container's (cgroup v2) limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (FileNotFoundError, ValueError):
        pass
    return held + free // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def estimate(
    model: nn.Module,
    batch: dict,
    *,
    micro_batch: int,
    optimizer: str,
    shards: int,
    device,
    autocast=nullcontext,
    limit_gib: float | None = None,
) -> MemoryEstimate:
    """The step's peak memory per process for `model` (before it is distributed) on micro-batches of `micro_batch`
    samples; `batch`: PROBE_BATCH samples on the device; `shards`: the ranks FSDP shards the parameters over (1: DDP).
    `limit_gib`: the memory available, instead of what the device has."""
    held = held_bytes(device)
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    activations = activation_bytes(model, batch, micro_batch, autocast)
    available = int(limit_gib * GIB) if limit_gib is not None else available_bytes(device, held)
    return MemoryEstimate(held, trainable * (1 + optimizer_states(optimizer)) // shards, activations, available)


def check_fits(found: MemoryEstimate, cfg, can_accumulate: bool) -> None:
    """Raise ConfigError when the estimate exceeds what is available, naming the keys that lower it."""
    if found.peak <= found.available:
        return
    d, t, b = cfg.data, cfg.trainer, cfg.backbone
    lower = [f"data.batch_size={d.batch_size}", f"data.image_size={d.image_size}"]
    if b.get("small_stem") is True:
        lower.append("backbone.small_stem=false")
    if str(t.precision) in ("32", "64"):
        lower.append("trainer.precision=bf16")
    if not t.activation_checkpointing:
        lower.append("trainer.activation_checkpointing=true")
    if can_accumulate and d.batch_size % (t.accumulate * 2) == 0:
        lower.append(f"trainer.accumulate={t.accumulate * 2}")
    raise ConfigError(
        f"data.batch_size={d.batch_size} at data.image_size={d.image_size}: the training step needs "
        f"{found.describe()}. Lower it: {', '.join(lower)}; or trainer.memory_check=false to skip this check"
    )
