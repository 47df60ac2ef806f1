"""Checkpoints that are never half-written (temp file + fsync + rename, last.pt as a hard link), holding
the state of every stateful component of the trainer."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import torch
import torch.distributed as dist

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
    `info` (e.g. the config) alongside. Rank 0 writes; every rank waits until the file is complete."""

    def __init__(self, checkpoints: Checkpoints, components: dict, info: dict, is_main: bool):
        self.checkpoints, self.components, self.info, self.is_main = checkpoints, components, info, is_main

    def save(self, step: int) -> None:
        if self.is_main:
            state = {name: c.state_dict() for name, c in self.components.items()}
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
