"""Stop cleanly when the scheduler says so: checkpoint at the current step, then requeue under SLURM."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Callable

import torch
import torch.distributed as dist

from solo.errors import ConfigError


class Preemption:
    """Records the configured signals (SLURM's `--signal=USR1@90`, SIGTERM at the time limit or on
    preemption) instead of dying, so the loop can finish the step, save and leave at a step boundary.

    `requested()` agrees across ranks (one tiny all-reduce and a host read, so the trainer asks only when it
    logs, every trainer.log_every_steps): a signal that reached only some ranks, or reached them at different
    steps, still stops every rank after the same step.
    """

    def __init__(self, signal_names: list[str], device: torch.device, announce: Callable[[str], None] = print):
        self.device, self.announce = device, announce  # announce(signal name): says what happens next, once
        self.pid = os.getpid()  # DataLoader workers forked from this process inherit the handler: they ignore it
        self.received: str | None = None
        self.previous: dict[signal.Signals, object] = {}  # what handled each signal before: restored by close()
        for name in signal_names:
            sig = getattr(signal, name, None)
            if not isinstance(sig, signal.Signals):
                raise ConfigError(
                    f"trainer.preempt_signals: unknown signal {name!r}; use names such as SIGUSR1, SIGTERM"
                )
            self.previous[sig] = signal.signal(sig, self._record)

    def close(self) -> None:
        """Give each signal back to the handler it had before."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _record(self, signum, frame) -> None:
        if os.getpid() != self.pid:  # a data worker (Ctrl-C reaches the terminal's whole process group)
            return
        if signum == signal.SIGINT and self.received == "SIGINT":
            raise KeyboardInterrupt  # Ctrl-C again: stop now, without waiting for the checkpoint (the trainer says so)
        first, self.received = self.received is None, signal.Signals(signum).name
        if first:
            self.announce(self.received)

    def requested(self) -> bool:
        flag = torch.tensor([1.0 if self.received else 0.0], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def requeue_slurm_job() -> str | None:
    """`scontrol requeue` this job (rank 0 only); returns what was done, or None outside SLURM."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return f"scontrol requeue {job_id} failed: {result.stderr.strip()}"
    return f"requeued SLURM job {job_id}"
