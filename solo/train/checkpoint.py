"""The state of every stateful component of the trainer, saved to and restored from checkpoints
(solo.distributed.checkpoint): the model's and optimizer's tensors as each rank holds them (FSDP's shards), the
rest from rank 0."""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from solo.distributed.checkpoint import SMALL_STATE, Checkpoints, load_sharded, saved_keys


class ModelState:
    """A model's weights and buffers as a checkpoint component: each rank's part, which DCP saves and reads at any
    world size and strategy."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        """This rank's: DTensor shards under FSDP, whole tensors under DDP."""
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state)

    def load_whole(self, state: dict) -> None:
        """From whole tensors (a checkpoint of solo 0.2)."""
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))


class OptimizerState:
    """The optimizer's state keyed by parameter name (not by position), each rank's part as ModelState's."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        """This rank's, as ModelState's; a parameter that has no state yet gets a zero one (torch's loader makes it)."""
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict, saved: set[str] | None = None) -> None:
        """`saved`: the names of the parameters that have a state in the checkpoint; the others get none (a group
        still frozen, e.g. DINO's last layer: AdamW counts its steps from its first update)."""
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(strict=False))
        self._drop_unsaved(saved if saved is not None else set(state["state"]))

    def load_whole(self, state: dict) -> None:
        """From a checkpoint of solo 0.2: whole tensors, keyed by name (or by position, before that)."""
        if all(isinstance(k, int) for k in state["state"]):
            self.optimizer.load_state_dict(state)
            return
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=options)
        self._drop_unsaved(set(state["state"]))

    def _drop_unsaved(self, saved: set[str]) -> None:
        for name, p in self.model.named_parameters():
            if name not in saved:
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
    """Saves and restores `sharded` (ModelState, OptimizerState: every rank's tensors) and `components` (name ->
    object with state_dict/load_state_dict: rank 0's) with the step and `info` (e.g. the config) alongside."""

    def __init__(self, checkpoints: Checkpoints, sharded: dict, components: dict, info: dict):
        self.checkpoints, self.sharded, self.components, self.info = checkpoints, sharded, components, info

    def save(self, step: int) -> None:
        tensors = {name: c.state_dict() for name, c in self.sharded.items()}
        small = {name: c.state_dict() for name, c in self.components.items()}
        self.checkpoints.save(step, tensors, small | self.info | {"step": step})

    def load(self, path: Path) -> dict:
        """The small state of the checkpoint at `path` (for the checks before `restore`)."""
        return torch.load(path / SMALL_STATE if path.is_dir() else path, map_location="cpu", weights_only=True)

    def restore(self, path: Path, small: dict) -> int:
        """Load every component from the checkpoint at `path` (`small` its small state); returns its step."""
        if path.is_dir():
            tensors = {name: c.state_dict() for name, c in self.sharded.items()}
            load_sharded(path, tensors)
            prefix = "optimizer.state."
            saved = {key.removeprefix(prefix).rsplit(".", 1)[0] for key in saved_keys(path) if key.startswith(prefix)}
            self.sharded["model"].load_state_dict(tensors["model"])
            self.sharded["optimizer"].load_state_dict(tensors["optimizer"], saved)
        else:
            for name, c in self.sharded.items():
                c.load_whole(small[name])
        for name, component in self.components.items():
            component.load_state_dict(small[name])
        return small["step"]
