"""The state of every stateful component of the trainer, saved to and restored from checkpoints
(solo.distributed.checkpoint): the model's and optimizer's tensors as each rank holds them (FSDP's shards), each
rank's random generators under its own key, the rest from rank 0."""

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

from solo.data.sampling.seeding import sample_seed
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
    """This process's global random generators (torch's CPU one, its own CUDA device's, Python's) as a checkpoint
    component: every rank saves its own under its own key and restores its own, whatever number of devices it sees.
    A rank the checkpoint holds none for (a resume at a larger world size) seeds them from (seed, rank, step)."""

    def __init__(self, device: torch.device, rank: int, seed: int):
        self.device, self.rank, self.seed = device, rank, seed
        self.key = f"rank{rank}"

    def state_dict(self) -> dict:
        """{"rank<r>": (torch CPU state, this device's CUDA state or None, Python's state)}: a tuple, so that DCP saves
        it as one object, written by this rank."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {self.key: (torch.get_rng_state(), cuda, random.getstate())}

    def restore(self, saved: dict | None, step: int) -> None:
        """From a checkpoint's `saved` generators: state_dict()'s of every rank that saved; or, in checkpoints written
        before, rank 0's alone ({"torch", "cuda": one state per device it saw, "python"}), which every rank takes."""
        if saved is not None and "torch" in saved:
            own = (saved["torch"], own_cuda_state(saved["cuda"], self.device), saved["python"])
        else:
            own = (saved or {}).get(self.key)
        if own is None:
            torch.manual_seed(sample_seed(self.seed, step, self.rank, 0))
            random.seed(sample_seed(self.seed, step, self.rank, 1))
            return
        cpu, cuda, python = own
        torch.set_rng_state(cpu)
        if cuda is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(cuda, self.device)
        random.setstate(python)


def own_cuda_state(saved: list, device: torch.device) -> torch.Tensor | None:
    """This process's CUDA generator state in a checkpoint written before the states were per rank, which holds one per
    device the saving process saw: the entry at this process's device index when there is one (a process may see fewer
    devices than the one that saved); None on the CPU."""
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return saved[index] if index < len(saved) else None


class Checkpointer:
    """Saves and restores `sharded` (ModelState, OptimizerState: every rank's tensors), every rank's `generators` and
    `components` (name -> object with state_dict/load_state_dict: rank 0's) with the step and `info` (e.g. the config)
    alongside."""

    def __init__(self, checkpoints: Checkpoints, sharded: dict, generators: RNGState, components: dict, info: dict):
        self.checkpoints, self.sharded, self.generators = checkpoints, sharded, generators
        self.components, self.info = components, info

    def save(self, step: int) -> None:
        tensors = {name: c.state_dict() for name, c in self.sharded.items()} | {"rng": self.generators.state_dict()}
        small = {name: c.state_dict() for name, c in self.components.items()}
        self.checkpoints.save(step, tensors, small | self.info | {"step": step})

    def load(self, path: Path) -> dict:
        """The small state of the checkpoint at `path` (for the checks before `restore`)."""
        return torch.load(path / SMALL_STATE if path.is_dir() else path, map_location="cpu", weights_only=True)

    def restore(self, path: Path, small: dict) -> int:
        """Load every component from the checkpoint at `path` (`small` its small state); returns its step."""
        generators = small.get("rng")  # in checkpoints written before the generators were per rank
        if path.is_dir():
            tensors = {name: c.state_dict() for name, c in self.sharded.items()}
            tensors["rng"] = {self.generators.key: None}  # this rank's generators only; None where it has none
            load_sharded(path, tensors)
            generators = generators or tensors["rng"]
            prefix = "optimizer.state."
            saved = {key.removeprefix(prefix).rsplit(".", 1)[0] for key in saved_keys(path) if key.startswith(prefix)}
            self.sharded["model"].load_state_dict(tensors["model"])
            self.sharded["optimizer"].load_state_dict(tensors["optimizer"], saved)
        else:
            for name, c in self.sharded.items():
                c.load_whole(small[name])
        for name, component in self.components.items():
            component.load_state_dict(small[name])
        self.generators.restore(generators, small["step"])
        return small["step"]
