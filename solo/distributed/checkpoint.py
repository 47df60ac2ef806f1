"""Training checkpoints on disk, and the one function that reads them.

A checkpoint is a directory `<dir>/step-<N>/`: the model's and the optimizer's tensors saved by every rank through
torch's distributed checkpoint (DCP: each rank writes its own shards, a tensor that several ranks hold whole is
written once, and a reader at another world size or strategy reads the pieces it needs), and `trainer.pt`, rank 0's
small state (step, data position, random state, config). It is written under a hidden name and renamed when complete,
then `<dir>/last` (a symbolic link) is switched to it in one rename: a reader sees the old or the new checkpoint,
never a half-written one. Saving is asynchronous: the state is copied to host memory, training goes on, and the
files are written in a background thread. Checkpoints of solo 0.2 and before (`step-<N>.pt`, `last.pt`) still load.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from solo.errors import CheckpointError

# One process passes no_dist=True, and torch warns on every save and load all the same: nothing to act on.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

STEP = re.compile(r"^step-(\d+)(\.pt)?$")  # a DCP directory, or a file of solo 0.2
SMALL_STATE = "trainer.pt"


class Checkpoints:
    """`<dir>/step-<N>/` checkpoints, the newest also reachable as `<dir>/last`; keeps the last `keep`. Every rank
    calls `save` and `wait`; rank 0 (`is_main`) writes the small state and publishes."""

    def __init__(self, directory: str | Path, keep: int, is_main: bool = True):
        if keep < 1:
            raise ValueError(f"trainer.keep_checkpoints must be >= 1, got {keep}")
        self.dir, self.keep, self.is_main = Path(directory), keep, is_main
        # Its own gloo group: the background writes' collectives must not interleave with the training's.
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending: Future | None = None

    @property
    def last(self) -> Path:
        return self.dir / "last"

    def find_last(self) -> Path | None:
        return last_checkpoint(self.dir)

    def save(self, step: int, tensors: dict, small: dict) -> None:
        """Start writing step `step`: `tensors` (this rank's state dicts, DTensor shards or whole tensors) through
        DCP, `small` from rank 0. Returns once the state is copied; `wait()` waits for the files."""
        self.wait()  # one checkpoint in flight at a time
        final, tmp = self.dir / f"step-{step:09d}", self.dir / f".step-{step:09d}.tmp"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while writing
            tmp.mkdir(parents=True)
            _atomic_write(tmp / SMALL_STATE, lambda f: torch.save(small, f))
        if self.group is not None:
            dist.barrier(self.group)  # the directory exists before any rank writes into it
        written = dcp.async_save(tensors, checkpoint_id=tmp, process_group=self.group, no_dist=self.group is None)
        self.pending = self.writer.submit(self._publish, written, tmp, final)

    def wait(self) -> None:
        """Block until the checkpoint being written is complete and published (its errors are raised here)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def _publish(self, written: Future, tmp: Path, final: Path) -> None:
        written.result()  # on rank 0, DCP finishes after every rank has written its part
        if not self.is_main:
            return
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again (a run resumed before it)
        os.replace(tmp, final)
        link = self.dir / ".last.tmp"
        link.unlink(missing_ok=True)
        os.symlink(final.name, link)  # relative: the run directory can move
        if self.last.is_dir() and not self.last.is_symlink():  # a copy that followed the link (cp -L, copytree)
            shutil.rmtree(self.last)
        os.replace(link, self.last)
        (self.dir / "last.pt").unlink(missing_ok=True)  # solo 0.2's, now older than `last`
        _fsync_dir(self.dir)
        self._prune()

    def _prune(self) -> None:
        steps = sorted((int(m.group(1)), p) for p in self.dir.iterdir() if (m := STEP.match(p.name)))
        for _, old in steps[: -self.keep]:
            shutil.rmtree(old) if old.is_dir() else old.unlink()


def last_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in `directory`: `last`, else a `last.pt` of solo 0.2; None if neither."""
    for path in (directory / "last", directory / "last.pt"):
        if path.exists():
            return path
    return None


def saved_keys(path: Path) -> set[str]:
    """The flattened keys of the tensors and objects in a DCP checkpoint (e.g. "model.backbone.conv1.weight")."""
    return set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)


def load_sharded(path: Path, tensors: dict) -> None:
    """Fill `tensors` (state dicts of this rank's model and optimizer, shards or whole) in place from the DCP
    checkpoint at `path`, whatever the world size and strategy that saved it. Entries absent there are left as
    they are (an optimizer state that did not exist yet)."""
    planner = DefaultLoadPlanner(allow_partial_load=True)
    dcp.load(tensors, checkpoint_id=path, planner=planner, no_dist=not dist.is_initialized())


def read_checkpoint(path: str | Path) -> dict:
    """A training checkpoint as one process holds it: {"model": whole tensors on the CPU, "step", "config", ...};
    `path` a checkpoint directory (or `last`) or a `.pt` file of solo 0.2. No optimizer state: resuming reads that."""
    path = Path(path)
    try:
        if path.is_file():
            return torch.load(path, map_location="cpu", weights_only=True)
        state = torch.load(path / SMALL_STATE, map_location="cpu", weights_only=True)
        metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        model = {
            key: torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in metadata.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
        dcp.load(model, checkpoint_id=path, no_dist=True)
    except Exception as e:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {type(e).__name__}: {e}. Delete it to fall back to an older step-* "
            f"checkpoint in {path.parent}, or start a new run (hydra.run.dir=...)"
        ) from None
    return state | {"model": {key.removeprefix("model."): value for key, value in model.items()}}


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
