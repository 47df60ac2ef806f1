"""Jobs that stop early lose nothing: preemption signals, elastic restarts, two-node launches, killed writes; a killed
launcher takes its workers with it, and a second launch into a live run directory stops."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from solo.distributed.checkpoint import read_checkpoint
from tests.forked_launch import free_port
from tests.test_one_job import _alive
from tests.test_train import REPO, TINY, kill_processes_mentioning, launch, metrics, run, weights

pytestmark = pytest.mark.slow  # launches and restarts of 2-process jobs: minutes; `pytest -m slow`

COMMON = TINY + [
    "data.num_samples=128",
    "data.batch_size=8",
    "trainer.max_steps=48",
    "trainer.checkpoint_every_steps=5",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    run(COMMON, run_dir, nproc=2)
    return weights(run_dir)


def _wait_for(path: Path, proc, timeout=120):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


def _processes_mentioning(marker: str, also: str = "") -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, PermissionError):
            continue
        if marker in cmd and also in cmd:
            pids.append(int(pid))
    return pids


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_sigterm_leaves_a_checkpoint_at_the_current_step_and_resume_is_exact(tmp_path, uninterrupted):
    run_dir = tmp_path / "preempted"
    proc = launch(COMMON, run_dir, nproc=2, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(run_dir / "checkpoints" / "step-000000005", proc)
    for pid in _processes_mentioning(str(run_dir)):  # the scheduler signals every process of the step
        os.kill(pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    state = read_checkpoint(run_dir / "checkpoints" / "last")
    assert 5 < state["step"] < 48 and state["step"] % 5 != 0, (
        f"expected a preemption checkpoint, got step {state['step']}"
    )
    assert f"SIGTERM: checkpoint written at step {state['step']}" in out
    run(COMMON, run_dir, nproc=2)
    _assert_same(uninterrupted, weights(run_dir))
    steps = [m["step"] for m in metrics(run_dir) if "train/loss" in m]
    assert steps == list(range(1, 49))


def test_elastic_restart_after_a_worker_dies_is_exact(tmp_path, uninterrupted):
    run_dir = tmp_path / "elastic"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        "--max-restarts=1",
        "main_pretrain.py",
        *COMMON,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(run_dir / "checkpoints" / "step-000000005", proc)
    workers = [
        p
        for p in _processes_mentioning(str(run_dir), "main_pretrain.py")
        if p not in _processes_mentioning(str(run_dir), "torch.distributed.run")
    ]
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)  # one worker dies (OOM killer, node fault)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "resuming from" in out
    _assert_same(uninterrupted, weights(run_dir))


def test_two_nodes_on_one_machine_match_one_node(tmp_path, uninterrupted):
    run_dir = tmp_path / "two_nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=two-nodes",
                "main_pretrain.py",
                *COMMON,
                f"hydra.run.dir={run_dir}",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    _assert_same(uninterrupted, weights(run_dir))


_WRITER = """
import sys, torch
from solo.distributed.checkpoint import Checkpoints
c = Checkpoints(sys.argv[1], keep=2)
c.save(1, {"model": {"w": torch.zeros(4)}}, {"step": 1})
c.wait()
print("first saved", flush=True)
c.save(2, {"model": {"w": torch.randn(40_000_000)}}, {"step": 2})  # large: the kill lands while it is being written
c.wait()
"""


def test_killing_a_job_mid_write_leaves_the_previous_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first saved"
    _wait_for(tmp_path / ".step-000000002.tmp" / "trainer.pt", proc, timeout=60)
    proc.kill()
    proc.wait()
    assert not (tmp_path / "step-000000002").exists()
    state = read_checkpoint(tmp_path / "last")
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.zeros(4))


@pytest.mark.exhaustive  # CI: tests/test_slurm.py's srun launches one task per process
def test_srun_style_launch_without_torchrun_matches_torchrun(tmp_path, uninterrupted):
    """Two plain processes with the variables srun sets (one task per GPU, no torchrun) form the same group."""
    run_dir = tmp_path / "srun"
    job_id = str(20_000 + os.getpid() % 10_000)  # the port derives from it; unique per test process
    procs = []
    for rank in (0, 1):
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
        env.update(
            OMP_NUM_THREADS="1",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_JOB_NODELIST="localhost",
            SLURM_JOB_ID=job_id,
            SLURM_STEP_ID="0",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "main_pretrain.py", *COMMON, f"hydra.run.dir={run_dir}"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert "world size 2" in outs[0]
    _assert_same(uninterrupted, weights(run_dir))


def _children(pid: int) -> list[int]:
    """The PIDs of `pid`'s children (read before it dies: after, they are init's)."""
    children = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except (FileNotFoundError, PermissionError):
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            children.append(int(child))
    return children


def _published(checkpoints: Path) -> tuple[int, str]:
    """(the newest step-* checkpoint's step, where `last` points)."""
    steps = [int(p.name.removeprefix("step-")) for p in checkpoints.glob("step-*")]
    return max(steps), os.readlink(checkpoints / "last")


def test_workers_die_with_their_launcher_and_write_no_checkpoint_after(tmp_path):
    """SIGKILL to torchrun alone, as a dying node or the out-of-memory killer would (its workers are in sessions of
    their own): no worker lives 30 s later, and none publishes a checkpoint after the kill but the one it may have been
    writing then. Every checkpoint left is complete, and `last` one of them."""
    run_dir, every = tmp_path / "orphans", 2
    overrides = COMMON + ["trainer.max_steps=100000", f"trainer.checkpoint_every_steps={every}"]  # long: mid-run
    proc = launch(overrides, run_dir, nproc=2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = run_dir / "checkpoints"
    try:
        _wait_for(checkpoints / f"step-{2 * every:09d}", proc)
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        at_kill, _ = _published(checkpoints)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(2)
        after_kill = _published(checkpoints)
        deadline = time.time() + 28
        while any(map(_alive, workers)) and time.time() < deadline:
            time.sleep(0.1)
        alive, (newest, last) = [p for p in workers if _alive(p)], _published(checkpoints)
        assert not alive and newest <= at_kill + every and (newest, last) == after_kill, (
            f"{len(alive)} workers alive 30 s after their launcher was killed; newest checkpoint at the kill: step "
            f"{at_kill}, 2 s after: {after_kill}, now: {(newest, last)}"
        )
    finally:
        kill_processes_mentioning(str(run_dir))
    for step in checkpoints.glob("step-*"):
        assert {".metadata", "trainer.pt"} <= {p.name for p in step.iterdir()}, step
    assert read_checkpoint(checkpoints / "last")["step"] == int(last.removeprefix("step-"))


def test_a_second_launch_into_a_live_run_stops_with_one_line_and_the_first_ends_as_if_alone(tmp_path, uninterrupted):
    """The same `solo-pretrain --nproc_per_node=2` command twice: the second starts while the first trains (its
    workers held stopped meanwhile, so that it is mid-run however long the second takes to start) and stops with one
    `error:` line naming the first's rank 0 (exit status 2, no traceback); the first ends as if alone."""
    run_dir = tmp_path / "twice"
    command = [sys.executable, "-m", "solo", "--nproc_per_node=2", "--standalone", *COMMON, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    workers = []
    try:
        _wait_for(run_dir / "checkpoints" / "step-000000005", first)
        workers = _children(first.pid)
        rank0 = next(p for p in workers if b"\0RANK=0\0" in b"\0" + Path(f"/proc/{p}/environ").read_bytes())
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        assert first.poll() is None, "the first run must be mid-run"
        second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()
    output = second.stdout + second.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert second.returncode == 2 and "Traceback" not in output and len(errors) == 1, output
    assert errors[0].startswith(
        f"error: hydra.run.dir={run_dir}: another job is running in this directory (pid {rank0} on host "
        f"{socket.gethostname()}, rank 0 of 2 processes"
    ), output
    _assert_same(uninterrupted, weights(run_dir))
    steps = [m["step"] for m in metrics(run_dir) if "train/loss" in m]
    assert steps == list(range(1, 49)), "the second launch wrote no metrics"
