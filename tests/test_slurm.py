"""The repository's sbatch script on a real one-machine SLURM cluster (slurmctld + slurmd on localhost, CPU only)."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from solo.distributed.checkpoint import read_checkpoint
from tests.forked_launch import free_port
from tests.test_train import REPO, TINY

pytestmark = pytest.mark.slow  # a real SLURM cluster and several jobs: minutes; `pytest -m slow`

DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")


def _sh(*cmd, env=None, check=True) -> str:
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result.stdout


def _wait(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(
            f"SLURM cannot be started here: {', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
        )
    if os.geteuid() != 0:
        pytest.skip("SLURM cannot be started here: the test cluster's daemons must run as root")
    if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["munged", "--force"], capture_output=True)
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            pytest.skip("SLURM cannot be started here: munged (authentication) did not start")

    home = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log"):
        (home / sub).mkdir()
    node = _sh("slurmd", "-C").splitlines()[0].split(" UpTime")[0]
    name = re.match(r"NodeName=(\S+)", node).group(1)
    conf = home / "slurm.conf"
    conf.write_text(
        f"""ClusterName=solotest
SlurmctldHost={name}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmUser=root
SlurmdUser=root
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool
SlurmctldPidFile={home}/slurmctld.pid
SlurmdPidFile={home}/slurmd.pid
SlurmctldLogFile={home}/log/slurmctld.log
SlurmdLogFile={home}/log/slurmd.log
ReturnToService=2
JobRequeue=1
MpiDefault=none
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    _sh("slurmctld", "-c", env=env)
    _sh("slurmd", "-c", env=env)
    try:
        _wait(lambda: _sh("sinfo", "-h", "-o", "%t", env=env, check=False).strip() == "idle", 30, "an idle node")
    except TimeoutError:
        logs = "\n".join(
            (home / "log" / f).read_text()[-1500:]
            for f in ("slurmctld.log", "slurmd.log")
            if (home / "log" / f).exists()
        )
        _stop(home, env)
        pytest.skip(f"SLURM cannot be started here: the node never became idle.\n{logs}")
    yield env
    _stop(home, env)


def _stop(home: Path, env):
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
    for daemon in ("slurmd", "slurmctld"):
        pid_file = home / f"{daemon}.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), 15)
            except (ProcessLookupError, ValueError):
                pass


def _job_field(job: str, field: str, env) -> str:
    out = _sh("scontrol", "show", "job", job, env=env)
    return re.search(rf"\b{field}=(\S+)", out).group(1)


def test_sbatch_job_trains_is_signalled_requeued_and_finishes_where_it_stopped(slurm, tmp_path):
    env = {**slurm, "SOLO_NPROC_PER_NODE": "1", "SOLO_RUN_ROOT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    overrides = TINY + [
        "data.num_samples=128",
        "data.batch_size=8",
        "trainer.max_steps=120",
        "trainer.checkpoint_every_steps=5",
    ]
    # Two torchrun "nodes" on the one machine: srun starts one per task.
    job = _sh(
        "sbatch",
        "--parsable",
        "--ntasks=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        f"--chdir={REPO}",
        f"--output={tmp_path}/job-%j.out",
        "scripts/slurm/pretrain.sbatch",
        *overrides,
        env=env,
    ).strip()
    run_dir = tmp_path / f"slurm-{job}"
    _wait(lambda: (run_dir / "checkpoints" / "step-000000005").exists(), 240, "the first checkpoint")
    _sh("scancel", "--signal=USR1", job, env=env)  # what --signal=USR1@120 sends before the time limit
    requeued = lambda: _job_field(job, "Restarts", env) == "1" and _job_field(job, "JobState", env) == "PENDING"  # noqa: E731
    _wait(requeued, 120, "the job to be requeued")
    _sh("scontrol", "update", f"JobId={job}", "StartTime=now", env=env)  # skip SLURM's ~2 min requeue delay
    _wait(lambda: _job_field(job, "JobState", env) in ("COMPLETED", "FAILED", "CANCELLED"), 300, "the requeued job")
    out = (tmp_path / f"job-{job}.out").read_text()
    assert _job_field(job, "JobState", env) == "COMPLETED", out[-3000:]

    stopped = int(re.search(r"SIGUSR1: checkpoint written at step (\d+)", out).group(1))
    assert f"requeued SLURM job {job}" in out
    assert f"resuming from {run_dir / 'checkpoints' / 'last'} at step {stopped}" in out
    assert read_checkpoint(run_dir / "checkpoints" / "last")["step"] == 120
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, 121))
    assert any("val/acc1" in r for r in rows)


def test_srun_sbatch_one_task_per_process_without_torchrun(slurm, tmp_path):
    env = {**slurm, "SOLO_RUN_ROOT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    overrides = TINY + ["data.batch_size=8", "trainer.max_steps=6"]
    job = _sh(
        "sbatch",
        "--parsable",
        "--ntasks=2",
        "--cpus-per-task=1",
        f"--chdir={REPO}",
        f"--output={tmp_path}/job-%j.out",
        "scripts/slurm/pretrain_srun.sbatch",
        *overrides,
        env=env,
    ).strip()
    _wait(lambda: _job_field(job, "JobState", env) in ("COMPLETED", "FAILED", "CANCELLED"), 240, "the job")
    out = (tmp_path / f"job-{job}.out").read_text()
    assert _job_field(job, "JobState", env) == "COMPLETED", out[-3000:]
    assert "world size 2, global batch 16 (8 per process)" in out
    assert read_checkpoint(tmp_path / f"slurm-{job}" / "checkpoints" / "last")["step"] == 6
