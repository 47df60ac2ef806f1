"""`solo-pretrain --nproc_per_node=N ...` (and `python -m solo --nproc_per_node=N ...`): the launcher flags torchrun
takes, split from the command line; the workers started through torchrun's own Python API (torch.distributed.run),
each running `python -m solo` with the rest of the command line, which has no launcher flag left to launch again.
solo.cli validates the configuration before `launch` is called, so that a bad one never starts a worker.

A worker of torchrun (or of this launcher) dies with its launcher (`die_with_launcher`). torchrun starts each worker in
a session of its own, so a launcher killed with SIGKILL (a failing node, the out-of-memory killer: no handler runs)
left its workers training, re-parented to init, writing checkpoints into the run directory that the same command, run
again to resume, writes into too. The kernel's parent-death signal (prctl PR_SET_PDEATHSIG, Linux) kills the worker
instead, at once and mid-step if need be, so nothing is written after its launcher died; unlike a watchdog thread
polling the parent, it needs no polling and acts on a worker blocked in a collective or in C code holding the GIL.

The signal fires when the *thread* that forked the worker exits, not the process. torchrun's agent forks every worker
(subprocess.Popen in torch.distributed.elastic.multiprocessing's SubprocessContext, from start_processes, from
LocalElasticAgent._start_workers within agent.run(); no thread in between) on the thread that called torchrun's main,
the main thread (`launch` below calls it on this process's), which lives until the agent exits: the signal never fires
while the launcher lives. A launcher that died before the worker set the signal is caught by the parent PID where it
is known, as this launcher passes it. Plain torchrun does not say its PID (and in a container it is often PID 1
itself, so a parent of 1 proves nothing): a torchrun that dies while its workers import, before they set the signal
in their entry point, is not caught. Elsewhere than Linux, nothing is done."""

from __future__ import annotations

import ctypes
import os
import signal
import site
import sys

# torchrun's flags that `solo-pretrain` takes (either spelling, `--flag=value` or `--flag value`); any --rdzv_* too.
VALUE_FLAGS = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port")
SWITCHES = ("standalone",)
LAUNCHER_PID = "SOLO_LAUNCHER_PID"  # set by `launch` for its workers: the parent they were started by
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def split_launcher_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun's flags as `--name=value`, the rest of `argv` in its order: Hydra's overrides and flags)."""
    launcher, rest = [], []
    args = iter(argv)
    for arg in args:
        name, has_value, value = arg.partition("=")
        flag = name[2:].replace("-", "_") if name.startswith("--") else ""
        if flag in SWITCHES and not has_value:
            launcher.append(f"--{flag}")
        elif flag in VALUE_FLAGS or flag.startswith("rdzv_"):
            if not has_value:
                value = next(args, None)
                if value is None:
                    from solo.errors import ConfigError

                    raise ConfigError(f"{name}: needs a value ({name}=...)")
            launcher.append(f"--{flag}={value}")
        else:
            rest.append(arg)
    return launcher, rest


def worker_pythonpath() -> str:
    """PYTHONPATH for the workers: this solo importable as `python -m solo` from any working directory (a checkout run
    as `python main_pretrain.py --nproc_per_node=2 ...` is not installed)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    installed = {os.path.abspath(p) for p in [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]}
    if here not in paths and here not in installed:
        paths.append(here)
    return os.pathsep.join(paths)


def launch(launcher: list[str], argv: list[str]) -> None:
    """Start the workers as torchrun does with `launcher` flags, each running `python -m solo <argv>`; exits with the
    workers' status. A worker that failed with solo's own error (status 2) has said why on rank 0: nothing more is
    printed; another failure is named in one line instead of torchrun's report."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ["PYTHONPATH"] = worker_pythonpath()
    os.environ[LAUNCHER_PID] = str(os.getpid())
    args = parse_args([*launcher, "--module", "solo", *argv])
    if "OMP_NUM_THREADS" not in os.environ and str(args.nproc_per_node).isdigit():  # else torchrun's 1 per process
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // int(args.nproc_per_node)))
    try:
        run(args)
    except ChildFailedError as e:
        failures = e.failures
        if 0 in failures and failures[0].exitcode == 2:
            sys.exit(2)
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            how, code = f"was killed by {name}", 128 - code
        else:
            how = f"exited with status {code}"
        if failure.exitcode == -signal.SIGKILL:  # what the kernel's out-of-memory killer sends
            how += (
                " (most likely the kernel's out-of-memory killer; dmesg says): a smaller data.batch_size, "
                "data.image_size or data.num_workers, or trainer.activation_checkpointing=true, then the same command "
                "resumes"
            )
        print(f"error: worker rank {rank} {how}; its output is above", file=sys.stderr)
        sys.exit(code if 0 < code < 256 else 1)
    except SignalException as e:  # Ctrl-C or SIGTERM to the launcher: torchrun has stopped the workers
        sys.exit(128 + int(e.sigval))


def die_with_launcher() -> None:
    """In a worker started by torchrun (TORCHELASTIC_RUN_ID is set): be killed (SIGKILL) by the kernel when the
    launcher dies; already orphaned (the parent is not the launcher that started it), die now. Anywhere else (a
    plain `python main_pretrain.py`, whose parent is a shell; srun's tasks, which slurmstepd stops), nothing."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is not None and os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGKILL)  # as the signal would have, had it been set before the launcher died
