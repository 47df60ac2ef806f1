"""Process-group initialisation under torchrun, under SLURM's srun, or as one plain process."""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_JOB_ID")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun", "slurm" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    head = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if head is None or not head.group(1):
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges = head.group(1), head.group(3)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]  # keeps zero padding: '003-005' -> '003'


def slurm_port(job_id: str) -> int:
    # Every task of a job must agree on the port without talking to each other; different jobs
    # sharing a node should not collide. 15000-34999 avoids well-known and ephemeral ranges.
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        raise ValueError(f"cannot derive a port from SLURM_JOB_ID={job_id!r}; set MASTER_PORT")
    return 15000 + int(digits[-8:]) % 20000


def _require(env: Mapping[str, str], names: tuple[str, ...], what: str, hint: str) -> None:
    missing = [n for n in names if n not in env]
    if missing:
        raise RuntimeError(f"half-set {what} {', '.join(missing)} missing. {hint}")


def detect(env: Mapping[str, str] = os.environ) -> DistEnv:
    """Read the launcher's variables. torchrun's win over SLURM's (torchrun inside an srun step)."""
    if any(n in env for n in TORCHRUN_VARS):
        present = [n for n in TORCHRUN_VARS if n in env]
        _require(
            env,
            TORCHRUN_VARS,
            f"torchrun environment: {', '.join(present)} set but",
            "Launch with torchrun, or unset these variables to run as one process.",
        )
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=int(env["LOCAL_RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            launcher="torchrun",
        )
    # SLURM_PROCID alone is also set in the batch script itself (one process); only an srun step
    # with several tasks is a process group of our own.
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        _require(env, SLURM_VARS, "SLURM environment:", "Launch with srun inside an allocation, or use torchrun.")
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env["SLURM_LOCALID"]),
            world_size=int(env["SLURM_NTASKS"]),
            master_addr=env.get("MASTER_ADDR") or first_host(env["SLURM_JOB_NODELIST"]),
            master_port=int(env.get("MASTER_PORT") or slurm_port(env["SLURM_JOB_ID"])),
            launcher="slurm",
        )
    return DistEnv(0, 0, 1, "127.0.0.1", 0, launcher="single")


def init_distributed(env: DistEnv | None = None, timeout_s: float = 1800.0) -> tuple[DistEnv, torch.device]:
    """Join the process group (NCCL on CUDA, gloo on CPU) and pick this process's device.

    A single process gets no process group: every collective in solo is then the identity.
    """
    env = env or detect()
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if env.world_size > 1 and not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if env.launcher == "torchrun":
            # Join the store torchrun's agent already serves. It outlives elastic restarts, so keys of an
            # earlier attempt (the addresses of dead workers) must not be seen: one namespace per attempt.
            store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"solo/attempt{attempt}", store)
        else:
            store, _, _ = next(
                dist.rendezvous(f"tcp://{env.master_addr}:{env.master_port}", env.rank, env.world_size, timeout=timeout)
            )
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    return env, device


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@contextmanager
def process_group():
    """`with process_group() as (env, device):` init_distributed on entry, destroy_process_group on exit."""
    env, device = init_distributed()
    try:
        yield env, device
    finally:
        destroy_process_group()


def destroy_process_group() -> None:
    """Leave the process group. DDP reducers still alive then (kept by reference cycles until the next
    garbage collection) can abort the process with gloo, so collect them first (a full collection: only then)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
