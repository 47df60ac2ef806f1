"""Checkpoints that are never half-written: temp file + fsync + rename, last.pt as a hard link."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

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
            raise RuntimeError(
                f"cannot load checkpoint {path}: {e}. Delete it to fall back to an older step-*.pt in {self.dir}, "
                "or set trainer.resume=false with a new hydra.run.dir"
            ) from e

    def _prune(self) -> None:
        steps = sorted(p for p in self.dir.iterdir() if STEP_FILE.search(p.name))
        for old in steps[: -self.keep]:
            old.unlink()


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
