"""RASA (method=rasa, backbone.remove_positions): the backbone a run leaves removes from its patch tokens, one stage
after the other, the planes of the stages' regressors as the official RASAHead does; read against a hand-written
copy of the official decomposition and the run's checkpoints on disk."""

import pytest
import torch
import torch.nn.functional as F

from solo.backbones import build_backbone
from solo.distributed.checkpoint import read_checkpoint
from solo.errors import ConfigError
from solo.losses import position_loss
from solo.methods.rasa import grid_positions, plane_projection
from solo.train.trainer import pretrain
from solo.zoo.pretrained import resolve
from solo.zoo.weights import save_weights
from tests.test_methods import method_overrides
from tests.test_train import compose_cfg

STAGES, STEPS = 3, 6  # two steps a stage: the planes of steps 2 and 4 fold in, the third is the regressor's at the end


def official_decompose(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RASAHead.decompose_pos_2D's part of x without positions, written as the official code does it."""
    bs, ps = x.shape[0], x.shape[1]
    pos_vr = weight[0] / torch.norm(weight[0])
    pos_vc = weight[1] / torch.norm(weight[1])
    pos_vc_orth = pos_vc - torch.dot(pos_vc, pos_vr) * pos_vr
    pos_vc_orth = pos_vc_orth / torch.norm(pos_vc_orth)
    x_proj_r = (x * pos_vr.repeat(bs, ps, 1)).sum(dim=-1).unsqueeze(-1) * pos_vr.repeat(bs, ps, 1)
    x_proj_c = (x * pos_vc_orth.repeat(bs, ps, 1)).sum(dim=-1).unsqueeze(-1) * pos_vc_orth.repeat(bs, ps, 1)
    return x - (x_proj_r + x_proj_c)


@pytest.fixture(scope="module")
def rasa_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rasa")
    overrides = method_overrides("rasa") + [
        f"method.stages={STAGES}",
        "data.batch_size=16",
        f"trainer.max_steps={STEPS}",
        "trainer.checkpoint_every_steps=1",
        "trainer.keep_checkpoints=10",
    ]
    pretrain(compose_cfg(overrides), run_dir)
    return run_dir


def test_a_plane_is_the_official_decomposition_and_a_zero_regressor_removes_nothing():
    torch.manual_seed(0)
    x, weight = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    assert torch.allclose(x @ plane_projection(weight), official_decompose(x, weight), rtol=0, atol=1e-13)
    assert torch.equal(plane_projection(torch.zeros(2, 8, dtype=torch.float64)), torch.eye(8, dtype=torch.float64))


def test_the_position_loss_is_the_mean_squared_error_to_the_grid_in_value_and_gradient():
    """The official F.mse_loss of the sigmoid's predictions against the rows and columns scaled to [0, 1]."""
    grid = grid_positions(3, 4)
    assert grid[:5].tolist() == [[0, 0], [0, 1 / 3], [0, 2 / 3], [0, 1], [0.5, 0]]
    logits = torch.randn(5, 12, 2, dtype=torch.float64, requires_grad=True)
    got = position_loss(torch.sigmoid(logits), grid)
    (grad,) = torch.autograd.grad(got, logits)
    want = F.mse_loss(torch.sigmoid(logits), grid.expand(5, -1, -1))
    (want_grad,) = torch.autograd.grad(want, logits)
    assert got.item() == pytest.approx(want.item(), rel=1e-14)
    assert torch.allclose(grad, want_grad, rtol=0, atol=1e-16)


def test_the_runs_backbone_removes_each_stages_plane_in_turn_as_the_official_head(rasa_run):
    """The stages' regressors from the checkpoints before each fold (steps 2 and 4) and at the end: the run's
    backbone's patch tokens are the official head's, stage by stage, on the tokens without removal; its class token
    is the norm's. The planes taken in the other order give other tokens (the check can fail)."""
    checkpoints = rasa_run / "checkpoints"
    regressors = [
        read_checkpoint(checkpoints / f"step-{step:09d}")["model"]["method.regressor.weight"] for step in (2, 4, STEPS)
    ]
    assert all(r.abs().sum() > 0 for r in regressors)
    saved = resolve(rasa_run)
    backbone = saved.build_backbone().double().eval()
    backbone.load_state_dict(saved.state)  # again in float64 (the run's precision): built in float32, it rounded them
    images = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        removed = backbone.forward_features(images)
        backbone.norm.removal.copy_(torch.eye(len(backbone.norm.removal)))
        kept = backbone.forward_features(images)
    official = kept[:, 1:]
    for weight in regressors:
        official = official_decompose(official, weight.double())
    assert torch.allclose(removed[:, 1:], official, rtol=0, atol=1e-12)
    assert torch.equal(removed[:, 0], kept[:, 0])
    backwards = kept[:, 1:]
    for weight in reversed(regressors):
        backwards = official_decompose(backwards, weight.double())
    assert (removed[:, 1:] - backwards).abs().max() > 1e-3


def test_the_backbone_travels_with_its_removal_and_other_backbones_are_refused(rasa_run, tmp_path):
    """A weights file of the run's backbone rebuilds it, removal included (as a zoo entry does); the Franca backbone it
    started from loads into a removing one as the identity; a ResNet cannot remove positions."""
    saved = save_weights(resolve(rasa_run), tmp_path / "rasa.safetensors")
    state = resolve(rasa_run).state
    in_file = resolve(saved).state["norm.removal"]
    assert torch.equal(in_file, state["norm.removal"])
    assert torch.equal(resolve(saved).build_backbone().norm.removal, in_file.float())  # built in float32
    assert not torch.equal(state["norm.removal"], torch.eye(len(state["norm.removal"])))
    with pytest.raises(ConfigError, match="remove_positions=true.*not one; unset it or pick a ViT"):
        build_backbone({"name": "resnet18", "remove_positions": True})


def test_rasa_starts_from_the_digits_franca_unless_told_and_elsewhere_needs_a_start():
    unset = [o for o in method_overrides("rasa") if not o.startswith("trainer.init_from")]
    with pytest.raises(ConfigError, match="^trainer.init_from is unset, and method=rasa post-trains a backbone") as e:
        compose_cfg(unset)
    assert len(str(e.value).splitlines()) == 1
    digits = compose_cfg(["method=rasa"])
    assert digits.trainer.init_from == "franca-digits-vittiny6" and digits.backbone.remove_positions
