"""Damaged checkpoints are found before they are read (file sizes against DCP's metadata and the sizes written at
save time), a resume falls back to the newest intact one (trainer.resume=auto) or stops (strict), and every rank
saves and restores its own random generators."""

import logging
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from solo.config import resume_policy, validate_linear
from solo.distributed.checkpoint import SIZES, Checkpoints, damage, find_checkpoints, read_checkpoint
from solo.errors import CheckpointError, ConfigError
from solo.losses.check import worker_context
from solo.train.state import Checkpointer, ModelState, OptimizerState, RNGState, own_cuda_state
from solo.zoo.pretrained import resolve
from tests.test_train import REPO, TINY, compose_cfg, launch, many_runs, weights

STEP_2, STEP_4 = "step-000000002", "step-000000004"


def _two_checkpoints(directory: Path) -> dict:
    """Steps 1 and 2 written by one process as training writes them; step 2's tensors."""
    checkpoints = Checkpoints(directory, keep=3)
    saved = {}
    for step in (1, 2):
        saved = {"model": {"w": torch.randn(5000), "b": torch.randn(7)}}
        checkpoints.save(step, saved, {"step": step})
        checkpoints.wait()
    return saved["model"]


def _distcp(checkpoint: Path) -> Path:
    (file,) = checkpoint.glob("*.distcp")
    return file


def test_an_intact_checkpoint_passes_and_a_cut_or_removed_file_is_named(tmp_path):
    """The check reads sizes only; what it finds is what reading the tensors would meet (DCP fails on the cut file)."""
    tensors = _two_checkpoints(tmp_path)
    step2 = tmp_path / "step-000000002"
    assert damage(step2) is None and damage(tmp_path / "last") is None
    assert find_checkpoints(tmp_path).intact == tmp_path / "last" and not find_checkpoints(tmp_path).damaged
    assert torch.equal(read_checkpoint(tmp_path / "last")["model"]["w"], tensors["w"])

    file = _distcp(step2)
    written = file.stat().st_size
    os.truncate(file, written // 2)
    assert damage(step2) == f"{file.name} holds {written // 2} bytes, {written} were written"
    with pytest.raises(CheckpointException):  # what a resume met before: DCP's error, from the middle of its read
        dcp.load({"model.w": torch.empty(5000), "model.b": torch.empty(7)}, checkpoint_id=step2, no_dist=True)
    found = find_checkpoints(tmp_path)
    assert found.intact == tmp_path / "step-000000001"
    assert found.damaged == ((tmp_path / "last", damage(step2)),)
    assert "last (step-000000002) is damaged" in found.describe_damage()
    with pytest.raises(
        CheckpointError, match=f"the newest intact checkpoint beside it is {tmp_path / 'step-000000001'}"
    ):
        read_checkpoint(step2)

    file.unlink()
    assert damage(step2) == f"{file.name} is missing"
    shutil.rmtree(step2)  # the newest removed whole: `last` links to nothing
    assert find_checkpoints(tmp_path).damaged == (
        (tmp_path / "last", "it links to step-000000002, which does not exist"),
    )
    assert find_checkpoints(tmp_path).intact == tmp_path / "step-000000001"


def test_the_sizes_written_at_save_time_find_what_the_metadata_cannot_and_older_checkpoints_still_load(tmp_path):
    """DCP's metadata names the tensors' files only: a cut trainer.pt, or bytes appended to a tensor file, are found
    through files.json. A checkpoint written before files.json existed is checked against the metadata alone, and
    loads."""
    _two_checkpoints(tmp_path)
    step2 = tmp_path / "step-000000002"
    small = step2 / "trainer.pt"
    size = small.stat().st_size
    os.truncate(small, size - 10)
    assert damage(step2) == f"trainer.pt holds {size - 10} bytes, {size} were written"
    (step2 / SIZES).unlink()  # as in a checkpoint of before
    assert damage(step2) is None  # the metadata alone cannot see it: what files.json adds

    file = _distcp(tmp_path / "step-000000001")
    written = file.stat().st_size
    with open(file, "ab") as f:
        f.write(b"\0" * 3)
    assert damage(tmp_path / "step-000000001") == f"{file.name} holds {written + 3} bytes, {written} were written"

    (tmp_path / "old").mkdir()
    old = _two_checkpoints(tmp_path / "old")
    (tmp_path / "old" / "step-000000002" / SIZES).unlink()
    assert damage(tmp_path / "old" / "step-000000002") is None
    assert torch.equal(read_checkpoint(tmp_path / "old" / "last")["model"]["b"], old["b"])
    os.truncate(_distcp(tmp_path / "old" / "step-000000002"), 100)
    assert "holds 100 bytes, its items need" in damage(tmp_path / "old" / "step-000000002")


def test_trainer_and_finetune_resume_take_a_policy_or_the_booleans_of_before():
    values = ("auto", "strict", "never", True, False)
    assert [resume_policy(v) for v in values] == ["auto", "strict", "never", "auto", "never"]
    from_the_command_line = compose_cfg(TINY + ["trainer.resume=false"]).trainer.resume  # Hydra gives a bool
    assert resume_policy(from_the_command_line) == "never"
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        linear = validate_linear(compose("linear", overrides=["pretrained=x", "finetune.resume=true"]))
    assert resume_policy(linear.finetune.resume) == "auto"
    with pytest.raises(ConfigError, match=r"trainer.resume=sometimes: must be auto, strict or never"):
        compose_cfg(TINY + ["trainer.resume=sometimes"])


def test_a_process_that_sees_fewer_devices_takes_its_own_device_state_from_a_checkpoint_of_before():
    """Before, a checkpoint held every visible device's CUDA state and restored them all (set_rng_state_all, which
    fails where fewer devices are visible); the process takes its own device's entry, if the saver had one."""
    states = [torch.full((16,), 1, dtype=torch.uint8), torch.full((16,), 2, dtype=torch.uint8)]  # 2 devices saved
    assert own_cuda_state(states, torch.device("cuda", 0)) is states[0]  # a process that sees 1 device
    assert own_cuda_state(states, torch.device("cuda", 1)) is states[1]
    assert own_cuda_state(states, torch.device("cuda", 2)) is None  # its device was not saved: left as seeded
    assert own_cuda_state(states, torch.device("cpu")) is None


def _draws() -> tuple:
    return torch.rand(4).tolist(), random.random()


def test_a_checkpoint_of_before_restores_rank_0s_generators_on_this_process(tmp_path):
    """Written as solo wrote them before: the tensors through DCP, rank 0's generators (2 GPUs' states) in trainer.pt."""
    torch.manual_seed(3)
    random.seed(4)
    cuda = [torch.zeros(16, dtype=torch.uint8)] * 2
    old = {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate()}
    expected = _draws()
    sharded = _model()
    checkpoints = Checkpoints(tmp_path, keep=1)
    checkpoints.save(5, {name: c.state_dict() for name, c in sharded.items()}, {"step": 5, "rng": old})
    checkpoints.wait()
    checkpointer = Checkpointer(checkpoints, sharded, RNGState(torch.device("cpu"), rank=1, seed=0), {}, {})
    assert checkpointer.restore(tmp_path / "last", checkpointer.load(tmp_path / "last")) == 5
    assert _draws() == expected


def _model():
    model = nn.Linear(3, 2)
    return {"model": ModelState(model), "optimizer": OptimizerState(model, torch.optim.SGD(model.parameters(), lr=0.1))}


def _generators_worker(rank, world, store, directory, queue):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    checkpoints = Checkpoints(directory, keep=2, is_main=rank == 0)
    checkpointer = Checkpointer(checkpoints, _model(), RNGState(torch.device("cpu"), rank, seed=7), {}, {})
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    checkpointer.save(3)
    checkpoints.wait()
    dist.barrier()  # rank 0 has published it
    expected = _draws()
    torch.manual_seed(0)
    random.seed(0)
    path = Path(directory) / "last"
    checkpointer.restore(path, checkpointer.load(path))
    queue.put((rank, expected, _draws()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # 2 gloo processes: about 7 s
def test_every_rank_restores_its_own_generators_and_a_rank_without_any_seeds_them(tmp_path):
    """2 gloo ranks, each with its own generators, save a checkpoint and restore it: each draws what it would have
    drawn. Read again by one process, as rank 0 it gets rank 0's; as rank 2 or 3 (a larger world) it has none saved
    and seeds them from (seed, rank, step): the same draws each time, another stream per rank."""
    queue = worker_context().SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _generators_worker, args=(2, f"{tmp}/store", str(tmp_path), queue), nprocs=2, start_method="forkserver"
        )
    results = {rank: (expected, got) for rank, expected, got in (queue.get() for _ in range(2))}
    for expected, got in results.values():
        assert got == expected
    assert results[0][0] != results[1][0]

    def restored_as(rank):
        checkpointer = Checkpointer(
            Checkpoints(tmp_path, keep=2), _model(), RNGState(torch.device("cpu"), rank, 7), {}, {}
        )
        checkpointer.restore(tmp_path / "last", checkpointer.load(tmp_path / "last"))
        return _draws()

    assert restored_as(0) == results[0][0]
    assert restored_as(2) == restored_as(2) != restored_as(3)
    assert restored_as(2) not in (results[0][0], results[1][0])


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to, symlinks=True)
    return to / "checkpoints"


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one_as_if_resumed_there_or_stops_under_strict(
    tmp_path, caplog
):
    """A 2-process run checkpoints steps 2 and 4. Its step 4 cut short (a .distcp file), or without one of its files
    (rank 1's), the same run made longer resumes from step 2 with one warning line and ends bit-identical to the run
    resumed from step 2 directly (step 4 deleted, `last` at step 2). pretrained= of the run reads step 2 too, and
    under trainer.resume=strict the run stops with one error line, exit status 2, no traceback."""
    common = TINY + ["data.batch_size=8", "trainer.checkpoint_every_steps=2", "trainer.keep_checkpoints=3"]
    base = tmp_path / "base"
    many_runs({base: common + ["trainer.max_steps=4"]})
    assert sorted(p.name for p in (base / "checkpoints").glob("step-*")) == [STEP_2, STEP_4]

    direct = _copy(base, tmp_path / "direct")
    shutil.rmtree(direct / STEP_4)
    (direct / "last").unlink()
    (direct / "last").symlink_to(STEP_2)
    cut = _copy(base, tmp_path / "cut")
    file = cut / STEP_4 / "__0_0.distcp"
    os.truncate(file, file.stat().st_size // 2)
    removed = _copy(base, tmp_path / "removed")
    (removed / STEP_4 / "__1_0.distcp").unlink()  # rank 1's generators
    strict = _copy(tmp_path / "cut", tmp_path / "strict")

    with pytest.raises(CheckpointError, match=f"the newest intact checkpoint beside it is {cut / STEP_2}"):
        resolve(cut / STEP_4)  # a checkpoint named on its own must be intact
    with caplog.at_level(logging.WARNING, logger="solo"):
        assert resolve(tmp_path / "cut").source == str(cut / STEP_2)  # a run directory: its newest intact one
    assert [r.message for r in caplog.records] == [
        f"warning: checkpoint {cut / 'last'} ({STEP_4}) is damaged: {damage(cut / STEP_4)}; pretrained="
        f"{tmp_path / 'cut'} reads {cut / STEP_2}, the newest intact one"
    ]

    longer = common + ["trainer.max_steps=6"]
    out = many_runs({tmp_path / "direct": longer, tmp_path / "cut": longer, tmp_path / "removed": longer})
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, out.stderr[-3000:]
    for line, (checkpoints, why) in zip(warnings, [(cut, "__0_0.distcp holds"), (removed, "__1_0.distcp is missing")]):
        assert f"checkpoint {checkpoints / 'last'} ({STEP_4}) is damaged: {why}" in line
        assert f"resuming from {checkpoints / STEP_2}, the newest intact checkpoint" in line
    at_step_2, resumed = read_checkpoint(base / "checkpoints" / STEP_2)["model"], weights(tmp_path / "direct")
    for run_dir in ("cut", "removed"):
        other = weights(tmp_path / run_dir)
        assert other.keys() == resumed.keys() and all(torch.equal(other[k], resumed[k]) for k in resumed), run_dir
    assert any(not torch.equal(at_step_2[k], resumed[k]) for k in resumed)  # it trained after step 2

    proc = launch(
        longer + ["trainer.resume=strict"],
        tmp_path / "strict",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=300)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in stderr + stdout, stderr
    assert f"checkpoint {strict / 'last'} ({STEP_4}) is damaged" in errors[0]
    assert f"the newest intact checkpoint is {strict / STEP_2}" in errors[0]
