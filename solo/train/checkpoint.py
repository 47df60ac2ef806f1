"""Checkpoints that are never half-written (temp file + fsync + rename, last.pt as a hard link), holding
the state of every stateful component of the trainer."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from solo.errors import CheckpointError

STEP_FILE = re.compile(r"step-(\d+)\.pt$")


class Checkpoints:
    """`<dir>/step-<N>.pt` files, the newest also reachable as `<dir>/last.pt`; keeps the last `keep`."""

    def __init__(self, directory: str | Path, keep: int):
        if keep < 1:
            raise ValueError(f"trainer.keep_checkpoints must be >= 1, got {keep}")
        self.dir = Path(directory)
        self.keep = keep

    @property
    def last(self) -> Path:
        return self.dir / "last.pt"

    def save(self, state: dict, step: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step-{step:09d}.pt"
        _atomic_write(path, lambda f: torch.save(state, f))
        # last.pt is switched in one rename, so a reader sees the old or the new checkpoint, never neither.
        link = self.dir / ".last.pt.tmp"
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, self.last)
        _fsync_dir(self.dir)
        self._prune()
        return path

    def load(self, path: str | Path | None = None, map_location="cpu") -> dict | None:
        path = Path(path) if path else self.last
        if not path.exists():
            return None
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"cannot load checkpoint {path}: {e}. Delete it to fall back to an older step-*.pt in {self.dir}, "
                "or set trainer.resume=false with a new hydra.run.dir"
            ) from None

    def _prune(self) -> None:
        steps = sorted(p for p in self.dir.iterdir() if STEP_FILE.search(p.name))
        for old in steps[: -self.keep]:
            old.unlink()


# Whole tensors on the CPU, as one process would hold them: the same file from DDP or FSDP at any world size.
WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)


class ModelState:
    """A model's weights and buffers as a checkpoint component, whole (FSDP's shards gathered on save, and cut
    from the whole tensors on load), so a run saved with one strategy and world size resumes with another."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model, options=WHOLE)

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))


class OptimizerState:
    """The optimizer's state keyed by parameter name (not by position), whole, as ModelState's weights."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer, options=WHOLE)

    def load_state_dict(self, state: dict) -> None:
        if all(isinstance(k, int) for k in state["state"]):  # a checkpoint of solo 0.2 or before: keyed by position
            self.optimizer.load_state_dict(state)
            return
        # Not strict: a parameter with no state yet (its group still frozen) has none in the checkpoint.
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=options)
        # Loading starts the state of every parameter with a step at lr 0; a parameter that had none in the
        # checkpoint (a group still frozen, e.g. DINO's last layer) must have none now either (AdamW counts steps).
        for name, p in self.model.named_parameters():
            if name not in state["state"]:
                self.optimizer.state.pop(p, None)


class RNGState:
    """The process's global random generators (torch CPU and CUDA, Python's), as a checkpoint component."""

    def state_dict(self) -> dict:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if torch.cuda.is_available() and state["cuda"]:
            torch.cuda.set_rng_state_all(state["cuda"])
        random.setstate(state["python"])


class Checkpointer:
    """Saves and restores `components` (name -> object with state_dict/load_state_dict) with the step and
    `info` (e.g. the config) alongside. Every rank collects the state (a collective under FSDP), rank 0 writes; every
    rank waits until the file is complete."""

    def __init__(self, checkpoints: Checkpoints, components: dict, info: dict, is_main: bool):
        self.checkpoints, self.components, self.info, self.is_main = checkpoints, components, info, is_main

    def save(self, step: int) -> None:
        state = {name: c.state_dict() for name, c in self.components.items()}  # every rank: FSDP gathers shards
        if self.is_main:
            self.checkpoints.save(state | self.info | {"step": step}, step)
        if dist.is_initialized():
            dist.barrier()  # nobody runs ahead (or exits) while the checkpoint is still being written

    def restore(self, state: dict) -> int:
        """Load every component from `state` (a loaded checkpoint); returns its step."""
        for name, component in self.components.items():
            component.load_state_dict(state[name])
        return state["step"]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
