"""The method lifecycle and views with sizes: a method added from a file of its own, with an EMA teacher,
trained on 2 processes and resumed bit-exact; multi-crop views of two sizes, reproducible on any world size."""

import subprocess
import time

import pytest
import torch
from hydra import compose, initialize_config_dir

from solo.config import register_configs, validate_pretrain
from solo.data import sample_seed, seeded_rng
from solo.data.views.batch_spec import BatchSpec
from solo.data.views.transforms import build_view_transform
from solo.distributed import DistEnv
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.train.loaders import build_loaders, build_splits
from tests.test_train import REPO, TINY, kill_processes_mentioning, launch, metrics, run
from tests.toy_ema_method import teacher_momentum

register_configs()

TOY = [o for o in TINY if not o.startswith("method.")] + [
    "method=toy_ema",
    "imports=[tests.toy_ema_method]",
    f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
    "trainer.precision=64",
    "data.num_samples=96",
    "data.batch_size=8",
    "trainer.max_steps=10",
    "trainer.checkpoint_every_steps=1",
    "trainer.keep_checkpoints=20",
]


def checkpoint(run_dir, step=None) -> dict:
    name = "last" if step is None else f"step-{step:09d}"
    return read_checkpoint(run_dir / "checkpoints" / name)


@pytest.mark.slow
def test_a_method_from_its_own_file_trains_with_its_teacher_and_resumes_exactly(tmp_path):
    run(TOY, tmp_path / "straight", nproc=2)
    model = checkpoint(tmp_path / "straight")["model"]
    teacher = sorted(
        k for k in model if k.startswith("method.teacher.") and "running" not in k and "num_batches" not in k
    )
    assert teacher, "the teacher is part of the checkpoint"
    # After step 6 the teacher has moved towards the student by exactly the scheduled momentum (0.965).
    previous, now = checkpoint(tmp_path / "straight", 5)["model"], checkpoint(tmp_path / "straight", 6)["model"]
    m = teacher_momentum(0.9, 6, 10)
    for key in teacher:
        student = now[key.replace("method.teacher.0.", "method.backbone.").replace("method.teacher.1.", "method.head.")]
        assert not torch.equal(now[key], student) and not torch.equal(now[key], previous[key]), key
        torch.testing.assert_close(now[key], m * previous[key] + (1 - m) * student, rtol=1e-12, atol=1e-14, msg=key)
    logged = [r for r in metrics(tmp_path / "straight") if "train/teacher_sync_bn" in r]
    assert logged and all(r["train/teacher_sync_bn"] == 0 and r["train/student_sync_bn"] > 0 for r in logged)

    killed = tmp_path / "killed"
    proc = launch(TOY, killed, nproc=2, torchrun=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-000000004").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    kill_processes_mentioning(str(killed))
    proc.wait()
    assert 0 < checkpoint(killed)["step"] < 10, "the kill must land mid-run"
    out = run(TOY, killed, nproc=2)
    assert "resuming from" in out
    resumed = checkpoint(killed)["model"]
    for key in model:
        assert torch.equal(model[key], resumed[key]), key


def compose_cfg(overrides, validate=True):
    with initialize_config_dir(config_dir=str(REPO / "solo" / "configs"), version_base="1.3"):
        cfg = compose("pretrain", overrides=overrides)
    return validate_pretrain(cfg) if validate else cfg


def test_multicrop_views_have_their_sizes_and_are_the_same_on_any_world_size():
    # The data pipeline alone, from the composed config (dino and swav train on these views: tests/test_methods.py).
    cfg = compose_cfg(["augmentation=multicrop_digits"], validate=False)

    def batch(rank: int, world: int) -> dict:
        env = DistEnv(rank, rank, world, "127.0.0.1", 0, "test")
        d = cfg.data.copy()
        d.batch_size = 8 // world
        splits = build_splits(d, env, seed=0, pairs=False)
        loaders = build_loaders(
            splits, d, cfg.augmentation.views, env, seed=0, spec=BatchSpec(), knn=False, device=torch.device("cpu")
        )
        loaders.train.load_state_dict({"epoch": 1, "batch_in_epoch": 3})
        return next(iter(loaders.train)), splits.train

    one, base = batch(0, 1)
    two = [batch(r, 2)[0] for r in (0, 1)]
    assert [tuple(v.shape[-2:]) for v in one["views"]] == [(16, 16)] * 2 + [(8, 8)] * 4
    for v in range(6):
        assert torch.equal(one["views"][v], torch.cat([two[0]["views"][v], two[1]["views"][v]]))
    # Each view is its own seeded draw: recomputed alone from (seed, epoch, index, view), it is the same.
    index = int(one["index"][5])
    recipe = cfg.augmentation.views[1]
    transform = build_view_transform(recipe, 8, (0.3054,) * 3, (0.3187,) * 3)
    with seeded_rng(sample_seed(0, 1, index, 4)):
        alone = transform(base[index][0])
    torch.testing.assert_close(one["views"][4][5], alone)
    assert not torch.equal(one["views"][4][5], one["views"][5][5])


def test_a_method_refuses_views_it_cannot_use():
    with pytest.raises(ConfigError, match=r"simclr compares 2 view\(s\) of one size.*\[16, 16, 8, 8, 8, 8\]"):
        compose_cfg(["augmentation=multicrop_digits"])


def test_a_dataset_from_its_own_file_trains(tmp_path):
    from solo.train.trainer import pretrain

    overrides = [o for o in TINY if not o.startswith("data.num_samples")]
    cfg = compose_cfg(
        overrides
        + ["data.name=toy_stripes", "imports=[tests.toy_dataset]", "data.batch_size=16", "trainer.max_steps=3"]
    )
    final = pretrain(cfg, tmp_path)
    assert final["val/acc1"] >= 0.0 and len(metrics(tmp_path)) == 4  # 3 training steps and one validation
    with pytest.raises(
        ConfigError, match="unknown dataset data.name='no_such_data'; available: cifar10, .*toy_stripes"
    ):
        compose_cfg(overrides + ["data.name=no_such_data"])
