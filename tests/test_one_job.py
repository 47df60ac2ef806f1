"""One job per run directory (solo.distributed.run_dir), against jobs of real gloo process groups, each process forked
from the checker's server (solo.losses.check.worker_context); and workers that die with their launcher
(solo.launch.die_with_launcher), as real processes. The same end to end, under torchrun: tests/test_restarts.py."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from solo.distributed.run_dir import LOCK_FILE, hold_run_dir
from solo.errors import ConfigError
from solo.losses.check import worker_context

REPO = Path(__file__).resolve().parents[1]

# A launcher and its worker, as torchrun's agent starts one (Popen): the worker sets the signal, says so, then waits.
WORKER = (
    "import time; from solo.launch import die_with_launcher; die_with_launcher(); print('set', flush=True); "
    "time.sleep(60)"
)
LAUNCHER = (
    "import subprocess, sys, time; print(subprocess.Popen([sys.executable, '-c', sys.argv[1]]).pid, flush=True); "
    "time.sleep(60)"
)


def _environment(**variables) -> dict:
    """This process's environment without any launcher's variables, and `variables`."""
    own = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "SOLO_LAUNCHER_PID")}
    return {**own, **variables}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_a_worker_dies_with_its_launcher():
    """SIGKILL to the launcher alone (no handler runs): its worker is gone within seconds."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, WORKER],
        cwd=REPO,
        env=_environment(TORCHELASTIC_RUN_ID="test"),
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(launcher.stdout.readline())
    try:
        assert launcher.stdout.readline().strip() == "set"
        launcher.kill()
        launcher.wait()
        deadline = time.time() + 5
        while _alive(worker) and time.time() < deadline:
            time.sleep(0.01)
        assert not _alive(worker), "the worker outlived its launcher"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_whose_launcher_died_before_it_set_the_signal_dies_at_once():
    """solo's launcher passes its PID: a worker whose parent is another process (its launcher died, it was
    re-parented) kills itself; whose parent is the launcher, lives on; started from a shell, not by torchrun, lives on
    whatever its parent."""
    check = "from solo.launch import die_with_launcher; die_with_launcher(); print('alive')"
    cases = {  # (variables, lives)
        "started by this launcher": ({"TORCHELASTIC_RUN_ID": "test", "SOLO_LAUNCHER_PID": str(os.getpid())}, True),
        "orphaned": ({"TORCHELASTIC_RUN_ID": "test", "SOLO_LAUNCHER_PID": str(os.getppid())}, False),
        "not a worker": ({"SOLO_LAUNCHER_PID": str(os.getppid())}, True),
    }
    for case, (variables, lives) in cases.items():
        done = subprocess.run(
            [sys.executable, "-c", check], cwd=REPO, env=_environment(**variables), capture_output=True, text=True
        )
        assert (done.returncode, done.stdout) == ((0, "alive\n") if lives else (-signal.SIGKILL, "")), case


def _job(rank, world, store, run_dir, queue, leave):
    """A process of a job: holds run_dir (or is refused), says so with its PID and host, leaves when told (if given)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        with hold_run_dir(run_dir):
            queue.put((rank, os.getpid(), socket.gethostname(), None))
            if leave is not None:
                leave[rank].wait()
    except ConfigError as e:
        queue.put((rank, os.getpid(), socket.gethostname(), str(e)))
    finally:
        dist.destroy_process_group()


def _start(world, run_dir, queue, tmp, name, leave=None, join=True):
    return mp.start_processes(
        _job,
        args=(world, os.path.join(tmp, name), str(run_dir), queue, leave),
        nprocs=world,
        start_method="forkserver",
        join=join,
    )


def _reports(queue, world) -> dict:
    return {rank: rest for rank, *rest in (queue.get() for _ in range(world))}


@pytest.mark.slow  # process groups of 2 and 3 processes, four times: about 10 s
def test_a_second_job_of_another_world_size_is_refused_while_any_process_of_the_first_lives(tmp_path):
    """A job of 2 holds the directory (its ranks do not exclude each other); a job of 3 is refused on every rank with
    one line naming the holder's rank 0, its PID and host; still refused once that rank 0 has left, since the first
    job's rank 1 holds on; let in once no process of the first job is left."""
    ctx = worker_context()
    queue = ctx.SimpleQueue()
    leave = [ctx.Event(), ctx.Event()]
    with tempfile.TemporaryDirectory() as tmp:
        first = _start(2, tmp_path, queue, tmp, "first", leave, join=False)
        try:
            holders = _reports(queue, 2)
            assert all(error is None for _, _, error in holders.values()), holders
            pid, host, _ = holders[0]

            _start(3, tmp_path, queue, tmp, "second")
            refused = _reports(queue, 3)
            errors = {error for _, _, error in refused.values()}
            assert len(errors) == 1, errors  # the same line on every rank
            error = errors.pop()
            assert error.startswith(
                f"hydra.run.dir={tmp_path}: another job is running in this directory (pid {pid} on "
            )
            assert f"host {host}, rank 0 of 2 processes" in error and "choose another hydra.run.dir" in error
            assert "\n" not in error
            listed = (tmp_path / LOCK_FILE).read_text()
            assert all(f"rank {r}: pid {p} on host {h}" in listed for r, (p, h, _) in holders.items()), listed

            leave[0].set()  # the first job's rank 0 is gone, its rank 1 trains on
            _start(3, tmp_path, queue, tmp, "third")
            assert {error for _, _, error in _reports(queue, 3).values()} == {error}
        finally:
            for event in leave:
                event.set()
            while not first.join():
                pass

        _start(3, tmp_path, queue, tmp, "fourth")
        admitted = _reports(queue, 3)
        assert all(error is None for _, _, error in admitted.values()), admitted
        first_line = (tmp_path / LOCK_FILE).read_text().splitlines()[0]
        assert first_line.startswith(f"pid {admitted[0][0]} on host {admitted[0][1]}, rank 0 of 3 processes")
