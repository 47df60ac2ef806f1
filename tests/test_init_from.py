"""trainer.init_from: a run that starts from another run's weights (DINOv3.1's post-training of a DINOv2 model), with
its own optimizer and schedule; read against the other run's checkpoint on disk."""

from pathlib import Path

import pytest
import torch

from solo.distributed.checkpoint import read_checkpoint
from solo.distributed.env import process_group
from solo.errors import ConfigError
from solo.train.trainer import Trainer, pretrain
from solo.zoo.pretrained import resolve
from solo.zoo.weights import save_weights
from tests.test_train import TINY, compose_cfg, run, weights

# BYOL: a backbone, a projector, a predictor and an EMA teacher, which two steps move away from the backbone.
BYOL = TINY + ["method=byol", "method.pred_hidden_dim=32", "data.batch_size=16"]


@pytest.fixture(scope="module")
def byol_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("byol")
    pretrain(compose_cfg(BYOL + ["trainer.max_steps=2"]), run_dir)
    return run_dir


def built(overrides: list[str], run_dir: Path) -> Trainer:
    with process_group() as (env, device):
        return Trainer(compose_cfg(overrides), run_dir, env, device)


def test_a_run_starts_from_another_runs_whole_model(byol_run, tmp_path):
    """The new run's method holds every tensor of the other run's last checkpoint (its EMA teacher as it was, not a
    copy of the backbone), at step 0 with an empty optimizer; its first step moves them. A resume from its own
    checkpoints does not read trainer.init_from (here a path that no longer exists)."""
    saved = {
        k.removeprefix("method."): v for k, v in read_checkpoint(byol_run / "checkpoints" / "last")["model"].items()
    }
    trainer = built(BYOL + [f"trainer.init_from={byol_run}", "trainer.max_steps=1"], tmp_path)
    state = trainer.model.method.state_dict()
    assert set(state) == {k for k in saved if not k.startswith("probe.")}
    for name, value in state.items():
        assert torch.equal(value, saved[name]), name
    teacher, backbone = state["teacher.0.conv1.0.weight"], state["backbone.conv1.0.weight"]
    assert not torch.equal(teacher, backbone)  # two steps of EMA: a copy of the backbone would equal it
    assert trainer.step == 0 and not trainer.train_step.optimizer.state

    trainer.fit()
    moved = read_checkpoint(tmp_path / "checkpoints" / "last")["model"]
    assert not torch.equal(moved["method.backbone.conv1.0.weight"], saved["backbone.conv1.0.weight"])
    resumed = built(BYOL + ["trainer.init_from=/nowhere/gone", "trainer.max_steps=2"], tmp_path)
    assert resumed.model is not None


def test_a_backbones_weights_start_the_backbone_and_the_teacher(byol_run, tmp_path):
    """A solo weights file of a backbone (here the BYOL run's, as a zoo entry holds one): the backbone and the EMA
    teacher that the method copies from it both start from it; the projector starts afresh."""
    weights = save_weights(resolve(byol_run), tmp_path / "backbone.safetensors")
    trainer = built(BYOL + [f"trainer.init_from={weights}"], tmp_path / "run")
    method, loaded = trainer.model.method, resolve(weights).state
    for name, value in loaded.items():
        assert torch.equal(method.backbone.state_dict()[name], value), name
        assert torch.equal(method.teacher[0].state_dict()[name], value), name


def test_another_methods_run_starts_the_backbone_alone(byol_run, tmp_path):
    """SimSiam from the BYOL run: its backbone is the BYOL run's, its projector and predictor start afresh."""
    saved = read_checkpoint(byol_run / "checkpoints" / "last")["model"]
    trainer = built(BYOL + ["method=simsiam", f"trainer.init_from={byol_run}"], tmp_path)
    method = trainer.model.method
    for name, value in method.backbone.state_dict().items():
        assert torch.equal(value, saved[f"method.backbone.{name}"]), name
    fresh = built(BYOL + ["method=simsiam"], tmp_path / "fresh").model.method
    assert torch.equal(method.projector[0].weight, fresh.projector[0].weight)  # the seed's, not the BYOL run's


@pytest.mark.parametrize(
    "other, source, message",
    [
        (
            [],
            "/nowhere/at/all",
            r"^trainer.init_from=/nowhere/at/all: no such pretraining run directory, .* or zoo name",
        ),
        (
            ["method.pred_hidden_dim=16"],
            None,
            r"^cannot load the byol model of trainer.init_from=.*wrong shape.*same method and backbone settings",
        ),
        (
            ["method=simsiam", "backbone.name=resnet18"],
            None,
            r"^cannot load the backbone of trainer.init_from=.*key\(s\).*with this backbone's settings",
        ),
    ],
)
def test_a_start_it_cannot_load_is_one_line_naming_the_key(byol_run, tmp_path, other, source, message):
    with pytest.raises(ConfigError, match=message) as e:
        built(BYOL + other + [f"trainer.init_from={source or byol_run}"], tmp_path)
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.slow
def test_a_start_read_by_two_fsdp_processes_steps_as_one_process(byol_run, tmp_path):
    """One process's run started from the BYOL run (float64), and two processes under FSDP started from it, with 8
    samples each, both saying what they loaded: after a step their weights agree to 1e-10 of how far the step moved
    them."""
    start = BYOL + [f"trainer.init_from={byol_run}", "trainer.max_steps=1", "trainer.precision=64"]
    for out in (
        run(start, tmp_path / "one"),
        run(start + ["data.batch_size=8", "trainer.strategy=fsdp"], tmp_path / "two", nproc=2),
    ):
        assert f"init_from: the byol model of {byol_run}" in out
    before = {k: v for k, v in read_checkpoint(byol_run / "checkpoints" / "last")["model"].items()}
    one, two = weights(tmp_path / "one"), weights(tmp_path / "two")
    moved = max((one[k] - before[k].double()).abs().max().item() for k in one if k.startswith("method."))
    assert moved > 0
    for name in one:
        assert (one[name] - two[name]).abs().max().item() <= 1e-10 * moved, name
