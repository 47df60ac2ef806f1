"""One job per run directory: every process of a job holds a lock on `<run dir>/.lock` while it runs, and a job
launched into a directory that a live job holds stops, on every rank, with one error line that names the holder.

The lock is a POSIX record lock (`fcntl.lockf`) that each process takes on its own open file; the kernel releases it
when the process exits or is killed, so a killed job leaves no stale lock. POSIX locks rather than BSD ones (`flock`):
NFS (v3 through its lock manager, v4 natively) and the cluster file systems (Lustre mounted with `-o flock`, GPFS,
CephFS) make POSIX locks hold across nodes, whereas `flock` is node-local on older NFS clients and merely emulated
with a POSIX lock on Linux's since 2.6.12. Where a file system keeps locks per node only (Lustre's `-o localflock`,
BeeGFS by default), two jobs are stopped on one node and not across nodes; where it has no locks at all, rank 0 says
so in one line and the run goes on unguarded. An NFS server frees a crashed node's locks when its lease ends (about
90 s for NFSv4).

A job takes the lock in three steps, so that its own ranks never exclude each other (of any world size, against a job
of any world size) and no rank waits in a collective for ranks that stopped:
1. rank 0 takes the lock exclusively, without waiting. That fails while any process of another job holds it, rank 0
   or not (the workers of a dead rank 0 still running on other nodes, say). Having it, rank 0 writes who holds it
   into the file, then converts it to a shared lock: one atomic step for POSIX locks (not for `flock`), so no other
   job gets in between;
2. rank 0's outcome is broadcast; on success, every other rank takes the shared lock;
3. every rank's outcome is gathered, and if one failed, every rank raises the same ConfigError.

POSIX locks belong to a process and never exclude their own process; closing any descriptor of the file drops them,
so nothing but this module opens the lock file, once per process.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist

from solo.distributed.env import rank, world_size
from solo.errors import ConfigError

log = logging.getLogger("solo")

LOCK_FILE = ".lock"
HELD = (errno.EACCES, errno.EAGAIN)  # lockf's answer when another process holds a conflicting lock
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # a file system without (POSIX) locks
LOCKED, NO_LOCKS = "locked", "no locks"  # a step's outcomes that let the job go on; any other is why not
FINE = (LOCKED, NO_LOCKS)


@contextmanager
def hold_run_dir(run_dir: str | Path):
    """Every process of the job holds the lock on `run_dir` while the block runs (and until it dies). Raises
    ConfigError on every rank when another job holds it. Call it on every rank, after the process group is up."""
    path = Path(run_dir) / LOCK_FILE
    held = []  # the open lock file, once opened: closing it releases the lock
    try:
        problem = _lock(path, held)
        if problem:
            raise ConfigError(f"hydra.run.dir={run_dir}: {problem}")
        yield
    finally:
        for file in held:
            file.close()


def _lock(path: Path, held: list) -> str | None:
    """Take the job's lock on `path` (steps 1 to 3 above), appending the open file to `held`; what stops the job, or
    None. Every rank takes part in every collective, whatever happened on its own."""
    me, world = rank(), world_size()
    outcome = _step(_take_first, path, held, world) if me == 0 else None
    if world > 1:
        shared = [outcome]
        dist.broadcast_object_list(shared, src=0)
        outcome = shared[0]
    if me > 0 and outcome == LOCKED:
        outcome = _step(_take_shared, path, held)
    if world > 1:
        outcomes = [None] * world
        dist.all_gather_object(outcomes, (outcome, socket.gethostname(), os.getpid()))
        if me == 0 and outcome == LOCKED:
            outcome = _step(_list_processes, path, held, outcomes)
        outcome = next((o for o, _, _ in outcomes if o not in FINE), outcome)
    return None if outcome in FINE else outcome


def _step(take, path: Path, *args) -> str:
    """`take(path, *args)`, its OSError as why the job stops (rather than raised on one rank only)."""
    try:
        return take(path, *args)
    except OSError as e:
        return f"cannot lock {path}: {e.strerror or e}"


def _open(path: Path, held: list):
    path.parent.mkdir(parents=True, exist_ok=True)
    held.append(open(path, "a+"))  # noqa: SIM115 (reading and writing; appends go where truncate left the end)
    return held[-1]


def _take_first(path: Path, held: list, world: int) -> str:
    """Rank 0's step: LOCKED, NO_LOCKS, or why not."""
    file = _open(path, held)
    try:
        fcntl.lockf(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in HELD:
            file.seek(0)
            holder = file.readline().strip() or f"it has not written who it is into {path} yet"
            return (
                f"another job is running in this directory ({holder}; {path} lists its processes): wait for it "
                "to end, stop it, or choose another hydra.run.dir"
            )
        if e.errno in UNSUPPORTED:
            log.warning(
                f"cannot lock {path} ({e.strerror}): nothing stops another job from writing into this directory"
            )
            return NO_LOCKS
        raise
    file.truncate(0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    file.write(f"pid {os.getpid()} on host {socket.gethostname()}, rank 0 of {world} processes, since {started}\n")
    file.flush()
    fcntl.lockf(file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # converted in place: never released in between
    return LOCKED


def _take_shared(path: Path, held: list) -> str:
    """Another rank's step, once rank 0 holds the lock: LOCKED, NO_LOCKS, or why not."""
    file = _open(path, held)
    try:
        fcntl.lockf(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in UNSUPPORTED:
            return NO_LOCKS
        raise
    return LOCKED


def _list_processes(path: Path, held: list, outcomes: list) -> str:
    """Rank 0 adds every process of the job to the lock file, below its first line."""
    file = held[0]
    file.writelines(f"rank {r}: pid {pid} on host {host}\n" for r, (_, host, pid) in enumerate(outcomes))
    file.flush()
    return LOCKED
