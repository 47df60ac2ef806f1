"""Training checkpoints on disk, and the one function that reads them.

A checkpoint is a directory `<dir>/step-<N>/`: the model's and the optimizer's tensors saved by every rank through
torch's distributed checkpoint (DCP: each rank writes its own shards, a tensor that several ranks hold whole is
written once, and a reader at another world size or strategy reads the pieces it needs), and `trainer.pt`, rank 0's
small state (step, data position, config). It is written under a hidden name; once every rank has written its
part, rank 0 records every file's size (`files.json`), renames the directory, then switches `<dir>/last` (a symbolic
link) to it in one rename: a reader sees the old or the new checkpoint, never a half-written one. Saving is
asynchronous: the state is copied to host memory, training goes on, and the files are written in a background thread.

Every checkpoint is verified before it is read (`damage`: file sizes against DCP's metadata and `files.json`, no
tensor read), so that a file cut short or removed later (a full disk, an interrupted copy) is named rather than met
as an EOFError; `find_checkpoints` gives the newest intact one. Checkpoints of solo 0.2 and before (`step-<N>.pt`,
`last.pt`) still load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
SIZES = "files.json"  # every file's size in bytes, written by rank 0 once every rank has written its part
DCP_METADATA = ".metadata"  # DCP's: each item's file, offset and length


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

    def find(self) -> Found:
        """`find_checkpoints` as rank 0 sees it, on every rank: all ranks resume from the same checkpoint, even where a
        shared file system shows them different files for a while."""
        found = [find_checkpoints(self.dir) if self.is_main else None]
        if self.group is not None:
            dist.broadcast_object_list(found, src=0, group=self.group)
        return found[0]

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
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        _atomic_write(tmp / SIZES, lambda f: f.write(json.dumps(sizes, indent=1).encode()))
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


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint at `path`, None when it is intact. File sizes only, no tensor is read: every
    file of `files.json` has the size it was written with, and every file that DCP's metadata names holds its items
    (offset + length); checkpoints written before `files.json` existed are checked against the metadata alone. A .pt
    file of solo 0.2 is not checked (torch.load finds a cut one as it reads it)."""
    if path.is_symlink() and not path.exists():
        return f"it links to {os.readlink(path)}, which does not exist"
    if not path.exists():
        return "it does not exist"
    if path.is_file():
        return None
    sizes = path / SIZES
    if sizes.exists():
        try:
            written = json.loads(sizes.read_text())
        except ValueError:
            return f"{SIZES} cannot be read"
        for name, size in written.items():
            if (found := _size(path / name)) != size:
                return f"{name} is missing" if found is None else f"{name} holds {found} bytes, {size} were written"
    for name in (SMALL_STATE, DCP_METADATA):
        if not (path / name).is_file():
            return f"{name} is missing"
    try:
        items = dcp.FileSystemReader(path).read_metadata().storage_data.values()
    except Exception as e:
        return f"{DCP_METADATA} cannot be read ({type(e).__name__})"
    needed: dict[str, int] = {}
    for item in items:
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), item.offset + item.length)
    for name, end in sorted(needed.items()):
        if (found := _size(path / name)) is None or found < end:
            return f"{name} is missing" if found is None else f"{name} holds {found} bytes, its items need {end}"
    return None


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


@dataclass(frozen=True)
class Found:
    """A directory's checkpoints as a resume sees them: the newest intact one (None if there is none) and, newest
    first, the damaged ones newer than it, each with what is wrong."""

    intact: Path | None
    damaged: tuple[tuple[Path, str], ...] = ()

    def describe_damage(self) -> str:
        """The damaged checkpoints, on one line: `checkpoint <path> (<link target>) is damaged: <what>; ...`."""
        return "; ".join(
            f"checkpoint {path}{f' ({os.readlink(path)})' if path.is_symlink() else ''} is damaged: {why}"
            for path, why in self.damaged
        )


def find_checkpoints(directory: Path) -> Found:
    """`directory`'s checkpoints verified (`damage`) newest first until one is intact: `last` (or solo 0.2's
    `last.pt`), then every `step-<N>` by decreasing N."""
    last = next((p for p in (directory / "last", directory / "last.pt") if p.is_symlink() or p.exists()), None)
    entries = list(directory.iterdir()) if directory.is_dir() else []
    steps = sorted(((int(m.group(1)), p.name, p) for p in entries if (m := STEP.match(p.name))), reverse=True)
    linked = last.resolve() if last is not None else None
    damaged = []
    for path in ([last] if last is not None else []) + [p for _, _, p in steps if p.resolve() != linked]:
        why = damage(path)
        if why is None:
            return Found(path, tuple(damaged))
        damaged.append((path, why))
    return Found(None, tuple(damaged))


def is_checkpoint(path: Path) -> bool:
    """`path` is a checkpoint (a step's, or `last`), whole or damaged, rather than a run directory."""
    named = bool(STEP.match(path.name)) or path.name == "last"
    return (path.exists() or path.is_symlink()) and named or (path / SMALL_STATE).exists()


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
    `path` a checkpoint directory (or `last`) or a `.pt` file of solo 0.2. No optimizer state: resuming reads that.
    A damaged checkpoint (`damage`) is a CheckpointError that names the newest intact one beside it."""
    path = Path(path)
    why = damage(path)
    if why is not None:
        intact = find_checkpoints(path.parent).intact
        instead = (
            f"the newest intact checkpoint beside it is {intact}" if intact else "no checkpoint beside it is intact"
        )
        raise CheckpointError(f"checkpoint {path} is damaged: {why}; {instead}")
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
